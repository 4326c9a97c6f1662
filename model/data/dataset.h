// A dataset of class-labelled images (or latents) C×H×W, or videos of F such frames, each
// optionally with a text embedding, addressed by index, and the ones difftrain knows by name
// (docs/data.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/data/text_table.h"

namespace difftrain {

// The size() of a dataset that has a sample at every index (SyntheticDataset): the loader
// never shuffles it and a writer refuses it unless it is cut with PrefixDataset.
inline constexpr int64_t kUnboundedSize = INT64_MAX;

// Where a picture sample came from, in pixels: the original picture's height and width, the
// top-left corner of the crop taken from it once resized to the sample's scale, and the
// sample's own height and width; diffusers' original_size, crops_coords_top_left and
// target_size, which SDXL's UNet is conditioned on (its time ids).
struct PictureGeometry {
  int32_t original_height = 0, original_width = 0;
  int32_t crop_top = 0, crop_left = 0;
  int32_t height = 0, width = 0;
  bool operator==(const PictureGeometry&) const = default;
};

// A sample's size, height × width (of each frame of a video).
struct SampleSize {
  int height = 0, width = 0;
  bool operator==(const SampleSize&) const = default;
  int64_t area() const { return int64_t{height} * width; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int channels() const = 0;
  virtual int height() const = 0;
  virtual int width() const = 0;
  virtual int num_classes() const = 0;  // 0: unlabelled (every label 0)
  // Frames of a video sample [F, C, H, W]; 1 for an image.
  virtual int frames() const { return 1; }
  // Writes sample `index` (0 ≤ index < size()) as F·C·H·W floats and its label. Must be safe
  // to call from several threads at once: the loader's prefetch thread calls it while the
  // training thread may fill another range.
  virtual Status Get(int64_t index, float* image, int32_t* label) const = 0;
  // Text-conditional data (image–caption pairs): sample `index`'s text embedding is row
  // TextId(index) of texts(). nullptr: the samples carry no text.
  virtual const TextTable* texts() const { return nullptr; }
  virtual int64_t TextId(int64_t /*index*/) const { return 0; }
  // Whether the samples know their PictureGeometry (pictures of an image folder, and a latent
  // folder packed from one), and sample `index`'s.
  virtual bool has_geometry() const { return false; }
  virtual Status GetGeometry(int64_t index, PictureGeometry* geometry) const;
  // Aspect-ratio buckets (SDXL's training; docs/data.md): the sizes a dataset's samples come in,
  // each sample in one, BucketOf(index) an index into buckets(). A dataset of one size has one
  // bucket, height() × width(); a bucketed one's height() and width() are its nominal size (the
  // square whose area the buckets keep near), not any sample's.
  virtual std::vector<SampleSize> buckets() const { return {{height(), width()}}; }
  virtual int BucketOf(int64_t /*index*/) const { return 0; }
  // Whether each sample has a mirror image of its own (GetMirrored): a VAE's latents of the
  // picture flipped left-right, which are not its latents flipped (`data pack --mirror`, and a
  // latent folder packed so). Without one a sample's mirror image is the sample flipped, as a
  // picture's is.
  virtual bool has_mirrored() const { return false; }
  // Sample `index`'s mirror image and its label, as Get writes the sample; an error where
  // !has_mirrored().
  virtual Status GetMirrored(int64_t index, float* image, int32_t* label) const;

  bool unbounded() const { return size() == kUnboundedSize; }
  bool bucketed() const { return buckets().size() > 1; }
  // Floats of one sample of the nominal size, and of sample `index` (its bucket's).
  int64_t sample_floats() const { return int64_t{frames()} * channels() * height() * width(); }
  int64_t SampleFloats(int64_t index) const;
};

// Flips `rows` rows of `width` values each left-right in place: a sample's mirror image, each
// frame's channels a block of rows (what data.horizontal_flip and `data pack --mirror` flip).
void MirrorRows(float* values, int64_t rows, int width);

// N(0, 1) values and uniform labels, a pure function of (seed, index): the seeds' benchmark
// input, images or videos of `frames` frames. Unbounded: size() is the largest index.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(uint64_t seed, int channels, int size, int num_classes, int frames = 1)
      : seed_(seed), channels_(channels), size_(size), num_classes_(num_classes), frames_(frames) {}
  int64_t size() const override { return kUnboundedSize; }
  int channels() const override { return channels_; }
  int height() const override { return size_; }
  int width() const override { return size_; }
  int num_classes() const override { return num_classes_; }
  int frames() const override { return frames_; }
  Status Get(int64_t index, float* image, int32_t* label) const override;

