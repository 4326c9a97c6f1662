// Test support: a dataset of samples in several sizes (aspect-ratio buckets), whose values say
// which sample they are.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/data/dataset.h"

namespace difftrain::testing {

// `size` samples of `channels` × a bucket's height × width, nominal size `nominal` square.
// Sample i is in bucket bucket_of[i % bucket_of.size()]; its value k is
// sin(0.37·i + 0.011·k) (a latent's scale, distinct for every sample and position), its label
// i mod 3 (no classes: 0). Each sample knows its picture geometry: 8× its latent size, uncropped.
class BucketedTestDataset : public Dataset {
 public:
  BucketedTestDataset(int64_t size, int channels, int nominal, std::vector<SampleSize> buckets,
                      std::vector<int> bucket_of, int num_classes = 0)
      : size_(size),
        channels_(channels),
        nominal_(nominal),
        num_classes_(num_classes),
        buckets_(std::move(buckets)),
        bucket_of_(std::move(bucket_of)) {}

  int64_t size() const override { return size_; }
  int channels() const override { return channels_; }
  int height() const override { return nominal_; }
  int width() const override { return nominal_; }
  int num_classes() const override { return num_classes_; }
  std::vector<SampleSize> buckets() const override { return buckets_; }
  int BucketOf(int64_t index) const override {
    return bucket_of_[static_cast<size_t>(index) % bucket_of_.size()];
  }
  Status Get(int64_t index, float* image, int32_t* label) const override {
    for (int64_t k = 0; k < SampleFloats(index); ++k)
      image[k] = static_cast<float>(std::sin(0.37 * double(index) + 0.011 * double(k)));
    *label = num_classes_ > 0 ? static_cast<int32_t>(index % num_classes_) : 0;
    return Status::Ok();
  }
  bool has_geometry() const override { return true; }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override {
    const SampleSize s = buckets_[BucketOf(index)];
    *geometry = {8 * s.height, 8 * s.width, 0, 0, 8 * s.height, 8 * s.width};
    return Status::Ok();
  }

 private:
  int64_t size_;
  int channels_, nominal_, num_classes_;
  std::vector<SampleSize> buckets_;
  std::vector<int> bucket_of_;
};

}  // namespace difftrain::testing
