// DiT's training step on one GPU in bf16 mixed precision: the GPU twin of difftrain::DiT
// (model/dit/dit.h), which is its reference, for the whole model in one process — DiT, or
// Latte (DiTConfig::video): samples of F frames, odd blocks attending across frames through
// a token-major copy of their qkv (SwapAxes), the temporal embedding after block 0.
//
// Precision, as PyTorch's bf16 autocast does it: the GEMMs and attention read bf16 (the
// activations they consume, and a bf16 copy of the weights) and accumulate in fp32; the
// residual stream, the conditioning, the adaLN vectors, LayerNorm statistics, gradients,
// AdamW's state, the master weights and the EMA are fp32.
//
// Memory: parameters (fp32 master + bf16 copy), gradients, the two AdamW moments and the
// EMA are one arena each, laid out by the whole model's parameter table (the reference
// state-dict names; model/cuda/train_state.h), so a download is exactly the CPU model's arena.
// Activations and the backward scratch are one more allocation. Reserve makes them all (a GPU
// without room is an error, not a crash); nothing is allocated inside a step.
// Everything runs on one stream; ForwardBackward is captured as a CUDA graph on its second
// call and replayed after that (StepGraph; the optimizer step, whose learning rate changes
// every step, runs outside the graph: four kernels).
//
// The loss is the trainer's (model/diffusion/vb_loss.h): DiT's ε-MSE on the first
// in_channels output channels, weighted per sample, plus with Options::vb_loss the
// variational-bound term that trains the variance channels (otherwise their gradient is 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/cuda/attention.h"
#include "model/cuda/cudnn_attention.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/fp8.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemm_attention.h"
#include "model/cuda/loss.h"
#include "model/cuda/modulate.h"
#include "model/cuda/optimizer.h"
#include "model/cuda/train_state.h"
#include "model/dit/config.h"
#include "model/dit/params.h"
#include "model/optim/adamw.h"
#include "model/tensor/tensor_table.h"

