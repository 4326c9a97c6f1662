#include "model/train/gpu_step.h"

#include "model/family/family.h"

namespace difftrain {

Status NoCudaBackend() {
  return Status::Error(
      "train.device cuda: this difftrain was built without the CUDA backend (no nvcc when it was "
      "built; see docs/cuda.md)");
}

Result<std::unique_ptr<GpuStep>> GpuStep::Create(const TrainConfig& config, int device) {
  return FamilyOf(config.model).CreateGpuStep(config, device);
}

}  // namespace difftrain
