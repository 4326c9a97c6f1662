// The UNet family's GPU step (model/train/gpu_step.h), built with the CUDA backend only.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/family/family.h"
#include "model/train/gpu_step.h"
#include "model/unet/config.h"

namespace difftrain {

// Makes GPU `device` current and reserves the bf16 step of config.model (a UNet) there for
// config.micro_batch; a UNet the kernels do not take, a GPU without room or without the
// attention's shared memory is an error that says so.
Result<std::unique_ptr<GpuStep>> CreateUNetGpuStep(const TrainConfig& config, int device);

// What that step's model allocates for micro-batches of B (the training state and
// cuda::UNet::ActivationBytes), without a GPU.
ModelFamily::GpuStepMemory UNetGpuStepBytes(const UNetConfig& unet, int B);

}  // namespace difftrain