namespace difftrain::cuda {

// Which kernels compute attention: kFlash (the default), the mma.sync flash kernels
// (model/cuda/flash_attention.h) everywhere, 1.13-1.16x the kGemm step on an H100 (DiT-XL/2,
// Latte-L/2; docs/benchmarks.md); kGemm, cuBLASLt's batched GEMMs for the spatial blocks where
// GemmAttentionTakes the frame's tokens (model/cuda/gemm_attention.h) and the fused wmma
// kernels elsewhere (model/cuda/attention.h); kFused, those everywhere; kCudnn, cuDNN's fused
// flash attention (model/cuda/cudnn_attention.h, its deterministic backward) for the spatial
// blocks and the flash kernels across frames (Latte's temporal rows, T·3·D apart with B·T
// sequences, are no layout of cuDNN's 4-d tensors). Reserve prepares cuDNN's plans and returns
// its error where there is no cuDNN or no plan. Written without a GPU: not yet run on one.
enum class AttentionKernels { kGemm, kFused, kFlash, kCudnn };

// Which of the flash kernels' variants kFlash runs (model/cuda/flash_attention.h): the loop's
// tiles loaded in one stage or two (double-buffered cp.async copies), and the forward with one
// 16-row m-tile a warp or two (wide_forward: taken only where a sequence fills the wide block,
// FlashWideForwardFills; Latte's temporal attention over 16 frames does not). All give the same
// bits. The default, two stages and the wide forward, made DiT-XL/2's step 1.05x (micro-batch
// 32) and 1.04x (128) one stage and one m-tile on an H100 (docs/benchmarks.md).
//
// stored_scores: the backward's dQ from the score gradients the dK/dV kernel stores
// (FlashAttentionBackwardStored: 5 tensor-core products instead of 7, for a round trip of dS
// through memory), taken only where sequences are long (FlashStoredScoresPay). Written without
// a GPU and checked on the CPU emulator; the default until an H100 times it against recomputing.
//
// short_sequences: where a sequence has at most kFlashShortRows (16) rows — Latte's temporal
// attention over 16 frames, a tiny DiT's 16 tokens — the short-sequence kernels (one warp a
// sequence and head, a one-kernel backward; FlashAttentionForwardShort), which take neither
// stages nor the wide forward: the same bits. Written without a GPU, checked on the CPU
// emulator; the default until an H100 times it (bench_cuda_dit --no-short-attention).
struct FlashVariant {
  FlashStages stages = FlashStages::kTwo;
  bool wide_forward = true;
  bool stored_scores = true;
  bool short_sequences = true;
};

// Where a micro-batch's activations and backward scratch live in the model's arena (set by
// DiT::BindActivations).
struct DiTActivations {
  struct BlockActs {
    float *resid_in, *ada, *mean1, *rstd1, *mid, *mean2, *rstd2, *lse;
    bf16 *mod1, *qkv, *attn, *proj, *mod2, *fc1_pre, *gelu, *fc2;
    bf16 *qkv_t, *attn_t;  // a temporal block's qkv and attention, token-major, for the fused
                           // kernels; else null (flash reads the frame-major ones in place)
  };
  // Inputs and what forward keeps.
  float *in_x_ = nullptr, *in_t_ = nullptr, *in_target_ = nullptr, *in_x0_ = nullptr;
  int32_t* in_y_ = nullptr;
  SampleLoss* in_samples_ = nullptr;
  double* loss_workspace_ = nullptr;
  bf16 *patches_ = nullptr, *tfreq_ = nullptr, *t_act_ = nullptr, *silu_c_ = nullptr;
  float *t_hidden_ = nullptr, *t_emb_ = nullptr, *c_ = nullptr;
  std::vector<BlockActs> acts_;
  float *resid_out_ = nullptr, *ada_f_ = nullptr, *meanf_ = nullptr, *rstdf_ = nullptr;
  bf16* modf_ = nullptr;
  float *final_out_ = nullptr, *out_ = nullptr, *loss_ = nullptr;
  // Backward scratch.
  float *d_out_ = nullptr, *d_final_ = nullptr, *d_resid_ = nullptr;
  float *d_ada_[2] = {nullptr, nullptr}, *d_ada_f_ = nullptr, *norm_workspace_ = nullptr;
  float* bias_scratch_ = nullptr;  // a bias gradient cuBLASLt's epilogue stores, before the add
  float *d_silu_c_ = nullptr, *d_c_ = nullptr, *d_t_ = nullptr, *attn_workspace_ = nullptr;
  bf16 *d_final_bf16_ = nullptr, *d_a_ = nullptr, *d_b_ = nullptr, *d_h_ = nullptr;
  bf16 *d_qkv_ = nullptr, *d_ada_bf16_ = nullptr, *d_small_ = nullptr, *d_c_bf16_ = nullptr;
  bf16 *d_attn_t_ = nullptr, *d_qkv_t_ = nullptr;  // a temporal block's, token-major
  unsigned char* fp8_workspace_ = nullptr;         // Options::fp8's quantised operands
};

class DiT : private DiTActivations {
 public:
  struct Options {
    bool vb_loss = false;   // add the variational-bound term (learn_sigma models)
    bool use_graph = true;  // capture ForwardBackward as a CUDA graph
    AttentionKernels attention = AttentionKernels::kFlash;
    FlashVariant flash;
    bool gemm_autotune = true;  // Gemm::set_autotune
    // The blocks' four Linear layers (qkv, proj, fc1, fc2) in FP8, forward and backward
    // (model/cuda/fp8.h: E4M3 activations and weights, E5M2 gradients, delayed scaling); the
    // rest stays bf16. Needs compute capability 8.9 (Reserve returns the error elsewhere) and
    // every block GEMM's sizes multiples of 16. Written without a GPU: not yet run on one.
    bool fp8 = false;
    int fp8_amax_history = Fp8Recipe{}.history;  // Fp8Recipe's fields
    int fp8_margin = Fp8Recipe{}.margin;
  };
  // Whether the kernels take this model: every tensor of the parameter table must start at
  // a multiple of 8 elements and every GEMM's sizes must be multiples of 8 (16-byte aligned
  // bf16 for cuBLASLt), and the head dimension a multiple of 8 up to 128. Every named DiT is.
  static Status Supports(const DiTConfig& config);
  // Whether the attention kernels' launches take a micro-batch of B: the flash and fused kernels
  // give each sequence a z index of the grid, at most 65,535 — a DiT's B·F frames, and a Latte
  // temporal block's B·T token sequences (65,536 at 256 videos of 32×32 latents) unless the
  // short-sequence kernels, whose grid has one dimension, take those (≤ 16 frames). Reserve
  // returns its error.
  static Status TakesMicroBatch(const DiTConfig& config, int B, const Options& options);
  // Fails fast on a config that Supports refuses.
  DiT(const DiTConfig& config, cudaStream_t stream, Options options);
  ~DiT() = default;
  DiT(const DiT&) = delete;
  DiT& operator=(const DiT&) = delete;

