// Fused multi-head attention on the GPU, flash-attention style: softmax(Q·Kᵀ/√hd)·V computed
// tile by tile in on-chip memory, never materialising the [Tq, Tk] probabilities.
// model/cpu/attention.h is the reference and fixes the layout: q [B, Tq, ·], k and v
// [B, Tk, ·] bf16, row-major with their own row strides (multiples of 8), each split into H
// heads of hd = D/H (head h at columns h·hd … h·hd+hd−1); out [B, Tq, D] bf16, heads side by
// side. Self-attention (DiT's) reads one packed qkv [B, T, 3·D] (q, k, v one after another);
// cross-attention (the UNet's attn2) reads q [B, Tq, D] and the text's kv [B, Tk, 2·D], Tq ≠ Tk.
// Head dims: every multiple of 8 up to 160 (DiT-S: 64, DiT-XL: 72, SD 1.5's deepest: 160).
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

inline constexpr int kMaxAttentionHeadDim = 160;

// Checks what every attention kernel requires, failing fast with the offending value: positive
// sizes, D divisible by H, a head dim that is a multiple of 8 up to max_head_dim, q, k and v
// 16-byte aligned and row strides that are multiples of 8 elements.
void CheckAttentionShape(const bf16* q, const bf16* k, const bf16* v, size_t q_stride,
                         size_t kv_stride, int B, int Tq, int Tk, int D, int H, int max_head_dim);

// Writes out and the row log-sum-exp lse [B, H, T] (fp32, natural log, of the scaled scores)
// that backward needs.
void AttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                      size_t q_stride, size_t kv_stride, int B, int Tq, int Tk, int D, int H,
                      cudaStream_t stream);
// Self-attention over a packed qkv [B, T, 3·D] (lse [B, H, T]).
void AttentionForward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                      cudaStream_t stream);

// Shared memory per block the attention kernels need at head dimension hd (backward takes
// the most): 88.5 KiB up to hd 64, 96.5 KiB to 80, 120.5 KiB to 128, which is more than
// sm_86/sm_89 GPUs allow, and 136.5 KiB to 160 (A100, H100 and H20 have room).
size_t AttentionSharedBytes(int hd);

// Floats of the workspace AttentionBackward takes: delta = rowsum(dout ∘ out) [B, H, Tq], then
// the fp32 dq accumulator [B, Tq, D]. Nothing in it needs initialising.
size_t AttentionBackwardWorkspace(int B, int Tq, int D, int H);

// dq, dk, dv (written, not added; with q's and k/v's row strides) from dout [B, Tq, D], given the
// forward's operands, out and lse.
void AttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                       const bf16* v, size_t q_stride, size_t kv_stride, const bf16* out,
                       const float* lse, float* workspace, int B, int Tq, int Tk, int D, int H,
                       cudaStream_t stream);
// dqkv [B, T, 3·D] = the gradients of q, k and v (written, not added) from dout [B, T, D],
// given the forward's packed qkv, out and lse.
void AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                       const float* lse, float* workspace, int B, int T, int D, int H,
                       cudaStream_t stream);

// delta [B, H, T] = the row sums of dout ∘ out over each head (fp32): the softmax backward's
// correction, Σ_k P·dP = Σ_d dO·O. dout and out are [B, T, D], 16-byte aligned, with head dims
// D/H that are multiples of 8 (model/cuda/flash_kernels.h's Delta: 16-byte loads; the flash
// and batched-GEMM backwards use it).
void AttentionDelta(float* delta, const bf16* dout, const bf16* out, int B, int T, int D, int H,
                    cudaStream_t stream);

}  // namespace difftrain::cuda
