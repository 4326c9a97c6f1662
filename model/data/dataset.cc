#include "model/data/dataset.h"

#include "model/tensor/rng.h"

namespace difftrain {

Status SyntheticDataset::Get(int64_t index, float* image, int32_t* label) const {
  Rng rng(seed_, RngStream::kData, static_cast<uint64_t>(index));
  *label = static_cast<int32_t>(rng.Below(num_classes_));
  const size_t n = static_cast<size_t>(channels_) * size_ * size_;
  for (size_t i = 0; i < n; ++i)
    image[i] = static_cast<float>(rng.Normal());
  return Status::Ok();
}

}  // namespace difftrain
