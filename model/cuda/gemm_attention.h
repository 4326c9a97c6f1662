// Self-attention through cuBLASLt's batched GEMMs, for short sequences (DiT's 256 tokens): the
// [T, T] scores of every head are written to a workspace, so each product runs on cuBLASLt's
// tensor-core kernels and only the softmax and the layout changes are our kernels. The fused
// kernels of model/cuda/attention.h never materialise the scores and take any length; at
// T = 256 they spend a fifth of a DiT-XL/2 step in their backward alone (docs/benchmarks.md),
// where these GEMMs move T² scores through memory a few times instead.
//
// Same layout and results as the fused self-attention: qkv [B, T, 3·D] packed, out [B, T, D],
// lse [B, H, T] (natural log of the scaled scores' exponential sums), dqkv [B, T, 3·D] written.
// The two paths share lse's layout but not its values' rounding, so a step uses one path for
// both directions.
#pragma once

#include <cstddef>

#include "model/cuda/common.h"
#include "model/cuda/gemm.h"

namespace difftrain::cuda {

// Longest sequence the GEMM path is used for: the workspace grows with T² (12 bytes per score),
// 0.4 GB for DiT-XL/2's 32 × 16 heads of 256 tokens, 1.6 GB at 512.
inline constexpr int kMaxGemmAttentionTokens = 512;

// Whether the GEMM path takes self-attention over T tokens of D = H·hd: T and hd multiples of 8
// (16-byte rows for cuBLASLt), T up to kMaxGemmAttentionTokens.
bool GemmAttentionTakes(int T, int D, int H);

// Bytes of the workspace both directions take, for B sequences (backward needs the most).
size_t GemmAttentionWorkspaceBytes(int B, int T, int D, int H);

// out [B, T, D] and lse [B, H, T] from qkv [B, T, 3·D], on gemm's stream.
void GemmAttentionForward(Gemm& gemm, bf16* out, float* lse, const bf16* qkv, void* workspace,
                          int B, int T, int D, int H);

// dqkv [B, T, 3·D] (written) from dout [B, T, D], given the forward's qkv, out and lse.
void GemmAttentionBackward(Gemm& gemm, bf16* dqkv, const bf16* dout, const bf16* qkv,
                           const bf16* out, const float* lse, void* workspace, int B, int T, int D,
                           int H);

}  // namespace difftrain::cuda
