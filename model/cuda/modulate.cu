// DiT's adaLN-Zero elementwise ops on the GPU: LayerNorm fused with the modulation, and the
// gated residual (model/cuda/modulate.h; model/cpu/layernorm.cc and modulate.cc are the
// references).
//
// Row-wise work (LayerNorm statistics and its backward) runs one warp per row of D values,
// two passes in fp32 re-reading the row (it stays in L1/L2), with float4 loads where D and
// the pointers allow it and scalar loads otherwise. The per-sample gradients of shift, scale
// and gate are sums over the T tokens of a sample: one block per (sample, 32 features) loops
// over the tokens and reduces its 8 token lanes through shared memory in a fixed order, so
// they are deterministic and need neither atomics nor a workspace.
#include "model/cuda/modulate.h"

#include <cstdint>

namespace difftrain::cuda {
namespace {

constexpr float kLayerNormEps = 1e-6f;
constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kTokenLanes = 8;    // blockDim.y of the per-sample reductions

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int W>
__device__ __forceinline__ void Load(float (&v)[W], const float* p) {
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    for (int j = 0; j < W; ++j)
      v[j] = p[j];
  }
}

template <int W>
__device__ __forceinline__ void Load(float (&v)[W], const bf16* p) {
  if constexpr (W == 4) {
    const __nv_bfloat162 a = reinterpret_cast<const __nv_bfloat162*>(p)[0];
    const __nv_bfloat162 b = reinterpret_cast<const __nv_bfloat162*>(p)[1];
    v[0] = __low2float(a), v[1] = __high2float(a), v[2] = __low2float(b), v[3] = __high2float(b);
  } else {
    for (int j = 0; j < W; ++j)
      v[j] = __bfloat162float(p[j]);
  }
}

template <int W>
__device__ __forceinline__ void Store(float* p, const float (&v)[W]) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    for (int j = 0; j < W; ++j)
      p[j] = v[j];
  }
}

template <int W>
__device__ __forceinline__ void Store(bf16* p, const float (&v)[W]) {
  if constexpr (W == 4) {
    reinterpret_cast<__nv_bfloat162*>(p)[0] = __floats2bfloat162_rn(v[0], v[1]);
    reinterpret_cast<__nv_bfloat162*>(p)[1] = __floats2bfloat162_rn(v[2], v[3]);
  } else {
    for (int j = 0; j < W; ++j)
      p[j] = __float2bfloat16(v[j]);
  }
}

bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// W = 4 needs D, stride and the offsets divisible by 4 and 16-byte aligned fp32 rows.
bool CanVectorize(const void* fp32_a, const void* fp32_b, const void* bf16_c, int D, int stride,
                  int offset_a, int offset_b) {
  return D % 4 == 0 && stride % 4 == 0 && offset_a % 4 == 0 && offset_b % 4 == 0 &&
         Aligned(fp32_a, 16) && Aligned(fp32_b, 16) && Aligned(bf16_c, 8);
}

unsigned RowBlocks(int rows) {
  return BlocksFor(static_cast<size_t>(rows), kRowThreads / 32);
}

