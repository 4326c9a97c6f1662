// The DiT and Latte families' GPU step (train.device cuda): the Trainer's micro-batches
// through the bf16 cuda::DiT (model/dit/cuda/dit.h) on one GPU, its gradients averaged over
// an NCCL group (model/train/cuda/model_step.h).
#include "model/dit/cuda/gpu_step.h"

#include "model/cuda/flash_attention.h"
#include "model/dit/cuda/dit.h"
#include "model/dit/family.h"
#include "model/train/cuda/model_step.h"

namespace difftrain {

namespace {

// The model's defaults (a CUDA graph, the flash attention), with the job's loss and precision.
cuda::DiT::Options ModelOptions(const TrainConfig& config) {
  cuda::DiT::Options options;
  options.vb_loss = config.learn_sigma_loss;
  options.fp8 = config.precision == "fp8";
  return options;
}

class CudaStep final : public CudaModelStep<cuda::DiT> {
 public:
  CudaStep(const TrainConfig& config, const DiTConfig& dit, const cuda::DeviceProperties& device,
           cudaStream_t stream)
      : CudaModelStep(config, dit, ModelOptions(config), device, stream,
                      " (`difftrain plan` predicts each layout's memory)") {}

 private:
  void Feed(const MicroBatch& batch) override {
    // The loss's samples are a video's frames, each with its video's timestep.
    const int frames = model_.config().frames();
    std::vector<int64_t> t(size_t(batch.size) * frames);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = batch.t[i / frames];
    samples_ = cuda::SampleLosses(diffusion_, t.data(), static_cast<int>(t.size()),
                                  batch.sample_weights, frames);
    Copy(model_.input_x(), batch.x_t);
    Copy(model_.input_t(), batch.t_float);
    Copy(model_.input_y(), batch.y);
    Copy(model_.input_target(), batch.noise);
    Copy(model_.input_samples(), samples_);
    if (config_.learn_sigma_loss) Copy(model_.input_x0(), batch.x0);
  }

  // pos_embed, and Latte's temporal embedding (repeated over a frame's tokens).
  size_t fixed_parameter_bytes() const override {
    const DiTConfig& c = model_.config();
    return size_t(c.tokens()) * c.hidden_size * sizeof(float) * (1 + (c.video ? c.num_frames : 0));
  }
};

}  // namespace

ModelFamily::GpuStepMemory DiTGpuStepBytes(const DiTConfig& dit, int B, bool fp8) {
  // The step's options that change the arena are the attention's (the model's defaults) and
  // the precision.
  cuda::DiT::Options options;
  options.fp8 = fp8;
  return {cuda::DiT::StateBytes(dit), cuda::DiT::ActivationBytes(dit, B, options)};
}

Result<std::unique_ptr<GpuStep>> CreateDiTGpuStep(const TrainConfig& config, int device) {
  DT_ASSIGN_OR_RETURN(const cuda::DeviceProperties gpu, FindGpu(device));
  const DiTConfig dit = DiTConfigOf(config.model);
  if (Status s = cuda::DiT::Supports(dit); !s.ok()) {
    return s.WithContext("train.device cuda");
  }
  // What the options refuse before any allocation, so that it is not reported as a lack of
  // room: FP8 on a GPU without FP8 tensor cores, sizes FP8 or the attention's grids refuse.
  if (config.precision == "fp8" && !cuda::Fp8Capable(gpu.compute_major, gpu.compute_minor)) {
    return Errorf(
        "train.precision fp8: GPU {} ({}) has compute capability {}.{}; FP8 needs 8.9 or later "
        "(Ada, Hopper): write train.precision: bf16",
        gpu.index, gpu.name, gpu.compute_major, gpu.compute_minor);
  }
  if (Status s = cuda::DiT::TakesMicroBatch(dit, config.micro_batch, ModelOptions(config));
      !s.ok()) {
    return s.WithContext(fmt::format("train.device cuda, batch.micro {}", config.micro_batch));
  }
  // The flash kernels (cuda::DiT's default attention) with the model's stages: at most
  // 68.5 KiB with two, 89.5 KiB for the short-sequence backward at hd 128.
  const int head_dim = dit.hidden_size / dit.num_heads;
  DT_RETURN_IF_ERROR(CheckAttentionFits(
      gpu, device, head_dim,
      cuda::FlashAttentionSharedBytes(head_dim, ModelOptions(config).flash.stages)));
  return StartGpuStep<CudaStep>(config, dit, gpu, device);
}

}  // namespace difftrain
