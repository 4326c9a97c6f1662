// Flash attention on mma.sync tensor cores (sm_80 and later): the kernels of
// model/cuda/flash_kernels.h, the scores and probabilities kept in registers, a deterministic
// backward (no atomics). Same layout and results as model/cuda/attention.h's fused kernels —
// q [B, Tq, ·], k and v [B, Tk, ·] bf16 at their own row strides, out [B, Tq, D], lse [B, H, Tq]
// (natural log) — for head dims that are multiples of 8 up to 128 (every DiT and Latte; the
// SD UNet's 160 stays on the fused kernels). Checked on the CPU emulator in every test run
// (model/simt/flash_attention_test.cc) and against the CPU reference on a GPU
// (attention_test.cc).
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// Whether the flash kernels take head dim hd.
bool FlashAttentionTakes(int hd);

// The kernels' loads of the loop's tiles: kOne, ordinary copies between barriers; kTwo,
// double-buffered cp.async copies of the next tile while the current one is computed on (the
// *Pipelined functions; the same results bit for bit). On an H100 two stages took the forward
// from 103 to 77 us and the backward from 355 to 253 us at DiT-XL/2's shapes (micro-batch 32),
// and the backward from 1.09 to 0.81 ms at Latte-L/2's temporal ones (docs/benchmarks.md).
enum class FlashStages { kOne, kTwo };

// Shared memory per block the kernels need at head dim hd (the dK/dV kernel takes the most):
// one stage, 36.5 KiB up to hd 64, 44.5 KiB to 80, 51.25 KiB to 128 (32-row inner tiles
// there); two, 55, 67 and 68.5 KiB; at least the short-sequence backward's (below), 47.5, 58
// and 89.5 KiB. Every sm_80+ GPU allows each (99 KiB at least).
size_t FlashAttentionSharedBytes(int hd, FlashStages stages = FlashStages::kOne);

// Floats of the workspace FlashAttentionBackward takes: delta [B, H, Tq].
size_t FlashAttentionBackwardWorkspace(int B, int Tq, int H);

// out and lse from q, k, v.
void FlashAttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           size_t q_stride, size_t kv_stride, int B, int Tq, int Tk, int D, int H,
                           cudaStream_t stream);
// Self-attention over a packed qkv [B, T, 3·D].
void FlashAttentionForward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                           cudaStream_t stream);

// dq, dk, dv (written, with q's and k/v's row strides) from dout [B, Tq, D], given the forward's
// operands, out and lse.
void FlashAttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                            const bf16* k, const bf16* v, size_t q_stride, size_t kv_stride,
                            const bf16* out, const float* lse, float* workspace, int B, int Tq,
                            int Tk, int D, int H, cudaStream_t stream);
// dqkv [B, T, 3·D] (written) from dout, given the forward's packed qkv, out and lse.
void FlashAttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                            const float* lse, float* workspace, int B, int T, int D, int H,
                            cudaStream_t stream);

// The packed forward with two 16-row m-tiles a warp (32 query rows a warp, kFlashWideRows a
// block), each key and value fragment read from shared memory once for both, with one or two
// stages: the same out and lse bit for bit. On an H100, with two stages, 1.09x the 16-row
// forward at 256 tokens (71 against 77 us) but 0.51x at 16 (505 against 256 us), where most of
// its block has no query; FlashWideForwardFills says where a model should take it.
inline constexpr int kFlashWideRows = 128;
constexpr bool FlashWideForwardFills(int Tq) {
  return Tq >= kFlashWideRows;
}
void FlashAttentionForwardWide(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                               FlashStages stages, cudaStream_t stream);

// The packed backward with dQ from the score gradients the dK/dV kernel stores (bf16 dSᵀ, per
// sequence and head ⌈Tk⌉₆₄ × ⌈Tq⌉₆₄ of them, in the workspace after delta) instead of
// recomputing S and dP: one tensor-core product a tile where the dQ kernel takes three, 5 in all
// as FlashAttention-2 computes, instead of 7, for a round trip of the scores' gradients through
// memory (64 MiB a layer for DiT-XL/2 at micro-batch 32). dK and dV are the other backward's bits;
// dQ comes from the same bf16 dS (checked on the CPU emulator, model/simt/flash_attention_test.cc).
// Written without a GPU: not yet timed. Where a model should take it: FlashStoredScoresPay (at
// 16 frames the tiles would be 94% padding, and the recomputation is cheap).
constexpr bool FlashStoredScoresPay(int Tq, int Tk) {
  return Tq >= kFlashWideRows && Tk >= kFlashWideRows;
}
// With dqkv_bias non-null it also adds dqkv's column sums to it (the qkv Linear's bias
// gradient, [3·D] fp32): each of the kernels' blocks sums its 64 rows of dq, or of dk and dv,
// in fp32 into the workspace, and one small reduction adds those rows up (B·⌈T/64⌉ of them),
// instead of a pass over dqkv (cuBLASLt's BGRADB kernel read it again: ~33 us a layer for
// DiT-XL/2 at micro-batch 32 on the H100).
// Floats of the workspace it takes: delta, the score gradients, the column sums' rows.
size_t FlashAttentionBackwardStoredWorkspace(int B, int T, int D, int H);
void FlashAttentionBackwardStored(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                  const float* lse, float* workspace, int B, int T, int D, int H,
                                  FlashStages stages, cudaStream_t stream,
                                  float* dqkv_bias = nullptr);

