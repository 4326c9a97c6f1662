// GroupNorm with affine weights over NCHW (PyTorch's nn.GroupNorm): the C channels of a
// sample fall into G groups of C/G consecutive channels; each group is normalised over its
// (C/G)·H·W values, then every channel is scaled and shifted by its own weight and bias:
//   x̂ = (x − mean_g) · rstd_g,  rstd_g = 1 / sqrt(var_g + eps),  out = x̂ · weight[c] + bias[c].
// A group is contiguous in NCHW, so it is LayerNorm over rows of (C/G)·H·W values followed by
// the per-channel affine map (model/cpu/layernorm.h, model/cpu/affine.h).
//
// Forward writes out, x̂ [B, C, HW] and the per-group mean and rstd [B·G] that backward needs.
// Backward adds into din, dweight and dbias; dxhat is scratch of B·C·HW values.
#pragma once

namespace difftrain::cpu {

struct GroupNormShape {
  int B, C, HW, G;
};

template <typename T>
void GroupNormForward(T* out, T* xhat, T* mean, T* rstd, const T* in, const T* weight,
                      const T* bias, const GroupNormShape& s, T eps);

template <typename T>
void GroupNormBackward(T* din, T* dweight, T* dbias, T* dxhat, const T* dout, const T* in,
                       const T* xhat, const T* mean, const T* rstd, const T* weight,
                       const GroupNormShape& s);

}  // namespace difftrain::cpu
