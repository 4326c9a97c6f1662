// The UNet family's GPU step (train.device cuda): the Trainer's micro-batches through the bf16
// cuda::UNet (model/unet/cuda/unet.h) on one GPU, its gradients averaged over an NCCL group
// (model/train/cuda/model_step.h).
#include "model/unet/cuda/gpu_step.h"

#include <algorithm>

#include "model/cuda/attention.h"
#include "model/cuda/train_state.h"
#include "model/train/cuda/model_step.h"
#include "model/unet/cuda/unet.h"
#include "model/unet/family.h"
#include "model/unet/plan.h"

namespace difftrain {
namespace {

class UNetCudaStep final : public CudaModelStep<cuda::UNet> {
 public:
  UNetCudaStep(const TrainConfig& config, const UNetConfig& unet,
               const cuda::DeviceProperties& device, cudaStream_t stream)
      : CudaModelStep(config, unet, {.use_graph = true}, device, stream, "") {}

 private:
  void Feed(const MicroBatch& batch) override {
    // The loss's target: ε, or v = √ᾱ·ε − √(1 − ᾱ)·x₀ under v-prediction (made on the host, as
    // the CPU Trainer makes it).
    const std::vector<float>* target = &batch.noise;
    if (!diffusion_.predicts_noise()) {
      target_.resize(batch.noise.size());
      diffusion_.Target(target_.data(), batch.x0.data(), batch.noise.data(), batch.t.data(),
                        batch.size, batch.noise.size() / batch.size);
      target = &target_;
    }
    samples_ = cuda::SampleLosses(diffusion_, batch.t.data(), batch.size, batch.sample_weights);
    Copy(model_.input_x(), batch.x_t);
    Copy(model_.input_t(), batch.t_float);
    Copy(model_.input_context(), batch.context);
    Copy(model_.input_target(), *target);
    Copy(model_.input_samples(), samples_);
  }

  std::vector<float> target_;
};

}  // namespace

ModelFamily::GpuStepMemory UNetGpuStepBytes(const UNetConfig& unet, int B) {
  return {cuda::TrainState::BytesFor(UNetPlan(unet).table.total()),
          cuda::UNet::ActivationBytes(unet, B)};
}

Result<std::unique_ptr<GpuStep>> CreateUNetGpuStep(const TrainConfig& config, int device) {
  const UNetConfig unet = UNetConfigOf(config.model);
  if (Status s = cuda::UNet::Supports(unet); !s.ok()) return s.WithContext("train.device cuda");
  if (config.learn_sigma_loss) {
    return Status::Error(
        "train.device cuda: the UNet's GPU step trains the MSE objective only (learn_sigma_loss "
        "is DiT's)");
  }
  DT_ASSIGN_OR_RETURN(const cuda::DeviceProperties gpu, FindGpu(device));
  int head_dim = 0;
  for (int level = 0; level < unet.levels(); ++level)
    head_dim = std::max(head_dim, unet.block_out_channels[level] / unet.heads(level));
  DT_RETURN_IF_ERROR(
      CheckAttentionFits(gpu, device, head_dim, cuda::AttentionSharedBytes(head_dim)));
  return StartGpuStep<UNetCudaStep>(config, unet, gpu, device);
}

}  // namespace difftrain
