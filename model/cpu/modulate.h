// The two adaLN-Zero elementwise ops. x, y, out are [B, T, D]; shift, scale and gate are
// per-sample vectors [B, D] that live inside the adaLN output [B, k·D], so consecutive
// samples are `stride` elements apart (stride = 6·D in a block, 2·D in the final layer).
//
//   Modulate:       out = x · (1 + scale[b]) + shift[b]
//   GatedResidual:  out = x + gate[b] · y
//
// Backward adds into every gradient it is given; every gradient pointer is required, except
// `dx` of GatedResidualBackward, which may be null: the residual stream's gradient then
// stays where it is (dx is dout) and only dy and dgate are produced.
#pragma once

namespace difftrain::cpu {

template <typename T>
void ModulateForward(T* out, const T* x, const T* shift, const T* scale, int stride, int B, int T_,
                     int D);
template <typename T>
void ModulateBackward(T* dx, T* dshift, T* dscale, const T* dout, const T* x, const T* scale,
                      int stride, int B, int T_, int D);

template <typename T>
void GatedResidualForward(T* out, const T* x, const T* y, const T* gate, int stride, int B, int T_,
                          int D);
template <typename T>
void GatedResidualBackward(T* dx, T* dy, T* dgate, const T* dout, const T* y, const T* gate,
                           int stride, int B, int T_, int D);

}  // namespace difftrain::cpu