  const DiTConfig& config() const { return config_; }
  const TensorTable& parameter_table() const { return table_; }
  size_t num_params() const { return table_.total(); }

  // Allocates what a step on micro-batches of B needs: on the first call the whole-model
  // arenas (zero until UploadState), then the activations for B (again when B changes). On a
  // GPU without room it returns the error with the bytes asked for; the model then has no
  // activations until a Reserve succeeds. Everything below needs a successful Reserve.
  Status Reserve(int B);
  int micro_batch() const { return batch_; }
  size_t activation_bytes() const { return acts_buffer_.bytes(); }
  // Bytes of every device allocation this model holds (arenas, activations, workspaces).
  size_t device_bytes() const;
  // What device_bytes() comes to for micro-batches of B, without a GPU (for the planner):
  // the parameters' fp32 master and bf16 copy, gradients, AdamW moments, EMA and the fixed
  // embeddings (StateBytes), and the activation arena (ActivationBytes). cuBLASLt's
  // workspace and the CUDA context come on top.
  static size_t StateBytes(const DiTConfig& config);
  static size_t ActivationBytes(const DiTConfig& config, int B, const Options& options);
  static size_t ActivationBytes(const DiTConfig& config, int B);  // the default options

  // Sets the master weights (and their bf16 copy), the EMA and AdamW's moments from host
  // arenas of the table's layout (null moments: zeros), and zeroes the gradients.
  // Synchronous.
  void UploadState(const float* params, const float* ema, const float* exp_avg,
                   const float* exp_avg_sq);
  // Copies whichever of the four arenas is not null to the host. Synchronous.
  void DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) const;
  std::vector<float> DownloadParameters() const { return state_.DownloadParameters(); }
  std::vector<float> DownloadGradients() const;
  // The gradient arena on the device, e.g. for a data-parallel all-reduce between
  // ForwardBackward and OptimizerStep.
  float* gradients();

  // The input of a micro-batch, written by the caller (cudaMemcpyAsync on stream()) before
  // ForwardBackward: x_t [B, C, H, W], timesteps t [B] as floats, labels y [B], the noise ε
  // [B, C, H, W] the loss compares the first C output channels with, and each sample's loss
  // terms [B] (SampleLosses; Reserve sets weight 1 and the coefficients of t = 0). The vb
  // term also reads x0 [B, C, H, W]. A video model's samples are [B, F, C, H, W] and its loss
  // terms are per frame, [B·F] (each frame with its video's timestep).
  float* input_x() { return in_x_; }
  float* input_t() { return in_t_; }
  int32_t* input_y() { return in_y_; }
  float* input_target() { return in_target_; }
  float* input_x0() { return in_x0_; }
  SampleLoss* input_samples() { return in_samples_; }

  // Forward of the micro-batch in the inputs; output() is [B, out_channels, H, W].
  void Forward();
  const float* output() const { return out_; }
  // Forward, the loss (into loss(), a device scalar) and backward, adding grad_scale times
  // the loss's gradients into the gradients. With use_graph, the first call runs eagerly,
  // the next is captured as a CUDA graph and later calls replay it (a new grad_scale, or the
  // first call after ZeroGradients, captures once more).
  void ForwardBackward(float grad_scale = 1.0f);
  const float* loss() const { return loss_; }
  // The loss of the last ForwardBackward (synchronises).
  float last_loss() const;
  // The gradients are zero from here: the next ForwardBackward writes them instead of adding
  // (its weight-gradient GEMMs with β = 0, and one kernel zeroing the rest, the biases and the
  // label table, before it), so no pass over the whole arena zeroes it first. Anything that
  // reads the gradients before that (gradients(), DownloadGradients, OptimizerStep) sees
  // zeros.
  void ZeroGradients() { overwrite_pending_ = true; }
  // Global gradient norm, clipping (config.grad_clip), AdamW on the master weights at
  // learning rate lr as optimizer step `step` (1-based; refreshing their bf16 copy) and the
  // EMA (config.ema_decay): the CPU's update, on the device (TrainState::OptimizerStep).
  void OptimizerStep(double lr, int64_t step, const OptimizerConfig& config);
  // The squared global gradient norm of the last OptimizerStep (synchronises).
  double last_grad_norm_squared() const { return state_.last_grad_norm_squared(); }
  // What the first ForwardBackward after ZeroGradients zeroes before it runs, as (offset,
  // count) pairs over the gradient arena: every parameter outside GemmWeights, adjacent ones
  // merged (the biases, norms' and embedders' vectors, the label table), for a whole model's
  // table and its binding. Needs no GPU.
  static std::vector<uint64_t> FirstMicroBatchZeroes(const TensorTable& table, const DiTParams& p);
  // What the GEMMs' autotuning found (right after the first step: one step's calls).
  GemmTuning gemm_tuning() const { return gemm_.Tuning(); }
  // With Options::fp8: the layers' scaling state (their scales, for tests), and how many
  // products ran in bf16 for want of a cuBLASLt FP8 algorithm (counted as calls are made, so a
  // replayed graph adds none); else null and 0.
  Fp8Linears* fp8() { return fp8_.get(); }
  int fp8_bf16_fallbacks() const { return fp8_ != nullptr ? fp8_->bf16_fallbacks() : 0; }
  // Where the optimizer step updates the EMA (TrainState::set_ema_stream).
  void set_ema_stream(bool on) { state_.set_ema_stream(on); }
  bool ema_stream() const { return state_.ema_stream(); }