 private:
  uint64_t seed_;
  int channels_, size_, num_classes_, frames_;
};

// Some of another dataset's samples, by index: sample i is the source's indices[i]. The
// source must outlive the view unless the view owns it (TakeSubset).
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(const Dataset& source, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  int channels() const override { return source_.channels(); }
  int height() const override { return source_.height(); }
  int width() const override { return source_.width(); }
  int num_classes() const override { return source_.num_classes(); }
  int frames() const override { return source_.frames(); }
  Status Get(int64_t index, float* image, int32_t* label) const override {
    return source_.Get(indices_[index], image, label);
  }
  const TextTable* texts() const override { return source_.texts(); }
  int64_t TextId(int64_t index) const override { return source_.TextId(indices_[index]); }
  bool has_geometry() const override { return source_.has_geometry(); }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override {
    return source_.GetGeometry(indices_[index], geometry);
  }
  std::vector<SampleSize> buckets() const override { return source_.buckets(); }
  int BucketOf(int64_t index) const override { return source_.BucketOf(indices_[index]); }
  bool has_mirrored() const override { return source_.has_mirrored(); }
  Status GetMirrored(int64_t index, float* image, int32_t* label) const override {
    return source_.GetMirrored(indices_[index], image, label);
  }
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  friend std::unique_ptr<Dataset> TakeSubset(std::unique_ptr<Dataset>, int64_t, uint64_t);
  std::unique_ptr<Dataset> owned_;  // the source, where the view owns it
  const Dataset& source_;
  std::vector<int64_t> indices_;
};

// The first `count` samples of another dataset (which must outlive this view): how an
// unbounded dataset is given a size, e.g. to pack a few synthetic samples.
class PrefixDataset : public SubsetDataset {
 public:
  PrefixDataset(const Dataset& source, int64_t count);
};

// `count` of `source`'s samples drawn at random from `seed`, in the source's order, owning it
// (data.max_samples: diffusers' --max_train_samples takes a seeded random subset too); an
// unbounded source gives its first `count`, and `count` ≥ its size the source itself.
std::unique_ptr<Dataset> TakeSubset(std::unique_ptr<Dataset> source, int64_t count, uint64_t seed);

// A dataset chosen by name, as a command line or job spec names it.
struct DatasetSpec {
  // "synthetic", "fashion_mnist", "moving_fashion_mnist", "latent_folder" or "image_folder"
  // (PNG and JPEG files, model/data/image_folder.h: `data pack` reads it, jobs do not)
  std::string kind = "synthetic";
  // (moving_)fashion_mnist: the directory of the IDX files ("" = Debian's); latent_folder and
  // image_folder: required.
  std::string path;
  std::string split = "train";  // fashion_mnist: "train" or "test"
  // synthetic; moving_fashion_mnist takes the frames and the image (canvas) size;
  // image_folder the image size and channels (1 or 3); the other kinds take their shape from
  // their files.
  uint64_t seed = 0;
  int channels = 4;
  int image_size = 32;
  int num_classes = 1000;
  int frames = 1;  // videos: frames per sample
  // image_folder: how an image becomes image_size × image_size, "dit" (DiT's center_crop_arr)
  // or "square" (the centred square, then BOX): model/data/image_folder.h.
  std::string crop = "dit";
  // image_folder with crop "buckets": the buckets' sizes in pixels; empty: AspectRatioBuckets
  // of image_size (model/data/image_folder.h).
  std::vector<SampleSize> buckets;
};

Result<std::unique_ptr<Dataset>> OpenDataset(const DatasetSpec& spec);

}  // namespace difftrain
