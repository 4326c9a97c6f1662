// Fashion-MNIST (Zalando, 10 classes of 28×28 grey clothing images) read from the gzip'ed
// IDX files that Debian's dataset-fashion-mnist installs:
//   <dir>/train-images-idx3-ubyte.gz  <dir>/train-labels-idx1-ubyte.gz   60000 samples
//   <dir>/t10k-images-idx3-ubyte.gz   <dir>/t10k-labels-idx1-ubyte.gz    10000 samples
//
// Samples are 1×32×32 floats: pixel bytes x become x/127.5 − 1 in [−1, 1], and the 28×28
// image sits in the middle of a border of 2 pixels of −1 on each side (a size the DiT
// patch sizes 2, 4 and 8 divide). Everything is read into memory once, as bytes (47 MB
// for the training split); Get converts one sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/data/dataset.h"

namespace difftrain {

inline constexpr std::string_view kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// The images of an IDX3 file of unsigned bytes (magic 0x00000803): count × rows × cols,
// row-major. The file may be gzip'ed or plain.
struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;
};
Result<IdxImages> ReadIdxImages(const std::string& path);
// The labels of an IDX1 file of unsigned bytes (magic 0x00000801).
Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path);

class FashionMnistDataset : public Dataset {
 public:
  static constexpr int kRawSize = 28;
  static constexpr int kPadding = 2;
  static constexpr int kSize = kRawSize + 2 * kPadding;
  static constexpr int kNumClasses = 10;

  // `split` is "train" or "test" (the t10k files). Errors name the file and what is wrong:
  // missing, not IDX (magic), truncated, images and labels disagreeing in count, a label
  // of 10 or more, images that are not 28×28.
  static Result<std::unique_ptr<FashionMnistDataset>> Load(const std::string& dir,
                                                           const std::string& split);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int channels() const override { return 1; }
  int height() const override { return kSize; }
  int width() const override { return kSize; }
  int num_classes() const override { return kNumClasses; }
  Status Get(int64_t index, float* image, int32_t* label) const override;

 private:
  FashionMnistDataset(std::vector<uint8_t> pixels, std::vector<uint8_t> labels)
      : pixels_(std::move(pixels)), labels_(std::move(labels)) {}

  std::vector<uint8_t> pixels_;  // [N, 28, 28]
  std::vector<uint8_t> labels_;  // [N]
};

}  // namespace difftrain