template <int W>
__global__ void LayerNormModulateForwardKernel(bf16* __restrict__ out, float* __restrict__ mean,
                                               float* __restrict__ rstd,
                                               const float* __restrict__ x,
                                               const float* __restrict__ ada, int shift_offset,
                                               int scale_offset, int stride, int rows, int T,
                                               int D) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {
    const float* xr = x + static_cast<size_t>(row) * D;
    float sum = 0;
    for (int d = lane * W; d < D; d += 32 * W) {
      float v[W];
      Load<W>(v, xr + d);
      for (int j = 0; j < W; ++j)
        sum += v[j];
    }
    const float m = WarpSum(sum) / D;
    float var = 0;
    for (int d = lane * W; d < D; d += 32 * W) {
      float v[W];
      Load<W>(v, xr + d);
      for (int j = 0; j < W; ++j)
        var += (v[j] - m) * (v[j] - m);
    }
    const float s = 1.0f / sqrtf(WarpSum(var) / D + kLayerNormEps);
    const size_t b = static_cast<size_t>(row / T);
    const float* shift = ada + b * stride + shift_offset;
    const float* scale = ada + b * stride + scale_offset;
    bf16* outr = out + static_cast<size_t>(row) * D;
    for (int d = lane * W; d < D; d += 32 * W) {
      float v[W], sh[W], sc[W], o[W];
      Load<W>(v, xr + d);
      Load<W>(sh, shift + d);
      Load<W>(sc, scale + d);
      for (int j = 0; j < W; ++j)
        o[j] = (v[j] - m) * s * (1.0f + sc[j]) + sh[j];
      Store<W>(outr + d, o);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

// dx += LayerNorm's backward of g = dout · (1 + scale).
template <int W>
__global__ void LayerNormModulateInputGradKernel(
    float* __restrict__ dx, const bf16* __restrict__ dout, const float* __restrict__ x,
    const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ ada,
    int scale_offset, int stride, int rows, int T, int D) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {
    const size_t base = static_cast<size_t>(row) * D;
    const float* scale = ada + static_cast<size_t>(row / T) * stride + scale_offset;
    const float m = mean[row], s = rstd[row];
    float sum_g = 0, sum_gx = 0;
    for (int d = lane * W; d < D; d += 32 * W) {
      float v[W], g[W], sc[W];
      Load<W>(v, x + base + d);
      Load<W>(g, dout + base + d);
      Load<W>(sc, scale + d);
      for (int j = 0; j < W; ++j) {
        const float gj = g[j] * (1.0f + sc[j]);
        sum_g += gj;
        sum_gx += gj * (v[j] - m) * s;
      }
    }
    const float mean_g = WarpSum(sum_g) / D, mean_gx = WarpSum(sum_gx) / D;
    for (int d = lane * W; d < D; d += 32 * W) {
      float v[W], g[W], sc[W], acc[W];
      Load<W>(v, x + base + d);
      Load<W>(g, dout + base + d);
      Load<W>(sc, scale + d);
      Load<W>(acc, dx + base + d);
      for (int j = 0; j < W; ++j) {
        const float gj = g[j] * (1.0f + sc[j]);
        acc[j] += s * (gj - mean_g - (v[j] - m) * s * mean_gx);
      }
      Store<W>(dx + base + d, acc);
    }
  }
}

// Sums the 8 token lanes (threadIdx.y) of `v` for feature threadIdx.x in a fixed order; the
// result is valid in the threads of threadIdx.y == 0. Every thread of the block must call it.
template <int N>
__device__ __forceinline__ void SumTokenLanes(float (&v)[N]) {
  __shared__ float partial[N][kTokenLanes][33];
  for (int k = 0; k < N; ++k)
    partial[k][threadIdx.y][threadIdx.x] = v[k];
  __syncthreads();
  if (threadIdx.y == 0) {
    for (int k = 0; k < N; ++k) {
      float sum = 0;
      for (int y = 0; y < kTokenLanes; ++y)
        sum += partial[k][y][threadIdx.x];
      v[k] = sum;
    }
  }
}

// Block (32, 8) per (32 features, sample): d_shift += Σ_t dout, d_scale += Σ_t dout · x̂.
__global__ void LayerNormModulateAdaGradKernel(float* __restrict__ d_ada,
                                               const bf16* __restrict__ dout,
                                               const float* __restrict__ x,
                                               const float* __restrict__ mean,
                                               const float* __restrict__ rstd, int shift_offset,
                                               int scale_offset, int stride, int T, int D) {
  const int d = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;
  float sums[2] = {0, 0};
  if (d < D) {
    for (int t = threadIdx.y; t < T; t += kTokenLanes) {
      const size_t row = static_cast<size_t>(b) * T + t;
      const float g = __bfloat162float(dout[row * D + d]);
      sums[0] += g;
      sums[1] += g * (x[row * D + d] - mean[row]) * rstd[row];
    }
  }
  SumTokenLanes(sums);
  if (threadIdx.y == 0 && d < D) {
    d_ada[static_cast<size_t>(b) * stride + shift_offset + d] += sums[0];
    d_ada[static_cast<size_t>(b) * stride + scale_offset + d] += sums[1];
  }
}

// One block per row (grid-stride over rows), threads over D. out may alias x.
__global__ void GatedResidualForwardKernel(float* out, const float* x, const bf16* __restrict__ y,
                                           const float* __restrict__ ada, int gate_offset,
                                           int stride, int rows, int T, int D) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * D;
    const float* gate = ada + static_cast<size_t>(row / T) * stride + gate_offset;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
      out[base + d] = x[base + d] + gate[d] * __bfloat162float(y[base + d]);
  }
}

