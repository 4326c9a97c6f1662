#include "model/data/dataset.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/check.h"
#include "model/data/fashion_mnist.h"
#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/data/moving_fashion_mnist.h"
#include "model/tensor/rng.h"

namespace difftrain {

Status Dataset::GetGeometry(int64_t /*index*/, PictureGeometry* /*geometry*/) const {
  return Status::Error("the dataset's samples do not know the pictures they came from");
}

Status Dataset::GetMirrored(int64_t /*index*/, float* /*image*/, int32_t* /*label*/) const {
  return Status::Error("the dataset's samples have no mirror images of their own");
}

void MirrorRows(float* values, int64_t rows, int width) {
  for (int64_t row = 0; row < rows; ++row)
    std::reverse(values + row * width, values + (row + 1) * width);
}

int64_t Dataset::SampleFloats(int64_t index) const {
  const SampleSize s = buckets()[BucketOf(index)];
  return int64_t{frames()} * channels() * s.area();
}

Status SyntheticDataset::Get(int64_t index, float* image, int32_t* label) const {
  Rng rng(seed_, RngStream::kData, static_cast<uint64_t>(index));
  *label = num_classes_ > 0 ? static_cast<int32_t>(rng.Below(num_classes_)) : 0;
  const size_t n = static_cast<size_t>(frames_) * channels_ * size_ * size_;
  for (size_t i = 0; i < n; ++i)
    image[i] = static_cast<float>(rng.Normal());
  return Status::Ok();
}

SubsetDataset::SubsetDataset(const Dataset& source, std::vector<int64_t> indices)
    : source_(source), indices_(std::move(indices)) {
  for (int64_t i : indices_)
    DT_CHECK(i >= 0 && i < source.size(), "index {} of a dataset of {}", i, source.size());
}

namespace {

std::vector<int64_t> FirstIndices(int64_t count) {
  DT_CHECK(count >= 0, "a prefix of {} samples", count);
  std::vector<int64_t> indices(static_cast<size_t>(count));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  return indices;
}

}  // namespace

PrefixDataset::PrefixDataset(const Dataset& source, int64_t count)
    : SubsetDataset(source, FirstIndices(count)) {}

std::unique_ptr<Dataset> TakeSubset(std::unique_ptr<Dataset> source, int64_t count, uint64_t seed) {
  DT_CHECK(count > 0, "a subset of {} samples", count);
  if (!source->unbounded() && count >= source->size()) return source;
  std::vector<int64_t> indices;
  if (source->unbounded()) {
    indices = FirstIndices(count);
  } else {
    // The first `count` places of a Fisher–Yates shuffle of every index, then sorted.
    std::vector<int64_t> all = FirstIndices(source->size());
    Rng rng(seed, RngStream::kData, /*counter=*/0x5355425345540000ull);  // "SUBSET"
    for (int64_t i = 0; i < count; ++i) {
      const int64_t j = i + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(all.size() - i)));
      std::swap(all[i], all[j]);
    }
    indices.assign(all.begin(), all.begin() + count);
    std::sort(indices.begin(), indices.end());
  }
  auto subset = std::make_unique<SubsetDataset>(*source, std::move(indices));
  subset->owned_ = std::move(source);
  return subset;
}

Result<std::unique_ptr<Dataset>> OpenDataset(const DatasetSpec& spec) {
  if (spec.kind == "synthetic") {
    // No classes: unlabelled samples (label 0), for text-conditional and unconditional models.
    if (spec.channels < 1 || spec.image_size < 1 || spec.num_classes < 0 || spec.frames < 1) {
      return Errorf(
          "synthetic dataset needs positive channels, image size and frames, and classes >= 0, "
          "got {}, {}, {} and {}",
          spec.channels, spec.image_size, spec.frames, spec.num_classes);
    }
    return std::unique_ptr<Dataset>(std::make_unique<SyntheticDataset>(
        spec.seed, spec.channels, spec.image_size, spec.num_classes, spec.frames));
  }
  if (spec.kind == "fashion_mnist") {
    const std::string dir = spec.path.empty() ? std::string(kFashionMnistDefaultDir) : spec.path;
    DT_ASSIGN_OR_RETURN(auto dataset, FashionMnistDataset::Load(dir, spec.split));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  if (spec.kind == "moving_fashion_mnist") {
    const std::string dir = spec.path.empty() ? std::string(kFashionMnistDefaultDir) : spec.path;
    DT_ASSIGN_OR_RETURN(auto garments, FashionMnistDataset::Load(dir, spec.split));
    DT_ASSIGN_OR_RETURN(auto dataset, MovingFashionMnistDataset::Create(
                                          std::move(garments), spec.frames, spec.image_size));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  if (spec.kind == "latent_folder") {
    if (spec.path.empty()) return Status::Error("latent_folder dataset needs a path");
    DT_ASSIGN_OR_RETURN(auto dataset, LatentFolderDataset::Open(spec.path));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  if (spec.kind == "image_folder") {
    if (spec.path.empty()) return Status::Error("image_folder dataset needs a path");
    ImageCrop crop;
    if (spec.crop == "dit")
      crop = ImageCrop::kDit;
    else if (spec.crop == "square")
      crop = ImageCrop::kSquare;
    else if (spec.crop == "buckets")
      crop = ImageCrop::kBuckets;
    else
      return Errorf("image_folder: crop must be dit, square or buckets, got '{}'", spec.crop);
    DT_ASSIGN_OR_RETURN(auto dataset, ImageFolderDataset::Open(spec.path, spec.image_size,
                                                               spec.channels, crop, spec.buckets));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  return Errorf(
      "unknown dataset '{}' (expected synthetic, fashion_mnist, moving_fashion_mnist, "
      "latent_folder or image_folder)",
      spec.kind);
}

}  // namespace difftrain
