// The Stable Diffusion UNet's training step on one GPU in bf16 mixed precision: the GPU twin of
// difftrain::UNet (model/unet/unet.h), which is its reference, built from the ops of
// model/cuda — convolutions as im2col + cuBLASLt GEMMs (conv2d.h), GroupNorm fused with SiLU
// (groupnorm.h), nearest ×2 upsampling and skip concatenation (spatial.h), self- and
// cross-attention through the flash kernels where they take the head dim, else the fused ones
// (flash_attention.h, attention.h; Tq ≠ Tk for the text; transformer.cc),
// GEGLU with the exact GELU (geglu.h), the loss (loss.h) and AdamW (optimizer.h).
//
// Precision, as PyTorch's bf16 autocast does it: GEMMs (convolutions included) and attention
// read bf16 and accumulate in fp32; the values between layers, the transformers' residual
// stream, the norms' statistics, biases added after a GEMM, gradients, AdamW's state, the
// master weights and the EMA are fp32.
//
// Memory: parameters (fp32 master + bf16 copy), gradients, the two AdamW moments and the EMA
// are one arena each in the parameter table's layout (the diffusers state-dict names;
// model/cuda/train_state.h), so a download is the CPU model's arena; the activations, the
// values' gradients, the layers' shared scratch and the workspaces are one more allocation,
// made by Reserve. ForwardBackward is captured as a CUDA graph on its second call.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/gemm.h"
#include "model/cuda/loss.h"
#include "model/cuda/train_state.h"
#include "model/optim/adamw.h"
#include "model/tensor/tensor_table.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain::cuda {

namespace unet {
class Layer;
}

class CudnnAttentionSet;

class UNet {
 public:
  struct Options {
    bool use_graph = true;  // capture ForwardBackward as a CUDA graph
    // The transformers' attention on the flash kernels wherever they take the head dim
    // (multiples of 8 up to 128), else the fused kernels; false: the fused ones everywhere.
    bool flash_attention = true;
    // The self-attention (attn1) on cuDNN's fused attention (model/cuda/cudnn_attention.h) wherever
    // it takes the head dim (multiples of 8 up to 128), its plans made by Reserve; the
    // cross-attention keeps the kernels above. Off by default until timed on a GPU.
    bool cudnn_attention = false;
  };
  // Whether the kernels take this model: channel counts (every level's, in_channels excepted),
  // cross_attention_dim and every tensor's offset in the parameter table must be multiples of 8
  // (16-byte aligned bf16 GEMMs), and each level's head dimension a multiple of 8 up to 160.
  // SD1.5, SD2-base and SD2-v are.
  static Status Supports(const UNetConfig& config);
  // Fails fast on a config that Supports refuses.
  UNet(const UNetConfig& config, cudaStream_t stream, Options options);
  ~UNet();
  UNet(const UNet&) = delete;
  UNet& operator=(const UNet&) = delete;

  const UNetConfig& config() const { return config_; }
  const TensorTable& parameter_table() const { return plan_.table; }
  size_t num_params() const { return plan_.table.total(); }

  // Allocates what a step on micro-batches of B needs: on the first call the whole-model
  // arenas (zero until UploadState), then the activations for B (again when B changes). A GPU
  // without room is an error with the bytes asked for.
  Status Reserve(int B);
  int micro_batch() const { return batch_; }
  size_t activation_bytes() const { return acts_buffer_.bytes(); }
  // Device bytes of cuDNN's plans' workspaces (Options::cudnn_attention; 0 otherwise).
  size_t cudnn_workspace_bytes() const;
  // Bytes of the activations (and scratch, workspaces) a micro-batch of B needs.
  static size_t ActivationBytes(const UNetConfig& config, int B, const Options& options);
  static size_t ActivationBytes(const UNetConfig& config, int B);  // the default options

  // Host arenas of the table's layout (null moments: zeros); synchronous (TrainState).
  void UploadState(const float* params, const float* ema, const float* exp_avg,
                   const float* exp_avg_sq) {
    state_.Upload(params, ema, exp_avg, exp_avg_sq);
  }
  void DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) const {
    state_.Download(params, ema, exp_avg, exp_avg_sq);
  }
  std::vector<float> DownloadParameters() const { return state_.DownloadParameters(); }
  std::vector<float> DownloadGradients() const { return state_.DownloadGradients(); }
  float* gradients() { return state_.gradients(); }

  // The micro-batch's inputs, written by the caller on stream() before ForwardBackward: x_t
  // [B, in_channels, S, S], t [B] as floats, the text embeddings [B, L, D_text] (after text
  // dropout), the loss's target [B, in_channels, S, S] (ε, or v under v-prediction) and each
  // sample's loss terms [B] (SampleLosses; Reserve sets weight 1).
  float* input_x() { return values_.front(); }
  float* input_t() { return in_t_; }
  float* input_context() { return in_context_; }
  float* input_target() { return in_target_; }
  SampleLoss* input_samples() { return in_samples_; }

  // Forward of the micro-batch in the inputs; output() is [B, out_channels, S, S].
  void Forward();
  const float* output() const { return values_.back(); }
  // Forward, the loss and backward, adding grad_scale times the loss's gradients; graph
  // captured on the second call and replayed after (a new grad_scale captures again).
  void ForwardBackward(float grad_scale = 1.0f);
  float last_loss() const;  // synchronises
  void ZeroGradients() { state_.ZeroGradients(); }
  // Clipping, AdamW and the EMA on the device (TrainState::OptimizerStep).
  void OptimizerStep(double lr, int64_t step, const OptimizerConfig& config) {
    state_.OptimizerStep(lr, step, config);
  }
  double last_grad_norm_squared() const { return state_.last_grad_norm_squared(); }

  cudaStream_t stream() const { return stream_; }
  // For tests: fills the activation arena with NaN bytes.
  void PoisonActivations();

  // Where a micro-batch's tensors sit in the activation arena (model/unet/cuda/unet.cc).
  struct Layout;

 private:
  void Loss();
  void Backward();

  UNetConfig config_;
  UNetPlan plan_;
  cudaStream_t stream_;
  TrainState state_;
  Gemm gemm_;

  int batch_ = 0;
  std::unique_ptr<Layout> layout_;
  std::vector<std::unique_ptr<unet::Layer>> layers_;
  DeviceBuffer<unsigned char> acts_buffer_;
  std::vector<float*> values_, value_grads_;
  float *in_t_ = nullptr, *in_context_ = nullptr, *in_target_ = nullptr, *loss_ = nullptr;
  SampleLoss* in_samples_ = nullptr;
  double* loss_workspace_ = nullptr;

  StepGraph graph_;
  float grad_scale_ = 1.0f;  // the loss's, as the graph holds it
  bool flash_attention_;     // Options::flash_attention, for the layers Reserve makes
  // Options::cudnn_attention: the self-attention's shapes, prepared by Reserve; else null.
  std::unique_ptr<CudnnAttentionSet> cudnn_;
};

}  // namespace difftrain::cuda
