// DiT's adaLN-Zero elementwise ops on the GPU (model/cpu/modulate.h and layernorm.h are the CPU
// references). The residual stream x is fp32 [B, T, D]; the adaLN output `ada` is fp32
// [B, k·D] (k = 6 in a block, 2 in the final layer) and shift, scale and gate are its slices:
// sample b's shift is ada[b·stride + shift_offset …], and so on.
//
// Between two GEMMs a DiT block does a gated residual, which ends one branch, and then a
// LayerNorm-modulate, which starts the next:
//
//   x' = x + gate[b] · y  (+ add[t])                (y bf16, a GEMM output; add: Latte's
//                                                     temporal embedding [T, D])
//   h  = LN(x') · (1 + scale[b]) + shift[b]         (LN without affine, eps 1e-6; h bf16, the
//                                                     next GEMM's input; mean and rstd [B·T])
//
// GatedResidualNorm does both in one pass over the stream, forward and backward (one kernel
// body for the GPU and the CPU emulator: model/cuda/adaln_kernels.h). The branch is optional:
// without it (block 0's first norm) the op is the LayerNorm-modulate alone.
#pragma once

#include <cstddef>

#include "model/cuda/adaln_kernels.h"
#include "model/cuda/common.h"

namespace difftrain::cuda {

// The shift and scale a LayerNorm-modulate reads.
struct Modulation {
  const float* ada;
  int stride, shift_offset, scale_offset;
};

// The gated residual that produced the LayerNorm's input; y null for none.
struct GatedBranch {
  const bf16* y = nullptr;
  const float* ada = nullptr;
  int stride = 0, gate_offset = 0;
};

// x_out = x' (may be x; null when there is neither a branch nor add, x' then being x), h, mean
// and rstd as above. add is null or [T, D].
void GatedResidualNormForward(float* x_out, bf16* h, float* mean, float* rstd, const float* x,
                              const GatedBranch& branch, const float* add, const Modulation& mod,
                              int B, int T, int D, cudaStream_t stream,
                              int rows_per_block = adaln::kForwardRowsPerBlock);

// The widest rows the ops take: D at most this (D a multiple of 4 and the rows 16-byte
// aligned; else a quarter of it).
int GatedResidualNormMaxWidth();

// The backward's workspace, in floats.
size_t GatedResidualNormWorkspace(int B, int T, int D,
                                  int rows_per_block = adaln::kBackwardRowsPerBlock);

// Given dh, the gradient of h, and dx, the residual stream's gradient from above:
//   dx += LayerNorm-and-modulate's input gradient (dx is then the gradient of x', and of x);
//   d_mod_ada's shift and scale slices += their gradients (sums over each sample's T tokens).
// With a branch, also:
//   dy = bf16(gate[b] · dx), the branch output's gradient (written; dy may be dh);
//   d_gate_ada's gate slice += Σ_t dx · y;  d_bias (D) += Σ_{b,t} dy, the gradient of the bias
//   of the GEMM that produced y (null: not wanted).
// x, mean and rstd are the forward's x', mean and rstd.
//
// rows_per_block: the token rows a block works through (the forward 16 by default, the backward
// and its workspace 32: the fastest on an H100; bench_cuda_norms times others). Fewer make more,
// shorter blocks and, in the backward, more partial sums to add.
void GatedResidualNormBackward(float* dx, float* d_mod_ada, bf16* dy, float* d_gate_ada,
                               float* d_bias, const bf16* dh, const float* x, const float* mean,
                               const float* rstd, const Modulation& mod, const GatedBranch& branch,
                               float* workspace, int B, int T, int D, cudaStream_t stream,
                               int rows_per_block = adaln::kBackwardRowsPerBlock);

}  // namespace difftrain::cuda
