#include "model/train/gpu_step.h"

#include "model/family/family.h"

namespace difftrain {

Result<std::unique_ptr<GpuStep>> GpuStep::Create(const TrainConfig& config, int device) {
  return FamilyOf(config.model).CreateGpuStep(config, device);
}

}  // namespace difftrain
