// GroupNorm with affine weights on the GPU, optionally fused with the SiLU that follows it in
// every ResnetBlock2D and before conv_out (model/cpu/groupnorm.h and activation.h are the
// references): over x [B, C, HW] fp32 in groups of C/G consecutive channels,
//   x̂ = (x − mean_g) · rstd_g,  y = x̂ · weight[c] + bias[c],  out = silu ? SiLU(y) : y.
// The transformer's LayerNorms (affine, over the C features of each token) are the same op
// with B = tokens, HW = 1 and G = 1, as on the CPU.
//
// Forward writes out (fp32, or bf16 where a GEMM reads it) and mean, rstd [B·G]; x̂ and y are
// not kept: backward recomputes them from x and the statistics. Statistics in fp32, each
// group's mean first and then its variance about it (two passes: no cancellation).
// Backward adds into din, dweight and dbias; dout is the gradient of `out` (after the SiLU
// when fused), fp32 or bf16 (a GEMM's input gradient). One block per group; the weight and
// bias gradients go through a [B, C] workspace and a column sum, so they are deterministic.
#pragma once

#include <cstddef>

#include "model/cpu/groupnorm.h"
#include "model/cuda/common.h"

namespace difftrain::cuda {

template <typename Out>
void GroupNormForward(Out* out, float* mean, float* rstd, const float* x, const float* weight,
                      const float* bias, const cpu::GroupNormShape& s, float eps, bool silu,
                      cudaStream_t stream);

// Floats of the workspace GroupNormBackward takes: 2·B·C.
size_t GroupNormBackwardWorkspace(const cpu::GroupNormShape& s);

template <typename Dout>
void GroupNormBackward(float* din, float* dweight, float* dbias, const Dout* dout, const float* x,
                       const float* mean, const float* rstd, const float* weight, const float* bias,
                       const cpu::GroupNormShape& s, bool silu, float* workspace,
                       cudaStream_t stream);

}  // namespace difftrain::cuda
