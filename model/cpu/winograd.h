// A 3×3 convolution of stride 1 and padding 1 (Conv2dShape K = 3, S = 1, P = 1) by Winograd's
// minimal filtering F(2×2, 3×3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural
// Networks"), for inference: each 2×2 block of outputs ("tile") is
//   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d Bᵀᵀ)] A
// with d the tile's 4×4 input patch and g the 3×3 kernel, so the C·9 multiply-adds an output
// costs become 16 per tile, 4 an output: the channel sums are 16 GEMMs, one per position ξ of
// the 4×4 transform, weight U_ξ [Co, C] times input V_ξ [C, tiles], on OpenBLAS; the transforms
// (adds and halvings) run in the element type, the samples' tile rows in passes that keep the
// transformed operands near the caches. 2.25 times fewer multiplies than im2col's
// GEMM; Stable Diffusion's VAE decoder at 256 px spends most of its time in such convolutions
// (docs/benchmarks.md). Equal to Conv2dForward up to rounding (the transforms' few extra adds:
// fp32 results within ~1e-6 of each other, relative), not bit for bit, so training, whose
// recomputation and tests need the im2col bits, keeps Conv2dForward.
#pragma once

#include "model/cpu/conv2d.h"

namespace difftrain::cpu {

// Whether Conv2dForwardWinograd takes shape s (K 3, S 1, P 1).
inline bool WinogradTakes(const Conv2dShape& s) {
  return s.K == 3 && s.S == 1 && s.P == 1;
}

// out [B, Co, H, W] of in [B, C, H, W], weight [Co, C, 3, 3], bias [Co] (or null).
template <typename T>
void Conv2dForwardWinograd(T* out, const T* in, const T* weight, const T* bias,
                           const Conv2dShape& s);

}  // namespace difftrain::cpu