// Short sequences, at most kFlashShortRows queries and keys (Latte's temporal attention over
// 16 frames; model/cuda/flash_short_kernels.h): one warp a sequence and head, its 16 rows one
// m-tile, where the kernels above give a sequence a block of 64 or 128 query rows and tiles of 64
// keys, three quarters of them padding at 16 frames (on an H100: 256 us forward and 793 backward
// for Latte-L/2's temporal attention at micro-batch 8, against ~90 and ~180 at the memory's
// rate); and a backward of one kernel that computes delta itself, reading q, k, v, out and dout
// once (a workspace only for the bias gradient, below). The same bits as the kernels above (the CPU
// emulator's FlashShortEmulated; attention_test.cc on a GPU). Written without a GPU: not yet timed.
inline constexpr int kFlashShortRows = 16;
constexpr bool FlashShortFits(int Tq, int Tk) {
  return Tq <= kFlashShortRows && Tk <= kFlashShortRows;
}
// Self-attention over a packed qkv [B, T, 3·D], T ≤ kFlashShortRows. With dqkv_bias non-null
// the backward also adds dqkv's column sums to it (the qkv Linear's bias gradient, [3·D] fp32):
// each warp sums its sequence's rows of dq, dk and dv in fp32 into a row of 3·D in `workspace`
// (FlashAttentionBackwardShortWorkspace floats), and one reduction adds up the B rows, instead of
// a pass over dqkv (cuBLASLt's BGRADB kernel read it again).
size_t FlashAttentionBackwardShortWorkspace(int B, int D);
void FlashAttentionForwardShort(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                                cudaStream_t stream);
void FlashAttentionBackwardShort(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                 const float* lse, int B, int T, int D, int H, cudaStream_t stream,
                                 float* workspace = nullptr, float* dqkv_bias = nullptr);

// Latte's temporal attention straight from a frame-major video's packed qkv [B, F, T, 3·D]:
// each of the B·T token positions is a sequence across the F frames, without copying the
// video token-major first. out (and dout) [B, F, T, D], dqkv like qkv; lse [B·T, H, F] and the
// workspace (FlashAttentionBackwardWorkspace(B·T, F, H)) per sequence. The same kernels, with
// `stages` stages and, for `wide`, two m-tiles a warp in the forward, or, with `short_kernels`
// where F ≤ kFlashShortRows, the short-sequence kernels (which take neither option; their
// workspace, FlashAttentionBackwardShortWorkspace(B·T, D), only with dqkv_bias, whose column sums
// they alone make: add them only where FlashShortFits(F, F)): the same bits as the token-major
// copy through the functions above.
void FlashAttentionForwardAcrossFrames(bf16* out, float* lse, const bf16* qkv, int B, int F, int T,
                                       int D, int H, FlashStages stages, bool wide,
                                       cudaStream_t stream, bool short_kernels = false);
void FlashAttentionBackwardAcrossFrames(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                        const bf16* out, const float* lse, float* workspace, int B,
                                        int F, int T, int D, int H, FlashStages stages,
                                        cudaStream_t stream, bool short_kernels = false,
                                        float* dqkv_bias = nullptr);

// The same four with two stages (FlashStages::kTwo).
void FlashAttentionForwardPipelined(bf16* out, float* lse, const bf16* q, const bf16* k,
                                    const bf16* v, size_t q_stride, size_t kv_stride, int B, int Tq,
                                    int Tk, int D, int H, cudaStream_t stream);
void FlashAttentionForwardPipelined(bf16* out, float* lse, const bf16* qkv, int B, int T, int D,
                                    int H, cudaStream_t stream);
void FlashAttentionBackwardPipelined(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                                     const bf16* k, const bf16* v, size_t q_stride,
                                     size_t kv_stride, const bf16* out, const float* lse,
                                     float* workspace, int B, int Tq, int Tk, int D, int H,
                                     cudaStream_t stream);
void FlashAttentionBackwardPipelined(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                     const float* lse, float* workspace, int B, int T, int D, int H,
                                     cudaStream_t stream);

}  // namespace difftrain::cuda
