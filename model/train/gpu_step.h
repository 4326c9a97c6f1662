// The GPU side of a Trainer with train.device cuda: the model family's bf16 training step
// (DiT's: model/dit/cuda/gpu_step.h) on this rank's GPU, fed with the trainer's micro-batches
// (made on the host, as on the CPU: the same samples, timesteps, labels and noise). Declared
// without CUDA headers so that the trainer compiles in every build; Create says why not where CUDA
// was not built or the GPU cannot take the model.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/job_spec.h"
#include "model/parallel/comm.h"
#include "model/parallel/store.h"

struct CUstream_st;  // what cudaStream_t points to

namespace difftrain {

struct MicroBatch;
struct MemoryBytes;

// The error of a family's CreateGpuStep in a build without the CUDA backend.
Status NoCudaBackend();

class GpuStep {
 public:
  // The family's step (ModelFamily::CreateGpuStep): makes GPU `device` current, creates the
  // step's stream and the model's device arenas (parameters zero until UploadState) and
  // activations for config.micro_batch; a GPU without room for them is an error that says so.
  static Result<std::unique_ptr<GpuStep>> Create(const TrainConfig& config, int device);
  virtual ~GpuStep() = default;

  virtual int device() const = 0;
  virtual const std::string& device_name() const = 0;  // e.g. "NVIDIA H100 80GB HBM3"
  // The communicator of a group of GPUs (NCCL) in which this rank's GPU is `rank` of `size`
  // (CreateNcclComm's arguments); its ops take device buffers and follow the step's stream.
  virtual Result<std::unique_ptr<parallel::Comm>> JoinGroup(parallel::Store& store,
                                                            const std::string& prefix, int rank,
                                                            int size, std::vector<int> global_ranks,
                                                            std::chrono::milliseconds timeout) = 0;

  // The whole-model arenas (the parameter table's layout) to and from the host; null moments
  // upload as zeros, a null destination is skipped. Synchronous.
  virtual void UploadState(const float* params, const float* ema, const float* exp_avg,
                           const float* exp_avg_sq) = 0;
  virtual void DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) = 0;

  virtual void ZeroGradients() = 0;
  // Uploads the micro-batch and runs forward, the loss (the trainer's: learn_sigma_loss and the
  // loss weighting included) and backward, adding grad_scale times its gradients. Returns the
  // loss (synchronises).
  virtual double ForwardBackward(const MicroBatch& batch, float grad_scale) = 0;
  // The gradient arena on the device (num_params floats), for the data-parallel all-reduce.
  virtual float* gradients() = 0;
  // Clipping (optimizer.grad_clip), AdamW at `lr` as optimizer step `step` (1-based) and the
  // EMA, all on the device; returns the global gradient norm before clipping (synchronises).
  virtual double OptimizerStep(double lr, int64_t step) = 0;

  // Device bytes by arena, as Trainer::memory reports them.
  virtual MemoryBytes memory() const = 0;
};

}  // namespace difftrain
