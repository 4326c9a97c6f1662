// Small elementwise and reduction ops on the GPU (model/cuda/activation.h; model/cpu/activation.cc
// is the reference): SiLU, GELU (tanh approximation), the bias gradient and the casts.
//
// The elementwise kernels are grid-stride loops over any n. The bias gradient sums columns in a
// fixed order (deterministic, no atomics): 16-byte loads where the rows allow, else one
// element per thread.
#include "model/cuda/activation.h"

#include <cstdint>

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kRowLanes = 16;  // blockDim.y of the bias gradient

unsigned GridFor(size_t n) {
  const unsigned blocks = BlocksFor(n, kThreads);
  return blocks < 65536u ? blocks : 65536u;
}

// GELU(x) = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float Sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float Load(const float* p, size_t i) {
  return p[i];
}
__device__ __forceinline__ float Load(const bf16* p, size_t i) {
  return __bfloat162float(p[i]);
}

#define DT_GRID_STRIDE(i, n)                                                           \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void SiluForwardKernel(bf16* __restrict__ out, const float* __restrict__ in, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const float x = in[i];
    out[i] = __float2bfloat16(x * Sigmoid(x));
  }
}

__global__ void SiluBackwardKernel(float* __restrict__ din, const float* __restrict__ dout,
                                   const float* __restrict__ in, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const float x = in[i], sig = Sigmoid(x);
    din[i] += dout[i] * sig * (1.0f + x * (1.0f - sig));
  }
}

__global__ void GeluForwardKernel(bf16* __restrict__ out, const bf16* __restrict__ in, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const float x = __bfloat162float(in[i]);
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = __float2bfloat16(0.5f * x * (1.0f + tanhf(u)));
  }
}

__global__ void GeluBackwardKernel(bf16* __restrict__ din, const bf16* __restrict__ dout,
                                   const bf16* __restrict__ in, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const float x = __bfloat162float(in[i]);
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    din[i] = __float2bfloat16(__bfloat162float(dout[i]) * grad);
  }
}

// The general column sum, for any O and alignment. Block (32, 16) per 32 columns:
// dbias[o] += Σ_n dout[n, o].
template <typename T>
__global__ void BiasGradientKernel(float* __restrict__ dbias, const T* __restrict__ dout, int N,
                                   int O) {
  __shared__ float partial[kRowLanes][33];
  const int o = blockIdx.x * 32 + threadIdx.x;
  float sum = 0;
  if (o < O) {
    for (int r = threadIdx.y; r < N; r += kRowLanes)
      sum += Load(dout, static_cast<size_t>(r) * O + o);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && o < O) {
    float total = 0;
    for (int y = 0; y < kRowLanes; ++y)
      total += partial[y][threadIdx.x];
    dbias[o] += total;
  }
}

// 16 bytes of a row: 8 bf16 or 4 fp32 values added to acc.
__device__ __forceinline__ void AddVector(float (&acc)[8], const bf16* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}
__device__ __forceinline__ void AddVector(float (&acc)[4], const float* p) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  acc[0] += f.x;
  acc[1] += f.y;
  acc[2] += f.z;
  acc[3] += f.w;
}

// The fast column sum, for O a multiple of V = 16 bytes / sizeof(T) and 16-byte aligned rows.
// A block (2, kVecRowLanes) owns 2V columns: thread x reads V columns (16 bytes) of every
// kVecRowLanes-th row, so a warp reads 16 rows × 32 contiguous bytes (whole sectors) per load,
// with 512 threads' loads in flight per block (the general kernel's 32 columns per block left
// most SMs idle: 36 blocks for DiT-XL's 1,152 columns; this takes 72 and reads 8 times as many
// bytes per load). The sums meet in a fixed order (a shuffle tree inside each warp, then the
// warps in turn): the same bits on every run, as the general kernel's.
constexpr int kVecRowLanes = 256;
template <typename T>
__global__ void __launch_bounds__(2 * kVecRowLanes)
    BiasGradientVectorKernel(float* __restrict__ dbias, const T* __restrict__ dout, int N, int O) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kWarpsPerBlock = 2 * kVecRowLanes / 32;
  __shared__ float partial[kWarpsPerBlock][2 * V];
  const int o = blockIdx.x * 2 * V + threadIdx.x * V;  // O % V == 0: all V columns or none
  float acc[V] = {};
  if (o < O) {
#pragma unroll 4
    for (int r = threadIdx.y; r < N; r += kVecRowLanes)
      AddVector(acc, dout + static_cast<size_t>(r) * O + o);
  }
  // Lanes 2y + x: the xor offsets 2…16 pair lanes of the same x, summing the warp's 16 rows.
