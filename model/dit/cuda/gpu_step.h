// The DiT family's GPU step (model/train/gpu_step.h), built with the CUDA backend only.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/dit/config.h"
#include "model/family/family.h"
#include "model/train/gpu_step.h"

namespace difftrain {

// Makes GPU `device` current and reserves the bf16 step of config.model (a DiT) there for
// config.micro_batch; a GPU without room or without the attention's shared memory is an error
// that says so.
Result<std::unique_ptr<GpuStep>> CreateDiTGpuStep(const TrainConfig& config, int device);

// What that step's model allocates for micro-batches of B (cuda::DiT::StateBytes and
// ActivationBytes; with fp8, the FP8 layers' workspace too), without a GPU.
ModelFamily::GpuStepMemory DiTGpuStepBytes(const DiTConfig& dit, int B, bool fp8 = false);

}  // namespace difftrain
