// Fused multi-head self-attention on the GPU, flash-attention style: softmax(Q·Kᵀ/√hd)·V
// computed tile by tile in on-chip memory, never materialising the [T, T] probabilities.
// model/cpu/attention.h is the reference (its Tq = Tk case) and fixes the layout:
//   qkv [B, T, 3·D] bf16 holds q, k, v one after another, each split into H heads of
//   hd = D/H (head h at columns h·hd … h·hd+hd−1); out [B, T, D] bf16, heads side by side.
// Head dims: every multiple of 8 up to 128 (DiT-S: 64, DiT-XL: 72).
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// Writes out and the row log-sum-exp lse [B, H, T] (fp32, natural log, of the scaled scores)
// that backward needs.
void AttentionForward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                      cudaStream_t stream);

// Shared memory per block the attention kernels need at head dimension hd (backward takes
// the most): 88.5 KiB up to hd 64, 96.5 KiB to 80, 120.5 KiB beyond, which is more than
// sm_86/sm_89 GPUs allow.
size_t AttentionSharedBytes(int hd);

// Floats of the workspace AttentionBackward takes: delta = rowsum(dout ∘ out) [B, H, T], then
// the fp32 dq accumulator [B, T, D]. Nothing in it needs initialising.
size_t AttentionBackwardWorkspace(int B, int T, int D, int H);

// dqkv [B, T, 3·D] = the gradients of q, k and v (written, not added) from dout [B, T, D],
// given the forward's qkv, out and lse.
void AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                       const float* lse, float* workspace, int B, int T, int D, int H,
                       cudaStream_t stream);

}  // namespace difftrain::cuda
