#include "model/family/model.h"

#include <cstring>

namespace difftrain {

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

void Model::ScatterFromGlobal(const float* global, float* local) const {
  for (const Fragment& f : sharded().fragments)
    std::memcpy(local + f.local, global + f.global, f.length * sizeof(float));
}

void Model::GatherToGlobal(const float* local, float* global) const {
  for (const Fragment& f : sharded().fragments)
    std::memcpy(global + f.global, local + f.local, f.length * sizeof(float));
}

}  // namespace difftrain
