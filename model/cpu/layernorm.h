// LayerNorm without affine parameters over the last dimension C (DiT's norm1, norm2 and
// final norm, eps 1e-6):  out = (in − mean) · rstd,  rstd = 1 / sqrt(var + eps).
//
// Forward writes out, and the per-row mean and rstd that backward needs.
// Backward adds into din.
#pragma once

namespace difftrain::cpu {

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* in, int N, int C, T eps);

template <typename T>
void LayerNormBackward(T* din, const T* dout, const T* in, const T* mean, const T* rstd, int N,
                       int C);

}  // namespace difftrain::cpu