#pragma unroll
  for (int i = 0; i < V; ++i) {
#pragma unroll
    for (int offset = 16; offset >= 2; offset /= 2)
      acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], offset);
  }
  const int linear = threadIdx.y * 2 + threadIdx.x, warp = linear / 32, lane = linear % 32;
  if (lane < 2) {
#pragma unroll
    for (int i = 0; i < V; ++i)
      partial[warp][lane * V + i] = acc[i];
  }
  __syncthreads();
  if (linear < 2 * V && blockIdx.x * 2 * V + linear < O) {
    float total = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w)
      total += partial[w][linear];
    dbias[blockIdx.x * 2 * V + linear] += total;
  }
}

__global__ void CastToBf16Kernel(bf16* __restrict__ out, const float* __restrict__ in, size_t n) {
  DT_GRID_STRIDE(i, n) {
    out[i] = __float2bfloat16(in[i]);
  }
}

__global__ void CastToFloatKernel(float* __restrict__ out, const bf16* __restrict__ in, size_t n,
                                  bool accumulate) {
  DT_GRID_STRIDE(i, n) {
    const float v = __bfloat162float(in[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

#undef DT_GRID_STRIDE

template <typename T>
void LaunchBiasGradient(float* dbias, const T* dout, int N, int O, cudaStream_t stream) {
  DT_CHECK(N >= 0 && O >= 0, "bad bias gradient shape N={} O={}", N, O);
  if (N == 0 || O == 0) return;
  constexpr int V = 16 / sizeof(T);
  if (O % V == 0 && reinterpret_cast<uintptr_t>(dout) % 16 == 0) {
    const dim3 grid((O + 2 * V - 1) / (2 * V)), block(2, kVecRowLanes);
    BiasGradientVectorKernel<T><<<grid, block, 0, stream>>>(dbias, dout, N, O);
  } else {
    const dim3 grid((O + 31) / 32), block(32, kRowLanes);
    BiasGradientKernel<T><<<grid, block, 0, stream>>>(dbias, dout, N, O);
  }
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void SiluForward(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  SiluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(out, in, n);
  DT_CUDA_CHECK_LAUNCH();
}

void SiluBackward(float* din, const float* dout, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  SiluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(din, dout, in, n);
  DT_CUDA_CHECK_LAUNCH();
}

void GeluForward(bf16* out, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(out, in, n);
  DT_CUDA_CHECK_LAUNCH();
}

void GeluBackward(bf16* din, const bf16* dout, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(din, dout, in, n);
  DT_CUDA_CHECK_LAUNCH();
}

void BiasGradient(float* dbias, const bf16* dout, int N, int O, cudaStream_t stream) {
  LaunchBiasGradient(dbias, dout, N, O, stream);
}

void BiasGradient(float* dbias, const float* dout, int N, int O, cudaStream_t stream) {
  LaunchBiasGradient(dbias, dout, N, O, stream);
}

void CastToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  CastToBf16Kernel<<<GridFor(n), kThreads, 0, stream>>>(out, in, n);
  DT_CUDA_CHECK_LAUNCH();
}

void CastToFloat(float* out, const bf16* in, size_t n, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  CastToFloatKernel<<<GridFor(n), kThreads, 0, stream>>>(out, in, n, accumulate);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
