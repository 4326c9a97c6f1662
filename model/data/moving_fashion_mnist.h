// Moving Fashion-MNIST: a learnable video task made from the real Fashion-MNIST garments,
// for training and judging video models (Latte) on a CPU (docs/data.md).
//
// Video i shows garment i of the split (Fashion-MNIST image i, 28×28, scaled down by an
// integer factor by averaging, 14×14 by default) on a black canvas (−1) of size×size, for
// `frames` frames. It starts at a random place and moves at a constant random velocity
// (speed 1 to 2.5 pixels a frame, any direction), bouncing off the canvas borders: its
// top-left corner at frame f is the straight path p0 + v·f folded into [0, size − g] by
// reflection, rounded to whole pixels. Pixels are x/127.5 − 1 as Fashion-MNIST's. The label
// is the garment's class. Everything is a pure function of (split, i): a fixed dataset.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "model/data/fashion_mnist.h"

namespace difftrain {

// Where a video's garment is: its top-left corner per frame (before rounding).
struct GarmentPath {
  double x0 = 0, y0 = 0, vx = 0, vy = 0;  // start and velocity, pixels (per frame)
  int travel = 0;                         // size − garment: the corner's range [0, travel]
  // The corner at frame f, folded into [0, travel].
  std::array<double, 2> At(int f) const;
};

// The fold of a straight coordinate into [0, travel] by reflection off both ends.
double Bounce(double p, int travel);

class MovingFashionMnistDataset : public Dataset {
 public:
  // `size`: canvas side; `garment`: the garment's side, 28 divided by an integer (28, 14, 7
  // or 4) and at most `size`.
  static Result<std::unique_ptr<MovingFashionMnistDataset>> Create(
      std::unique_ptr<FashionMnistDataset> garments, int frames, int size, int garment = 14);

  int64_t size() const override { return garments_->size(); }
  int channels() const override { return 1; }
  int height() const override { return size_; }
  int width() const override { return size_; }
  int num_classes() const override { return garments_->num_classes(); }
  int frames() const override { return frames_; }
  Status Get(int64_t index, float* video, int32_t* label) const override;

  // Video i's path, and its garment as garment×garment floats.
  GarmentPath PathOf(int64_t index) const;
  Status Garment(int64_t index, float* out, int32_t* label) const;
  int garment_size() const { return garment_; }

 private:
  MovingFashionMnistDataset(std::unique_ptr<FashionMnistDataset> garments, int frames, int size,
                            int garment)
      : garments_(std::move(garments)), frames_(frames), size_(size), garment_(garment) {}

  std::unique_ptr<FashionMnistDataset> garments_;
  int frames_, size_, garment_;
};

}  // namespace difftrain
