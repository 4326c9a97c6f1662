// GEGLU, the Stable Diffusion UNet's feed-forward activation, on the GPU (model/cpu/activation.h
// is the reference): rows of in [N, 2F] hold (x, gate) side by side (ff.net.0.proj's output);
// out [N, F] = x · GELU(gate) with the exact GELU, g/2 · (1 + erf(g/√2)) — not the tanh
// approximation of DiT's MLP (model/cuda/activation.h). bf16 in and out (GEMM output and
// input), fp32 arithmetic.
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

void GegluForward(bf16* out, const bf16* in, size_t N, size_t F, cudaStream_t stream);

// din [N, 2F] = the gradients of x and gate (written, not added) from dout [N, F].
void GegluBackward(bf16* din, const bf16* dout, const bf16* in, size_t N, size_t F,
                   cudaStream_t stream);

}  // namespace difftrain::cuda
