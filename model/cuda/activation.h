// Small elementwise and reduction ops on the GPU (model/cpu/activation.h is the reference).
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// out = silu(in): fp32 in (the conditioning c), bf16 out (the adaLN GEMMs' input).
void SiluForward(bf16* out, const float* in, size_t n, cudaStream_t stream);
// din += silu'(in) · dout   (dout fp32: the adaLN GEMMs' input gradient, summed in fp32).
void SiluBackward(float* din, const float* dout, const float* in, size_t n, cudaStream_t stream);

// GELU (tanh approximation) for where the GEMM epilogue does not apply: out = gelu(in);
// din = gelu'(in) · dout (written).
void GeluForward(bf16* out, const bf16* in, size_t n, cudaStream_t stream);
void GeluBackward(bf16* din, const bf16* dout, const bf16* in, size_t n, cudaStream_t stream);

// dbias[O] += Σ_n dout[n, O]: a Linear's bias gradient, fp32. dout bf16 or fp32.
void BiasGradient(float* dbias, const bf16* dout, int N, int O, cudaStream_t stream);
void BiasGradient(float* dbias, const float* dout, int N, int O, cudaStream_t stream);

// out = bf16(in), elementwise: the fp32 master weights' bf16 copy, an fp32 activation as a
// GEMM input.
void CastToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
// out = float(in) (`accumulate`: out += float(in)): a bf16 gradient into an fp32 sum.
void CastToFloat(float* out, const bf16* in, size_t n, bool accumulate, cudaStream_t stream);

}  // namespace difftrain::cuda
