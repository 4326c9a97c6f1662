#include "model/cuda/groupnorm.h"

#include <type_traits>

#include "model/cuda/activation.h"

namespace difftrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float ToFloat(float v) {
  return v;
}
__device__ __forceinline__ float ToFloat(bf16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16(v);
  } else {
    return v;
  }
}

__device__ __forceinline__ float Sigmoid(float y) {
  return 1.0f / (1.0f + __expf(-y));
}

// The sum of every thread's v over the block (kThreads threads); every thread gets it.
__device__ float BlockSum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float total;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // a previous call's readers are done with warp_sums and total
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int w = 0; w < kThreads / 32; ++w)
      sum += warp_sums[w];
    total = sum;
  }
  __syncthreads();
  return total;
}

// Block j = b·G + g: group g of sample b, its n = (C/G)·HW values contiguous at x + j·n.
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    GroupNormForwardKernel(Out* __restrict__ out, float* __restrict__ mean_out,
                           float* __restrict__ rstd_out, const float* __restrict__ x,
                           const float* __restrict__ weight, const float* __restrict__ bias, int C,
                           int HW, int G, float eps, bool silu) {
  const int j = blockIdx.x, cpg = C / G, g = j % G;
  const size_t n = size_t(cpg) * HW, base = size_t(j) * n;
  float sum = 0;
  for (size_t i = threadIdx.x; i < n; i += kThreads)
    sum += x[base + i];
  const float mean = BlockSum(sum) / n;
  float sq = 0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    const float d = x[base + i] - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(BlockSum(sq) / n + eps);
  if (threadIdx.x == 0) {
    mean_out[j] = mean;
    rstd_out[j] = rstd;
  }
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    const int c = g * cpg + static_cast<int>(i / HW);
    float y = (x[base + i] - mean) * rstd * weight[c] + bias[c];
    if (silu) y *= Sigmoid(y);
    out[base + i] = FromFloat<Out>(y);
  }
}

// dy: the gradient of y (before the SiLU) at element i of channel c.
template <typename Dout>
__device__ __forceinline__ float GradY(const Dout* dout, size_t at, float xhat, float w, float b,
                                       bool silu) {
  const float d = ToFloat(dout[at]);
  if (!silu) return d;
  const float y = xhat * w + b, s = Sigmoid(y);
  return d * s * (1.0f + y * (1.0f - s));
}

// din = rstd · (dŷ − mean(dŷ) − x̂ · mean(dŷ · x̂)) over the group, dŷ = dy · weight[c].
template <typename Dout>
__global__ void __launch_bounds__(kThreads)
    GroupNormBackwardKernel(float* __restrict__ din, const Dout* __restrict__ dout,
                            const float* __restrict__ x, const float* __restrict__ mean_in,
                            const float* __restrict__ rstd_in, const float* __restrict__ weight,
                            const float* __restrict__ bias, int C, int HW, int G, bool silu) {
  const int j = blockIdx.x, cpg = C / G, g = j % G;
  const size_t n = size_t(cpg) * HW, base = size_t(j) * n;
  const float mean = mean_in[j], rstd = rstd_in[j];
  float s1 = 0, s2 = 0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    const int c = g * cpg + static_cast<int>(i / HW);
    const float xhat = (x[base + i] - mean) * rstd;
    const float dxhat = GradY(dout, base + i, xhat, weight[c], bias[c], silu) * weight[c];
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float m1 = BlockSum(s1) / n, m2 = BlockSum(s2) / n;
  for (size_t i = threadIdx.x; i < n; i += kThreads) {
    const int c = g * cpg + static_cast<int>(i / HW);
    const float xhat = (x[base + i] - mean) * rstd;
    const float dxhat = GradY(dout, base + i, xhat, weight[c], bias[c], silu) * weight[c];
    din[base + i] += rstd * (dxhat - m1 - xhat * m2);
  }
}

// A warp per (b, c): partial[0][b, c] = Σ_hw dy · x̂, partial[1][b, c] = Σ_hw dy.
template <typename Dout>
__global__ void __launch_bounds__(kThreads)
    GroupNormParamPartialsKernel(float* __restrict__ dw_partial, float* __restrict__ db_partial,
                                 const Dout* __restrict__ dout, const float* __restrict__ x,
                                 const float* __restrict__ mean_in,
                                 const float* __restrict__ rstd_in,
                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                 int B, int C, int HW, int G, bool silu) {
  const size_t bc = size_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (bc >= size_t(B) * C) return;
  const int c = static_cast<int>(bc % C);
  const size_t b = bc / C, j = b * G + c / (C / G);
  const float mean = mean_in[j], rstd = rstd_in[j];
  float sw = 0, sb = 0;
  for (int i = lane; i < HW; i += 32) {
    const size_t at = bc * HW + i;
    const float xhat = (x[at] - mean) * rstd;
    const float dy = GradY(dout, at, xhat, weight[c], bias[c], silu);
    sw += dy * xhat;
    sb += dy;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sw += __shfl_xor_sync(0xffffffffu, sw, offset);
    sb += __shfl_xor_sync(0xffffffffu, sb, offset);
  }
  if (lane == 0) {
    dw_partial[bc] = sw;
    db_partial[bc] = sb;
  }
}

