// Per-channel affine map, the elementwise weight and bias of LayerNorm and GroupNorm:
//   out[o, c, i] = in[o, c, i] · weight[c] + bias[c]
// over a tensor [outer, C, inner]: LayerNorm's affine is outer = rows, inner = 1; GroupNorm's
// over NCHW is outer = B, inner = H·W.
//
// Backward adds into din, dweight and dbias (`+=`).
#pragma once

namespace difftrain::cpu {

template <typename T>
void ChannelAffineForward(T* out, const T* in, const T* weight, const T* bias, int outer, int C,
                          int inner);

template <typename T>
void ChannelAffineBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in,
                           const T* weight, int outer, int C, int inner);

}  // namespace difftrain::cpu
