// A dataset of class-labelled images (or latents) C×H×W, addressed by index.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace difftrain {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int channels() const = 0;
  virtual int height() const = 0;
  virtual int width() const = 0;
  virtual int num_classes() const = 0;
  // Writes sample `index` (0 ≤ index < size()) as C·H·W floats and its label.
  virtual Status Get(int64_t index, float* image, int32_t* label) const = 0;
};

// N(0, 1) values and uniform labels, a pure function of (seed, index): the seeds' benchmark
// input. Unbounded: size() is the largest index.
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(uint64_t seed, int channels, int size, int num_classes)
      : seed_(seed), channels_(channels), size_(size), num_classes_(num_classes) {}
  int64_t size() const override { return INT64_MAX; }
  int channels() const override { return channels_; }
  int height() const override { return size_; }
  int width() const override { return size_; }
  int num_classes() const override { return num_classes_; }
  Status Get(int64_t index, float* image, int32_t* label) const override;

 private:
  uint64_t seed_;
  int channels_, size_, num_classes_;
};

}  // namespace difftrain