// The LayerNorm case (HW = 1): a thread per (b, c), whose plane is one value.
template <typename Dout>
__global__ void __launch_bounds__(kThreads)
    LayerNormParamPartialsKernel(float* __restrict__ dw_partial, float* __restrict__ db_partial,
                                 const Dout* __restrict__ dout, const float* __restrict__ x,
                                 const float* __restrict__ mean_in,
                                 const float* __restrict__ rstd_in,
                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                 int B, int C, int G, bool silu) {
  const size_t bc = size_t(blockIdx.x) * kThreads + threadIdx.x;
  if (bc >= size_t(B) * C) return;
  const int c = static_cast<int>(bc % C);
  const size_t j = bc / C * G + c / (C / G);
  const float xhat = (x[bc] - mean_in[j]) * rstd_in[j];
  const float dy = GradY(dout, bc, xhat, weight[c], bias[c], silu);
  dw_partial[bc] = dy * xhat;
  db_partial[bc] = dy;
}

void CheckShape(const cpu::GroupNormShape& s) {
  DT_CHECK(s.B > 0 && s.C > 0 && s.HW > 0 && s.G > 0 && s.C % s.G == 0,
           "GroupNorm shape B={} C={} HW={} G={}: C must be a multiple of G", s.B, s.C, s.HW, s.G);
}

}  // namespace

template <typename Out>
void GroupNormForward(Out* out, float* mean, float* rstd, const float* x, const float* weight,
                      const float* bias, const cpu::GroupNormShape& s, float eps, bool silu,
                      cudaStream_t stream) {
  CheckShape(s);
  GroupNormForwardKernel<Out><<<s.B * s.G, kThreads, 0, stream>>>(out, mean, rstd, x, weight, bias,
                                                                  s.C, s.HW, s.G, eps, silu);
  DT_CUDA_CHECK_LAUNCH();
}

size_t GroupNormBackwardWorkspace(const cpu::GroupNormShape& s) {
  return 2 * size_t(s.B) * s.C;
}

template <typename Dout>
void GroupNormBackward(float* din, float* dweight, float* dbias, const Dout* dout, const float* x,
                       const float* mean, const float* rstd, const float* weight, const float* bias,
                       const cpu::GroupNormShape& s, bool silu, float* workspace,
                       cudaStream_t stream) {
  CheckShape(s);
  GroupNormBackwardKernel<Dout><<<s.B * s.G, kThreads, 0, stream>>>(
      din, dout, x, mean, rstd, weight, bias, s.C, s.HW, s.G, silu);
  DT_CUDA_CHECK_LAUNCH();
  const size_t rows = size_t(s.B) * s.C;
  float* dw_partial = workspace;
  float* db_partial = workspace + rows;
  if (s.HW == 1) {
    LayerNormParamPartialsKernel<Dout><<<BlocksFor(rows, kThreads), kThreads, 0, stream>>>(
        dw_partial, db_partial, dout, x, mean, rstd, weight, bias, s.B, s.C, s.G, silu);
  } else {
    GroupNormParamPartialsKernel<Dout><<<BlocksFor(rows, kThreads / 32), kThreads, 0, stream>>>(
        dw_partial, db_partial, dout, x, mean, rstd, weight, bias, s.B, s.C, s.HW, s.G, silu);
  }
  DT_CUDA_CHECK_LAUNCH();
  BiasGradient(dweight, dw_partial, s.B, s.C, stream);
  BiasGradient(dbias, db_partial, s.B, s.C, stream);
}

template void GroupNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, const cpu::GroupNormShape&, float, bool,
                                      cudaStream_t);
template void GroupNormForward<bf16>(bf16*, float*, float*, const float*, const float*,
                                     const float*, const cpu::GroupNormShape&, float, bool,
                                     cudaStream_t);
template void GroupNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, const float*,
                                       const cpu::GroupNormShape&, bool, float*, cudaStream_t);
template void GroupNormBackward<bf16>(float*, float*, float*, const bf16*, const float*,
                                      const float*, const float*, const float*, const float*,
                                      const cpu::GroupNormShape&, bool, float*, cudaStream_t);

}  // namespace difftrain::cuda
