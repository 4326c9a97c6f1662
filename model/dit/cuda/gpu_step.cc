// The DiT and Latte families' GPU step (train.device cuda): the Trainer's micro-batches
// through the bf16 cuda::DiT (model/dit/cuda/dit.h) on one GPU, its gradients averaged over
// an NCCL group.
#include "model/dit/cuda/gpu_step.h"

#include <cmath>

#include "model/cuda/attention.h"
#include "model/cuda/device_query.h"
#include "model/cuda/loss.h"
#include "model/dit/cuda/dit.h"
#include "model/dit/family.h"
#include "model/parallel/nccl_comm.h"
#include "model/train/trainer.h"

namespace difftrain {

namespace {

// Destroys the stream after everything declared after it in the owner, which used it.
struct OwnedStream {
  cudaStream_t stream;
  ~OwnedStream() { cudaStreamDestroy(stream); }
};

class CudaStep final : public GpuStep {
 public:
  CudaStep(const TrainConfig& config, const DiTConfig& dit, const cuda::DeviceProperties& device,
           cudaStream_t stream)
      : config_(config),
        dit_(dit),
        device_(device),
        stream_{stream},
        diffusion_(config.diffusion),
        model_(dit, stream, {.vb_loss = config.learn_sigma_loss, .use_graph = true}) {}
  ~CudaStep() override { cudaStreamSynchronize(stream_.stream); }

  // The device memory of the whole step; the error names what did not fit.
  Status Reserve() {
    if (Status s = model_.Reserve(config_.micro_batch); !s.ok()) {
      return Errorf(
          "train.device cuda: GPU {} ({}) has no room for {} at batch.micro {}: {}. Lower "
          "batch.micro (`difftrain plan` predicts each layout's memory)",
          device_.index, device_.name, dit_.name, config_.micro_batch, s.message());
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
    // The loss's samples are a video's frames, each with its video's timestep.
    const int frames = dit_.frames();
    std::vector<int64_t> t(size_t(batch.size) * frames);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = batch.t[i / frames];
    const std::vector<cuda::SampleLoss> samples =
        cuda::SampleLosses(diffusion_, t.data(), static_cast<int>(t.size()));
    auto copy = [this](void* to, const auto& from) {
      DT_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(from[0]),
                                    cudaMemcpyHostToDevice, stream_.stream));
    };
    copy(model_.input_x(), batch.x_t);
    copy(model_.input_t(), batch.t_float);
    copy(model_.input_y(), batch.y);
    copy(model_.input_target(), batch.noise);
    copy(model_.input_samples(), samples);
    if (config_.learn_sigma_loss) copy(model_.input_x0(), batch.x0);
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
    const DiTConfig& c = dit_;
    MemoryBytes m;
    // + pos_embed, and Latte's temporal embedding (repeated over a frame's tokens)
    m.parameters = n * (sizeof(float) + sizeof(cuda::bf16)) +
                   size_t(c.tokens()) * c.hidden_size * sizeof(float) *
                       (1 + (c.video ? c.num_frames : 0));
    m.gradients = n * sizeof(float);
    m.optimizer = 2 * n * sizeof(float);
    m.ema = n * sizeof(float);
    m.activations = model_.activation_bytes();
    return m;
  }

 private:
  TrainConfig config_;
  DiTConfig dit_;
  cuda::DeviceProperties device_;
  OwnedStream stream_;  // before model_, which uses it
  GaussianDiffusion diffusion_;
  cuda::DiT model_;
};

}  // namespace

Result<std::unique_ptr<GpuStep>> CreateDiTGpuStep(const TrainConfig& config, int device) {
  std::string why;
  const std::vector<cuda::DeviceProperties> devices = cuda::QueryDevices(&why);
  if (devices.empty()) return Errorf("train.device cuda: no usable GPU: {}", why);
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return Errorf("train.device cuda: GPU {} asked for, but this machine has {} (0..{})", device,
                  devices.size(), devices.size() - 1);
  }
  const DiTConfig dit = DiTConfigOf(config.model);
  if (Status s = cuda::DiT::Supports(dit); !s.ok()) {
    return s.WithContext("train.device cuda");
  }
  const cuda::DeviceProperties& gpu = devices[device];
  const int head_dim = dit.hidden_size / dit.num_heads;
  if (const size_t need = cuda::AttentionSharedBytes(head_dim);
      need > gpu.shared_memory_per_block) {
    return Errorf(
        "train.device cuda: GPU {} ({}) lets a kernel use {:.1f} KiB of shared memory, the "
        "attention of head dimension {} needs {:.1f} KiB (A100, H100 and H20 have room; "
        "head dimensions up to 80 fit in 99 KiB)",
        device, gpu.name, gpu.shared_memory_per_block / 1024.0, head_dim, need / 1024.0);
  }
  DT_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto step = std::make_unique<CudaStep>(config, dit, gpu, stream);
  DT_RETURN_IF_ERROR(step->Reserve());
  return std::unique_ptr<GpuStep>(std::move(step));
}

}  // namespace difftrain
