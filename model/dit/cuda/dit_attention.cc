// The attention of cuda::DiT's blocks: which kernels run where, what they take, and their calls
// (spatial within each frame, temporal across a video's frames).
#include <algorithm>

#include "model/cuda/attention.h"
#include "model/cuda/embed.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/gemm_attention.h"
#include "model/dit/cuda/dit.h"

namespace difftrain::cuda {

DiT::AttentionChoice DiT::ChooseAttention(const DiTConfig& config, const Options& options) {
  AttentionChoice choice{options.attention, AttentionKernels::kFused, {}};
  if (choice.spatial == AttentionKernels::kGemm &&
      !GemmAttentionTakes(config.tokens(), config.hidden_size, config.num_heads)) {
    choice.spatial = AttentionKernels::kFused;
  }
  if (options.attention == AttentionKernels::kFlash ||
      options.attention == AttentionKernels::kCudnn) {
    choice.temporal = AttentionKernels::kFlash;
    choice.flash = options.flash;
  }
  return choice;
}

Status DiT::TakesMicroBatch(const DiTConfig& config, int B, const Options& options) {
  DT_RETURN_IF_ERROR(Fp8TakesMicroBatch(config, B, options));
  constexpr long long kMaxSequences = 65535;  // a grid's z
  const AttentionChoice attention = ChooseAttention(config, options);
  // Whether `kernels` over sequences of T rows launch with a z of one per sequence.
  const auto by_sequence = [&](AttentionKernels kernels, int T) {
    if (kernels == AttentionKernels::kGemm || kernels == AttentionKernels::kCudnn) return false;
    return !(kernels == AttentionKernels::kFlash && options.flash.short_sequences &&
             FlashShortFits(T, T));
  };
  const long long frames = static_cast<long long>(B) * config.frames();
  if (by_sequence(attention.spatial, config.tokens()) && frames > kMaxSequences) {
    return Errorf(
        "a micro-batch of {} is {} frames, more than the {} the attention kernels take a launch", B,
        frames, kMaxSequences);
  }
  const long long tokens = static_cast<long long>(B) * config.tokens();
  if (config.video && by_sequence(attention.temporal, config.frames()) && tokens > kMaxSequences) {
    return Errorf(
        "a micro-batch of {} videos of {} tokens a frame is {} sequences across frames, more "
        "than the {} the temporal attention kernels take a launch over {} frames (the "
        "short-sequence kernels take any number over up to {} frames)",
        B, config.tokens(), tokens, kMaxSequences, config.frames(), kFlashShortRows);
  }
  return Status::Ok();
}

Status DiT::PrepareAttention(int B) {
  if (spatial_attention_ != AttentionKernels::kCudnn) return Status::Ok();
  if (cudnn_ == nullptr) cudnn_ = std::make_unique<CudnnAttention>();
  return cudnn_->Prepare(B * config_.frames(), config_.tokens(), config_.hidden_size,
                         config_.num_heads);
}

void DiT::BlockAttentionForward(int l) {
  BlockActs& k = acts_[l];
  const int B = batch_, Fr = config_.frames(), T = config_.tokens(), D = config_.hidden_size;
  if (!config_.temporal_block(l)) {
    AttentionForward(spatial_attention_, k.attn, k.lse, k.qkv, B * Fr, T);  // within each frame
  } else if (temporal_attention_ == AttentionKernels::kFlash) {
    // Across frames: B·T sequences of Fr frames, read from the frame-major qkv in place.
    FlashAttentionForwardAcrossFrames(k.attn, k.lse, k.qkv, B, Fr, T, D, config_.num_heads,
                                      options_.flash.stages,
                                      options_.flash.wide_forward && FlashWideForwardFills(Fr),
                                      stream_, options_.flash.short_sequences);
  } else {
    // Across frames: B·T sequences of Fr frames, token-major.
    SwapAxes(k.qkv_t, k.qkv, B, Fr, T, 3 * D, stream_);
    AttentionForward(temporal_attention_, k.attn_t, k.lse, k.qkv_t, B * T, Fr);
    SwapAxes(k.attn, k.attn_t, B, T, Fr, D, stream_);
  }
}

bool DiT::BlockAttentionBackward(int l, float* dqkv_bias) {
  BlockActs& k = acts_[l];
  const int B = batch_, Fr = config_.frames(), T = config_.tokens(), D = config_.hidden_size;
  if (!config_.temporal_block(l)) {
    return AttentionBackward(spatial_attention_, d_qkv_, d_b_, k.qkv, k.attn, k.lse, B * Fr, T,
                             dqkv_bias);
  }
  if (temporal_attention_ == AttentionKernels::kFlash) {
    // Only the short-sequence kernels make qkv's bias gradient across frames.
    const bool sums = options_.flash.short_sequences && FlashShortFits(Fr, Fr) && dqkv_bias;
    FlashAttentionBackwardAcrossFrames(d_qkv_, d_b_, k.qkv, k.attn, k.lse, attn_workspace_, B, Fr,
                                       T, D, config_.num_heads, options_.flash.stages, stream_,
                                       options_.flash.short_sequences, sums ? dqkv_bias : nullptr);
    return sums;
  }
  SwapAxes(d_attn_t_, d_b_, B, Fr, T, D, stream_);
  AttentionBackward(temporal_attention_, d_qkv_t_, d_attn_t_, k.qkv_t, k.attn_t, k.lse, B * T, Fr,
                    nullptr);
  SwapAxes(d_qkv_, d_qkv_t_, B, T, Fr, 3 * D, stream_);
  return false;
}

void DiT::AttentionForward(AttentionKernels kernels, bf16* out, float* lse, const bf16* qkv, int B,
                           int T) {
  const int D = config_.hidden_size, H = config_.num_heads;
  switch (kernels) {
    case AttentionKernels::kGemm:
      return GemmAttentionForward(gemm_, out, lse, qkv, attn_workspace_, B, T, D, H);
    case AttentionKernels::kFused:
      return cuda::AttentionForward(out, lse, qkv, B, T, D, H, stream_);
    case AttentionKernels::kCudnn:
      return cudnn_->Forward(out, lse, qkv, B, T, D, H, stream_);
    case AttentionKernels::kFlash: {
      const FlashVariant& v = options_.flash;
      if (v.short_sequences && FlashShortFits(T, T)) {
        return FlashAttentionForwardShort(out, lse, qkv, B, T, D, H, stream_);
      }
      if (v.wide_forward && FlashWideForwardFills(T)) {
        return FlashAttentionForwardWide(out, lse, qkv, B, T, D, H, v.stages, stream_);
      }
      if (v.stages == FlashStages::kTwo) {
        return FlashAttentionForwardPipelined(out, lse, qkv, B, T, D, H, stream_);
      }
      return FlashAttentionForward(out, lse, qkv, B, T, D, H, stream_);
    }
  }
}

bool DiT::AttentionBackward(AttentionKernels kernels, bf16* dqkv, const bf16* dout, const bf16* qkv,
                            const bf16* out, const float* lse, int B, int T, float* dqkv_bias) {
  const int D = config_.hidden_size, H = config_.num_heads;
  switch (kernels) {
    case AttentionKernels::kGemm:
      GemmAttentionBackward(gemm_, dqkv, dout, qkv, out, lse, attn_workspace_, B, T, D, H);
      return false;
    case AttentionKernels::kFused:
      cuda::AttentionBackward(dqkv, dout, qkv, out, lse, attn_workspace_, B, T, D, H, stream_);
      return false;
    case AttentionKernels::kCudnn:
      cudnn_->Backward(dqkv, dout, qkv, out, lse, B, T, D, H, stream_);
      return false;
    case AttentionKernels::kFlash:
      if (options_.flash.short_sequences && FlashShortFits(T, T)) {
        FlashAttentionBackwardShort(dqkv, dout, qkv, out, lse, B, T, D, H, stream_, attn_workspace_,
                                    dqkv_bias);
        return dqkv_bias != nullptr;
      }
      if (options_.flash.stored_scores && FlashStoredScoresPay(T, T)) {
        FlashAttentionBackwardStored(dqkv, dout, qkv, out, lse, attn_workspace_, B, T, D, H,
                                     options_.flash.stages, stream_, dqkv_bias);
        return dqkv_bias != nullptr;
      }
      if (options_.flash.stages == FlashStages::kTwo) {
        FlashAttentionBackwardPipelined(dqkv, dout, qkv, out, lse, attn_workspace_, B, T, D, H,
                                        stream_);
      } else {
        FlashAttentionBackward(dqkv, dout, qkv, out, lse, attn_workspace_, B, T, D, H, stream_);
      }
      return false;
  }
  return false;
}

size_t DiT::AttentionWorkspace(const DiTConfig& config, AttentionKernels kernels,
                               const FlashVariant& flash, int B, int T) {
  const int D = config.hidden_size, H = config.num_heads;
  switch (kernels) {
    case AttentionKernels::kGemm:
      return (GemmAttentionWorkspaceBytes(B, T, D, H) + 3) / 4;
    case AttentionKernels::kFused:
      return AttentionBackwardWorkspace(B, T, D, H);
    case AttentionKernels::kCudnn:
      return 0;  // cuDNN's own (CudnnAttention::workspace_bytes)
    case AttentionKernels::kFlash:
      if (flash.short_sequences && FlashShortFits(T, T)) {
        return FlashAttentionBackwardShortWorkspace(B, D);  // the qkv bias's column sums
      }
      return flash.stored_scores && FlashStoredScoresPay(T, T)
                 ? FlashAttentionBackwardStoredWorkspace(B, T, D, H)
                 : FlashAttentionBackwardWorkspace(B, T, H);
  }
  return 0;
}

}  // namespace difftrain::cuda