  cudaStream_t stream() const { return stream_; }

  // For tests: fills the activation arena with NaN, so that an element some kernel should
  // have written and did not shows up in the outputs and gradients.
  void PoisonActivations();

 private:
  // Which kernels the spatial (within a frame) and temporal (across frames) attention run:
  // options.attention, where it takes the shapes.
  struct AttentionChoice {
    AttentionKernels spatial, temporal;
    FlashVariant flash;  // flash: the variant (Options::flash)
  };
  static AttentionChoice ChooseAttention(const DiTConfig& config, const Options& options);
  // Binds every activation pointer of `acts` into an arena at `base` (null: only counts);
  // returns the bytes the arena needs. One list serves both, so layout and binding cannot
  // disagree, and ActivationBytes counts what Reserve allocates.
  static size_t BindActivations(const DiTConfig& config, AttentionChoice attention, bool fp8,
                                unsigned char* base, int B, DiTActivations& acts);
  // A block's forward from its first norm's output (which the block before, or Forward for
  // block 0, computes) to the next layer's first norm, fused with the gated residual before it.
  void BlockForward(int l);
  // Back from the gradient of a block's output branch (its fc2's output, which NormBackward(l +
  // 1) computes) to that of its input, ending with NormBackward(l).
  void BlockBackward(int l);
  // Layer l's first LayerNorm-modulate (layer depth is the final layer): its stream, output,
  // statistics and adaLN slices.
  struct NormSite {
    float* x;
    bf16* h;
    float *mean, *rstd;
    Modulation mod;
  };
  NormSite FirstNorm(int l);
  // Layer l's adaLN GEMM from SiLU(c), and its backward from the layer's adaLN gradient
  // (DAda(l), complete once NormBackward(l) has run) into d_silu_c_.
  void AdaLNForward(int l);
  void AdaLNBackward(int l);
  // The backward of layer l's first norm from its output's gradient (in d_a_) and, for l > 0,
  // of block l − 1's MLP gated residual before it (whose fc2 output gradient it leaves in d_a_);
  // then layer l's adaLN backward.
  void NormBackward(int l);
  // Layer l's adaLN gradient: blocks alternate between two buffers, since block l − 1's gate
  // gradient starts before block l's adaLN backward has run.
  float* DAda(int l) { return l == config_.depth ? d_ada_f_ : d_ada_[l % 2]; }
  // Block l's attention, spatial or temporal (model/dit/cuda/dit_attention.cc): from k.qkv to
  // k.attn, and back from d_b_ to d_qkv_, there also adding qkv's bias gradient to dqkv_bias where
  // the kernels make it as they go (returns whether they did).
  void BlockAttentionForward(int l);
  bool BlockAttentionBackward(int l, float* dqkv_bias);
  // What the attention kernels need made before a micro-batch of B runs: kCudnn's plans and
  // workspace (cuDNN's errors: none installed, no plan, out of memory).
  Status PrepareAttention(int B);
  // Self-attention over B sequences of T tokens (packed qkv) with `kernels`; the workspace is
  // attn_workspace_.
  void AttentionForward(AttentionKernels kernels, bf16* out, float* lse, const bf16* qkv, int B,
                        int T);
  // Where dqkv_bias is non-null and the kernels make dqkv's column sums as they go (flash with
  // stored scores), also adds those to it (qkv's bias gradient); returns whether it did.
  bool AttentionBackward(AttentionKernels kernels, bf16* dqkv, const bf16* dout, const bf16* qkv,
                         const bf16* out, const float* lse, int B, int T, float* dqkv_bias);
  // Floats of attention workspace `kernels` take over B sequences of T tokens (for flash, of
  // its variant: the stored score gradients where they pay, the short kernels' column sums).
  static size_t AttentionWorkspace(const DiTConfig& config, AttentionKernels kernels,
                                   const FlashVariant& flash, int B, int T);
  void Loss();
  void Backward();

