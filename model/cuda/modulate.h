// DiT's adaLN-Zero elementwise ops on the GPU (model/cpu/modulate.h and layernorm.h are the
// CPU references). The residual stream x is fp32 [B, T, D]; the adaLN output `ada` is fp32
// [B, k·D] (k = 6 in a block, 2 in the final layer) and shift, scale and gate are its
// slices: sample b's shift is ada[b·stride + shift_offset …], and so on.
//
//   LayerNormModulate:  out = LN(x) · (1 + scale[b]) + shift[b]    (LN without affine,
//                       eps 1e-6; out bf16, the next GEMM's input; mean and rstd [B·T] fp32)
//   GatedResidual:      out = x + gate[b] · y                      (y bf16, a GEMM output)
#pragma once

#include "model/cuda/common.h"

namespace difftrain::cuda {

void LayerNormModulateForward(bf16* out, float* mean, float* rstd, const float* x, const float* ada,
                              int shift_offset, int scale_offset, int stride, int B, int T, int D,
                              cudaStream_t stream);

// dx += LN-and-modulate's input gradient; d_ada's shift and scale slices += their gradients
// (summed over the T tokens of each sample).
void LayerNormModulateBackward(float* dx, float* d_ada, const bf16* dout, const float* x,
                               const float* mean, const float* rstd, const float* ada,
                               int shift_offset, int scale_offset, int stride, int B, int T, int D,
                               cudaStream_t stream);

// out may be x (in place).
void GatedResidualForward(float* out, const float* x, const bf16* y, const float* ada,
                          int gate_offset, int stride, int B, int T, int D, cudaStream_t stream);

// dy = gate[b] · dout (written, bf16: the input of the GEMMs' backward); d_ada's gate slice
// += Σ_t dout · y. The residual stream's own gradient is dout itself, left where it is.
void GatedResidualBackward(bf16* dy, float* d_ada, const float* dout, const bf16* y,
                           const float* ada, int gate_offset, int stride, int B, int T, int D,
                           cudaStream_t stream);

}  // namespace difftrain::cuda
