// What the families' GPU steps (model/dit/cuda/gpu_step.cc, model/unet/cuda/gpu_step.cc)
// share: CudaModelStep runs a bf16 GPU model (cuda::DiT, cuda::UNet: the same interface, their
// arenas in cuda::TrainState) on a stream of its own and joins NCCL groups on it; a family
// writes the micro-batch's inputs (Feed) and names the parameter bytes it holds besides the
// arenas. FindGpu, CheckAttentionFits and StartGpuStep are the pieces of its Create function.
// Built with the CUDA backend only.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/cuda/common.h"
#include "model/cuda/device_query.h"
#include "model/cuda/loss.h"
#include "model/cuda/train_state.h"
#include "model/parallel/nccl_comm.h"
#include "model/train/gpu_step.h"
#include "model/train/trainer.h"

namespace difftrain {

// Destroys the stream after everything declared after it in the owner, which used it.
struct OwnedStream {
  cudaStream_t stream;
  ~OwnedStream() { cudaStreamDestroy(stream); }
};

template <typename Model>
class CudaModelStep : public GpuStep {
 public:
  ~CudaModelStep() override { cudaStreamSynchronize(stream_.stream); }

  // The device memory of the whole step; the error names what did not fit.
  Status Reserve() {
    if (Status s = model_.Reserve(config_.micro_batch); !s.ok()) {
      return Errorf(
          "train.device cuda: GPU {} ({}) has no room for {} at batch.micro {}: {}. Lower "
          "batch.micro{}",
          device_.index, device_.name, model_.config().name, config_.micro_batch, s.message(),
          reserve_hint_);
    }
    return Status::Ok();
  }

  int device() const override { return device_.index; }
  const std::string& device_name() const override { return device_.name; }

  Result<std::unique_ptr<parallel::Comm>> JoinGroup(parallel::Store& store,
                                                    const std::string& prefix, int rank, int size,
                                                    std::vector<int> global_ranks,
                                                    std::chrono::milliseconds timeout) override {
    DT_CUDA_CHECK(cudaSetDevice(device_.index));
    return parallel::CreateNcclComm(store, prefix, rank, size, std::move(global_ranks), timeout,
                                    stream_.stream);
  }

  void UploadState(const float* params, const float* ema, const float* exp_avg,
                   const float* exp_avg_sq) override {
    model_.UploadState(params, ema, exp_avg, exp_avg_sq);
  }
  void DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) override {
    model_.DownloadState(params, ema, exp_avg, exp_avg_sq);
  }

  void ZeroGradients() override { model_.ZeroGradients(); }

  double ForwardBackward(const MicroBatch& batch, float grad_scale) override {
    DT_CHECK(batch.size == model_.micro_batch(), "micro-batch of {} for a step reserved for {}",
             batch.size, model_.micro_batch());
    Feed(batch);
    model_.ForwardBackward(grad_scale);
    return model_.last_loss();  // also keeps the pageable sources alive until copied
  }

  float* gradients() override { return model_.gradients(); }

  double OptimizerStep(double lr, int64_t step) override {
    model_.OptimizerStep(lr, step, config_.optimizer);
    return std::sqrt(model_.last_grad_norm_squared());
  }

  MemoryBytes memory() const override {
    const size_t n = model_.num_params();
    MemoryBytes m;
    m.parameters = n * (sizeof(float) + sizeof(cuda::bf16)) + fixed_parameter_bytes();
    m.gradients = n * sizeof(float);
    m.optimizer = 2 * n * sizeof(float);
    m.ema = n * sizeof(float);
    m.activations = model_.activation_bytes();
    return m;
  }

 protected:
  // `reserve_hint` ends the error of a Reserve without room (after "Lower batch.micro").
  template <typename ModelConfig>
  CudaModelStep(const TrainConfig& config, const ModelConfig& model,
                typename Model::Options options, const cuda::DeviceProperties& device,
                cudaStream_t stream, std::string reserve_hint)
      : config_(config),
        device_(device),
        stream_{stream},
        diffusion_(config.diffusion),
        model_(model, stream, options),
        reserve_hint_(std::move(reserve_hint)) {}

  // Writes the micro-batch's inputs into the model's input buffers (Copy), on the stream.
  virtual void Feed(const MicroBatch& batch) = 0;
  // Device bytes of fixed tensors the model holds besides the arenas (e.g. DiT's pos_embed).
  virtual size_t fixed_parameter_bytes() const { return 0; }

  // Copies a host vector to the device, asynchronously on the step's stream.
  template <typename V>
  void Copy(void* to, const V& from) {
    DT_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(from[0]),
                                  cudaMemcpyHostToDevice, stream_.stream));
  }

  TrainConfig config_;
  cuda::DeviceProperties device_;
  OwnedStream stream_;  // before model_, which uses it
  GaussianDiffusion diffusion_;
  Model model_;
  std::string reserve_hint_;
  std::vector<cuda::SampleLoss> samples_;  // the last micro-batch's loss terms, on the host
};

// GPU `device` of this machine; no usable GPU, or no GPU of that index, is an error that says so.
Result<cuda::DeviceProperties> FindGpu(int device);

// Whether `gpu` lets a kernel use `shared_bytes` of shared memory, what the model's attention
// kernels need at head dimension `head_dim`; the error's parenthesis names the GPUs that have
// room, then `note`.
Status CheckAttentionFits(const cuda::DeviceProperties& gpu, int device, int head_dim,
                          size_t shared_bytes, const std::string& note = "");

// Makes GPU `device` current, creates the step's stream, the Step (constructed from (config,
// model, gpu, stream)) and reserves its device memory.
template <typename Step, typename ModelConfig>
Result<std::unique_ptr<GpuStep>> StartGpuStep(const TrainConfig& config, const ModelConfig& model,
                                              const cuda::DeviceProperties& gpu, int device) {
  DT_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = cuda::CreateStepStream();
  auto step = std::make_unique<Step>(config, model, gpu, stream);
  DT_RETURN_IF_ERROR(step->Reserve());
  return std::unique_ptr<GpuStep>(std::move(step));
}

}  // namespace difftrain
