// The UNet family's GPU step (train.device cuda): the Trainer's micro-batches through the bf16
// cuda::UNet (model/unet/cuda/unet.h) on one GPU, its gradients averaged over an NCCL group.
#include "model/unet/cuda/gpu_step.h"

#include <algorithm>
#include <cmath>

#include "model/cuda/attention.h"
#include "model/cuda/device_query.h"
#include "model/cuda/loss.h"
#include "model/parallel/nccl_comm.h"
#include "model/train/trainer.h"
#include "model/unet/cuda/unet.h"
#include "model/unet/family.h"

namespace difftrain {
namespace {

// Destroys the stream after everything declared after it in the owner, which used it.
struct OwnedStream {
  cudaStream_t stream;
  ~OwnedStream() { cudaStreamDestroy(stream); }
};

class UNetCudaStep final : public GpuStep {
 public:
  UNetCudaStep(const TrainConfig& config, const UNetConfig& unet,
               const cuda::DeviceProperties& device, cudaStream_t stream)
      : config_(config),
        unet_(unet),
        device_(device),
        stream_{stream},
        diffusion_(config.diffusion),
        model_(unet, stream, {.use_graph = true}) {}
  ~UNetCudaStep() override { cudaStreamSynchronize(stream_.stream); }

  Status Reserve() {
    if (Status s = model_.Reserve(config_.micro_batch); !s.ok()) {
      return Errorf(
          "train.device cuda: GPU {} ({}) has no room for {} at batch.micro {}: {}. Lower "
          "batch.micro",
          device_.index, device_.name, unet_.name, config_.micro_batch, s.message());
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
    // The loss's target: ε, or v = √ᾱ·ε − √(1 − ᾱ)·x₀ under v-prediction (made on the host, as
    // the CPU Trainer makes it).
    const std::vector<float>* target = &batch.noise;
    if (!diffusion_.predicts_noise()) {
      target_.resize(batch.noise.size());
      diffusion_.Target(target_.data(), batch.x0.data(), batch.noise.data(), batch.t.data(),
                        batch.size, batch.noise.size() / batch.size);
      target = &target_;
    }
    samples_ = cuda::SampleLosses(diffusion_, batch.t.data(), batch.size);
    auto copy = [this](void* to, const auto& from) {
      DT_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(from[0]),
                                    cudaMemcpyHostToDevice, stream_.stream));
    };
    copy(model_.input_x(), batch.x_t);
    copy(model_.input_t(), batch.t_float);
    copy(model_.input_context(), batch.context);
    copy(model_.input_target(), *target);
    copy(model_.input_samples(), samples_);
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
    m.parameters = n * (sizeof(float) + sizeof(cuda::bf16));
    m.gradients = n * sizeof(float);
    m.optimizer = 2 * n * sizeof(float);
    m.ema = n * sizeof(float);
    m.activations = model_.activation_bytes();
    return m;
  }

 private:
  TrainConfig config_;
  UNetConfig unet_;
  cuda::DeviceProperties device_;
  OwnedStream stream_;  // before model_, which uses it
  GaussianDiffusion diffusion_;
  cuda::UNet model_;
  std::vector<float> target_;
  std::vector<cuda::SampleLoss> samples_;
};

}  // namespace

Result<std::unique_ptr<GpuStep>> CreateUNetGpuStep(const TrainConfig& config, int device) {
  const UNetConfig unet = UNetConfigOf(config.model);
  if (Status s = cuda::UNet::Supports(unet); !s.ok()) return s.WithContext("train.device cuda");
  if (config.learn_sigma_loss) {
    return Status::Error(
        "train.device cuda: the UNet's GPU step trains the MSE objective only (learn_sigma_loss "
        "is DiT's)");
  }
  std::string why;
  const std::vector<cuda::DeviceProperties> devices = cuda::QueryDevices(&why);
  if (devices.empty()) return Errorf("train.device cuda: no usable GPU: {}", why);
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return Errorf("train.device cuda: GPU {} asked for, but this machine has {} (0..{})", device,
                  devices.size(), devices.size() - 1);
  }
  const cuda::DeviceProperties& gpu = devices[device];
  int head_dim = 0;
  for (int level = 0; level < unet.levels(); ++level)
    head_dim = std::max(head_dim, unet.block_out_channels[level] / unet.heads(level));
  if (const size_t need = cuda::AttentionSharedBytes(head_dim);
      need > gpu.shared_memory_per_block) {
    return Errorf(
        "train.device cuda: GPU {} ({}) lets a kernel use {:.1f} KiB of shared memory, the "
        "attention of head dimension {} needs {:.1f} KiB (A100, H100 and H20 have room)",
        device, gpu.name, gpu.shared_memory_per_block / 1024.0, head_dim, need / 1024.0);
  }
  DT_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto step = std::make_unique<UNetCudaStep>(config, unet, gpu, stream);
  DT_RETURN_IF_ERROR(step->Reserve());
  return std::unique_ptr<GpuStep>(std::move(step));
}

}  // namespace difftrain
