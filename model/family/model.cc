#include "model/family/model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>

namespace difftrain {

void GradientSkips::Set(const TensorTable& table, std::vector<size_t> tensor_offsets) {
  std::sort(tensor_offsets.begin(), tensor_offsets.end());
  ranges_.clear();
  for (const TensorSpec& t : table.tensors()) {
    if (!std::binary_search(tensor_offsets.begin(), tensor_offsets.end(), t.offset)) continue;
    if (!ranges_.empty() && ranges_.back().second == t.offset) {
      ranges_.back().second += t.numel;
    } else {
      ranges_.push_back({t.offset, t.offset + t.numel});
    }
  }
}

bool GradientSkips::Skips(size_t offset, size_t n) const {
  auto after =
      std::upper_bound(ranges_.begin(), ranges_.end(), std::pair<size_t, size_t>{offset, SIZE_MAX});
  if (after == ranges_.begin()) return false;
  const auto& [begin, end] = *std::prev(after);
  return begin <= offset && offset + n <= end;
}

size_t Model::fixed_bytes() const {
  size_t bytes = 0;
  for (const FixedTensor& t : fixed_tensors()) {
    size_t n = 1;
    for (int64_t d : t.shape)
      n *= static_cast<size_t>(d);
    bytes += n * sizeof(float);
  }
  return bytes;
}

Status Model::SetContextGradient(int, float* dcontext) {
  if (dcontext == nullptr) return Status::Ok();
  return Status::Error(
      "this model computes no gradient of its text embeddings (textual inversion trains through "
      "the Stable Diffusion UNet's cross-attention)");
}

Status Model::SetSampleSize(int height, int width) {
  return Errorf(
      "this model trains at its config's size only, not {}x{} latents (aspect-ratio buckets need "
      "a convolutional family: the unet)",
      height, width);
}

bool Model::holds_whole_model() const {
  if (num_params() != global_parameter_table().total()) return false;
  for (const Fragment& f : sharded().fragments) {
    if (f.local != f.global) return false;
  }
  return true;
}

void Model::ScatterFromGlobal(const float* global, float* local) const {
  for (const Fragment& f : sharded().fragments)
    std::memcpy(local + f.local, global + f.global, f.length * sizeof(float));
}

void Model::GatherToGlobal(const float* local, float* global) const {
  for (const Fragment& f : sharded().fragments)
    std::memcpy(global + f.global, local + f.local, f.length * sizeof(float));
}

}  // namespace difftrain