// Block (32, 8) per (32 features, sample): dy = gate · dout, d_gate += Σ_t dout · y.
__global__ void GatedResidualBackwardKernel(bf16* __restrict__ dy, float* __restrict__ d_ada,
                                            const float* __restrict__ dout,
                                            const bf16* __restrict__ y,
                                            const float* __restrict__ ada, int gate_offset,
                                            int stride, int T, int D) {
  const int d = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;
  float sum[1] = {0};
  if (d < D) {
    const float gate = ada[static_cast<size_t>(b) * stride + gate_offset + d];
    for (int t = threadIdx.y; t < T; t += kTokenLanes) {
      const size_t i = (static_cast<size_t>(b) * T + t) * D + d;
      const float g = dout[i];
      dy[i] = __float2bfloat16(gate * g);
      sum[0] += g * __bfloat162float(y[i]);
    }
  }
  SumTokenLanes(sum);
  if (threadIdx.y == 0 && d < D) d_ada[static_cast<size_t>(b) * stride + gate_offset + d] += sum[0];
}

void CheckShape(int B, int T, int D, int stride, int offset_a, int offset_b) {
  DT_CHECK(B > 0 && T > 0 && D > 0, "bad shape B={} T={} D={}", B, T, D);
  DT_CHECK(offset_a >= 0 && offset_a + D <= stride && offset_b >= 0 && offset_b + D <= stride,
           "adaLN slices at {} and {} (width {}) do not fit in stride {}", offset_a, offset_b, D,
           stride);
}

}  // namespace

void LayerNormModulateForward(bf16* out, float* mean, float* rstd, const float* x, const float* ada,
                              int shift_offset, int scale_offset, int stride, int B, int T, int D,
                              cudaStream_t stream) {
  CheckShape(B, T, D, stride, shift_offset, scale_offset);
  const int rows = B * T;
  if (CanVectorize(x, ada, out, D, stride, shift_offset, scale_offset)) {
    LayerNormModulateForwardKernel<4><<<RowBlocks(rows), kRowThreads, 0, stream>>>(
        out, mean, rstd, x, ada, shift_offset, scale_offset, stride, rows, T, D);
  } else {
    LayerNormModulateForwardKernel<1><<<RowBlocks(rows), kRowThreads, 0, stream>>>(
        out, mean, rstd, x, ada, shift_offset, scale_offset, stride, rows, T, D);
  }
  DT_CUDA_CHECK_LAUNCH();
}

void LayerNormModulateBackward(float* dx, float* d_ada, const bf16* dout, const float* x,
                               const float* mean, const float* rstd, const float* ada,
                               int shift_offset, int scale_offset, int stride, int B, int T, int D,
                               cudaStream_t stream) {
  CheckShape(B, T, D, stride, shift_offset, scale_offset);
  const int rows = B * T;
  if (CanVectorize(x, ada, dout, D, stride, scale_offset, 0) && Aligned(dx, 16)) {
    LayerNormModulateInputGradKernel<4><<<RowBlocks(rows), kRowThreads, 0, stream>>>(
        dx, dout, x, mean, rstd, ada, scale_offset, stride, rows, T, D);
  } else {
    LayerNormModulateInputGradKernel<1><<<RowBlocks(rows), kRowThreads, 0, stream>>>(
        dx, dout, x, mean, rstd, ada, scale_offset, stride, rows, T, D);
  }
  DT_CUDA_CHECK_LAUNCH();
  const dim3 grid((D + 31) / 32, B), block(32, kTokenLanes);
  LayerNormModulateAdaGradKernel<<<grid, block, 0, stream>>>(
      d_ada, dout, x, mean, rstd, shift_offset, scale_offset, stride, T, D);
  DT_CUDA_CHECK_LAUNCH();
}

void GatedResidualForward(float* out, const float* x, const bf16* y, const float* ada,
                          int gate_offset, int stride, int B, int T, int D, cudaStream_t stream) {
  CheckShape(B, T, D, stride, gate_offset, gate_offset);
  const int rows = B * T;
  const unsigned blocks = static_cast<unsigned>(rows < 65536 ? rows : 65536);
  GatedResidualForwardKernel<<<blocks, 256, 0, stream>>>(out, x, y, ada, gate_offset, stride, rows,
                                                         T, D);
  DT_CUDA_CHECK_LAUNCH();
}

void GatedResidualBackward(bf16* dy, float* d_ada, const float* dout, const bf16* y,
                           const float* ada, int gate_offset, int stride, int B, int T, int D,
                           cudaStream_t stream) {
  CheckShape(B, T, D, stride, gate_offset, gate_offset);
  const dim3 grid((D + 31) / 32, B), block(32, kTokenLanes);
  GatedResidualBackwardKernel<<<grid, block, 0, stream>>>(dy, d_ada, dout, y, ada, gate_offset,
                                                          stride, T, D);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