  const float* Master(size_t offset) const { return state_.master() + offset; }
  const bf16* W(size_t offset) const { return state_.weights() + offset; }
  float* G(size_t offset) { return state_.gradients() + offset; }
  // The offsets of the Linear weights whose gradient Backward writes whole with one GEMM (all
  // of them): with overwrite_ their GEMMs write (β = 0) rather than add.
  static std::vector<size_t> GemmWeights(const DiTParams& p);
  void WeightGradient(size_t w, const bf16* dout, const bf16* in, int N, int I, int O) {
    gemm_.BackwardWeight(G(w), dout, in, N, I, O, /*accumulate=*/!overwrite_);
  }
  // A block's Linear layers (model/dit/cuda/dit_linear.cc), in bf16 or, with Options::fp8, in
  // FP8: out = epilogue(in · wᵀ + b) with the weight at offset w and the bias at b; and back,
  // dw (+)= doutᵀ · in, din = dout · w (× gelu'(gelu_pre) where given; with dbias, din's column
  // sums added to it: fc1's bias gradient from fc2's backward).
  enum BlockLinear { kQkv = 0, kProj = 1, kFc1 = 2, kFc2 = 3 };
  static constexpr int kBlockLinears = 4;
  void LinearForward(int l, BlockLinear which, bf16* out, const bf16* in, size_t w, size_t b, int N,
                     int I, int O, Epilogue epilogue, bf16* aux = nullptr);
  void LinearBackward(int l, BlockLinear which, size_t w, bf16* din, const bf16* dout,
                      const bf16* in, int N, int I, int O, const bf16* gelu_pre = nullptr,
                      float* dbias = nullptr);
  // What Options::fp8 needs of a micro-batch of B: the error naming the size that is not a
  // multiple of 16, else OK (also OK without fp8).
  static Status Fp8TakesMicroBatch(const DiTConfig& config, int B, const Options& options);
  // The FP8 layers' input widths, kBlockLinears a block, and their workspace's bytes (0
  // without fp8).
  static std::vector<int> Fp8InFeatures(const DiTConfig& config);
  static size_t Fp8WorkspaceBytes(const DiTConfig& config, bool fp8, int B);
  void BindFp8();
  // Zeroes the gradients a pending ZeroGradients promised, where ForwardBackward will not.
  void MaterializeZeroGradients();

  DiTConfig config_;
  cudaStream_t stream_;
  Options options_;
  TensorTable table_;
  DiTParams p_;  // offsets of the parameters in every arena (the CPU model's binding)
  Gemm gemm_;
  TrainState state_;  // after gemm_: its one-double norm buffer is allocated here, as before
  DeviceBuffer<float> pos_embed_;
  DeviceBuffer<float> temp_embed_;  // Latte's, frame f's row for each of its tokens [F, T, D]

  int batch_ = 0;
  DeviceBuffer<unsigned char> acts_buffer_;  // the activations (DiTActivations point into it)
  // The kernels of the spatial (within a frame) and temporal (across frames) attention: gemm,
  // fused or flash.
  AttentionKernels spatial_attention_ = AttentionKernels::kFused;
  AttentionKernels temporal_attention_ = AttentionKernels::kFused;
  // kCudnn's plans and workspace (made by Reserve), else null.
  std::unique_ptr<CudnnAttention> cudnn_;
  // Options::fp8's layers (4 a block) and their scaling state, else null.
  std::unique_ptr<Fp8Linears> fp8_;

  StepGraph graph_;
  float grad_scale_ = 1.0f;         // the loss's, as the graph holds it
  bool overwrite_pending_ = false;  // ZeroGradients was called, no ForwardBackward since
  bool overwrite_ = false;          // this ForwardBackward writes the gradients
  // The parameters outside GemmWeights(), merged: (offset, count) pairs, on the device (a few
  // KiB, not counted in device_bytes()).
  DeviceBuffer<uint64_t> zero_ranges_;
  int zero_range_count_ = 0;
  size_t longest_zero_range_ = 0;
};

}  // namespace difftrain::cuda
