// Nearest-neighbour ×2 upsampling of NCHW planes (F.interpolate(scale_factor=2, mode="nearest")):
//   out[p, 2i + a, 2j + d] = in[p, i, j]  for a, d ∈ {0, 1}, over P = B·C planes of H × W.
// Backward adds each 2 × 2 block of dout into the pixel it came from (`+=`).
#pragma once

namespace difftrain::cpu {

template <typename T>
void Upsample2xForward(T* out, const T* in, int P, int H, int W);

template <typename T>
void Upsample2xBackward(T* din, const T* dout, int P, int H, int W);

}  // namespace difftrain::cpu
