#include "model/cuda/geglu.h"

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr float kSqrtHalf = 0.70710678118654752f;    // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/√(2π)

__global__ void GegluForwardKernel(bf16* __restrict__ out, const bf16* __restrict__ in, size_t F,
                                   size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / F, f = i % F;
  const float x = __bfloat162float(in[row * 2 * F + f]);
  const float g = __bfloat162float(in[row * 2 * F + F + f]);
  out[i] = __float2bfloat16(x * 0.5f * g * (1.0f + erff(g * kSqrtHalf)));
}

// GELU'(g) = Φ(g) + g · φ(g).
__global__ void GegluBackwardKernel(bf16* __restrict__ din, const bf16* __restrict__ dout,
                                    const bf16* __restrict__ in, size_t F, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / F, f = i % F;
  const float x = __bfloat162float(in[row * 2 * F + f]);
  const float g = __bfloat162float(in[row * 2 * F + F + f]);
  const float dy = __bfloat162float(dout[i]);
  const float cdf = 0.5f * (1.0f + erff(g * kSqrtHalf));
  din[row * 2 * F + f] = __float2bfloat16(dy * g * cdf);
  din[row * 2 * F + F + f] =
      __float2bfloat16(dy * x * (cdf + g * kInvSqrt2Pi * expf(-0.5f * g * g)));
}

}  // namespace

void GegluForward(bf16* out, const bf16* in, size_t N, size_t F, cudaStream_t stream) {
  const size_t n = N * F;
  if (n == 0) return;
  GegluForwardKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(out, in, F, n);
  DT_CUDA_CHECK_LAUNCH();
}

void GegluBackward(bf16* din, const bf16* dout, const bf16* in, size_t N, size_t F,
                   cudaStream_t stream) {
  const size_t n = N * F;
  if (n == 0) return;
  GegluBackwardKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(din, dout, in, F, n);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
