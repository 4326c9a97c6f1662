// The optimizer step on the GPU (model/cuda/optimizer.h; model/optim/adamw.cc is the reference).
//
// SumOfSquares is a two-stage reduction in double precision: a fixed number of blocks (a
// function of n only) each write one double partial into the workspace (as two 32-bit words,
// so the float workspace needs no 8-byte alignment), then one block adds the partials in a
// fixed order into *result. The result is deterministic for a given n.
//
// AdamWStep is one fused grid-stride pass (model/cuda/adamw_kernels.h, run by the CPU emulator
// too); every thread derives the clip factor from the squared norm on the device (a double
// load, a square root and a division: cheap), exactly as ClipScale does. The step's other
// numbers are AdamWScalarsAt's, the CPU update's own. The trainer's step also updates the EMA
// in that pass: on an H100, AdamW (30 bytes a parameter) and the EMA (12) each ran at 2.8 TB/s
// as two kernels, 10.2 ms a DiT-XL/2 step, and fused, one parameter a thread, at 2.6 TB/s
// (9.75 ms). It now takes four parameters a thread with 16-byte accesses where every array is
// aligned for them (the trainer's arenas are): not yet timed.
#include "model/cuda/optimizer.h"

#include <cstdint>

#include "model/cuda/adamw_kernels.h"
#include "model/cuda/device_primitives.cuh"

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxPartials = 1024;  // stage-one blocks at most; also stage two's threads
constexpr size_t kValuesPerThread = 8;   // stage-one work per thread before more blocks

unsigned PartialsFor(size_t n) {
  const size_t blocks = (n + kThreads * kValuesPerThread - 1) / (kThreads * kValuesPerThread);
  return blocks < 1 ? 1u : blocks > kMaxPartials ? kMaxPartials : static_cast<unsigned>(blocks);
}

unsigned GridFor(size_t n) {
  const unsigned blocks = BlocksFor(n, kThreads);
  return blocks < 65536u ? blocks : 65536u;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); valid in thread 0.
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < blockDim.x / 32; ++w)
      total += warp_sums[w];
  }
  return total;
}

// W values a thread an iteration: 4 (16-byte loads, g 16-byte aligned; the last n % 4 values
// by block 0's first threads) or 1. The H100 ran the one-value form at 2.25 TB/s over DiT-XL/2's
// 2.7 GB of gradients (1.2 ms), against a copy's 3.0: too few bytes in flight.
template <int W>
__global__ void SumOfSquaresPartialKernel(unsigned* __restrict__ partials,
                                          const float* __restrict__ g, size_t n) {
  double sum = 0;
  const size_t groups = n / W;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (W == 4) {
      const float4 v = reinterpret_cast<const float4*>(g)[i];
      sum += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
    } else {
      const double v = g[i];
      sum += v * v;
    }
  }
  if (W > 1 && blockIdx.x == 0 && threadIdx.x < n % W) {
    const double v = g[groups * W + threadIdx.x];
    sum += v * v;
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) {
    const unsigned long long bits = __double_as_longlong(total);
    partials[2 * blockIdx.x] = static_cast<unsigned>(bits);
    partials[2 * blockIdx.x + 1] = static_cast<unsigned>(bits >> 32);
  }
}

// One block of kMaxPartials threads.
__global__ void SumOfSquaresFinalKernel(double* __restrict__ result,
                                        const unsigned* __restrict__ partials, unsigned count,
                                        bool accumulate) {
  double v = 0;
  if (threadIdx.x < count) {
    const unsigned long long bits =
        static_cast<unsigned long long>(partials[2 * threadIdx.x]) |
        (static_cast<unsigned long long>(partials[2 * threadIdx.x + 1]) << 32);
    v = __longlong_as_double(static_cast<long long>(bits));
  }
  const double total = BlockSum(v);
  if (threadIdx.x == 0) *result = accumulate ? *result + total : total;
}

template <int W>
__global__ void AdamWKernel(adamw::Args args) {
  adamw::Step<DevicePrimitives, W>(args);
}

// Grid (ranges, ⌈longest / kZeroChunk⌉): block (r, c) zeroes chunk c of range r, if it has one.
constexpr unsigned kZeroThreads = 256;
constexpr size_t kZeroChunk = 16 * 1024;
__global__ void ZeroRangesKernel(float* __restrict__ values, const uint64_t* __restrict__ ranges) {
  const uint64_t offset = ranges[2 * blockIdx.x], count = ranges[2 * blockIdx.x + 1];
  const uint64_t begin = uint64_t(blockIdx.y) * kZeroChunk;
  if (begin >= count) return;
  const uint64_t end = begin + kZeroChunk < count ? begin + kZeroChunk : count;
  for (uint64_t i = begin + threadIdx.x; i < end; i += kZeroThreads)
    values[offset + i] = 0.0f;
}

__global__ void EmaKernel(float* __restrict__ ema, const float* __restrict__ params, size_t n,
                          float decay, float keep) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    ema[i] = adamw::EmaOf(ema[i], params[i], decay, keep);
}

}  // namespace

size_t SumOfSquaresWorkspace(size_t n) {
  return 2 * static_cast<size_t>(PartialsFor(n));
}

void SumOfSquares(double* result, const float* g, size_t n, float* workspace, bool accumulate,
                  cudaStream_t stream) {
  const unsigned partials = PartialsFor(n);
  unsigned* words = reinterpret_cast<unsigned*>(workspace);
  if (reinterpret_cast<uintptr_t>(g) % 16 == 0) {
    SumOfSquaresPartialKernel<4><<<partials, kThreads, 0, stream>>>(words, g, n);
  } else {
    SumOfSquaresPartialKernel<1><<<partials, kThreads, 0, stream>>>(words, g, n);
  }
  DT_CUDA_CHECK_LAUNCH();
  SumOfSquaresFinalKernel<<<1, kMaxPartials, 0, stream>>>(result, words, partials, accumulate);
  DT_CUDA_CHECK_LAUNCH();
}

void AdamWStep(float* master, bf16* params_bf16, float* exp_avg, float* exp_avg_sq,
               const float* grads, const double* sum_of_squares, size_t n,
               const AdamWScalars& scalars, double max_norm, EmaOfMaster ema, cudaStream_t stream) {
  DT_CHECK(max_norm <= 0 || sum_of_squares != nullptr, "clipping needs the squared norm");
  if (n == 0) return;
  // Four parameters a thread where every array allows 16-byte accesses (8 for the bf16 copy).
  const auto aligned = [](const void* p, uintptr_t bytes) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  const bool vectors = aligned(master, 16) && aligned(exp_avg, 16) && aligned(exp_avg_sq, 16) &&
                       aligned(grads, 16) && aligned(ema.values, 16) && aligned(params_bf16, 8);
  const size_t per_thread = vectors ? 4 : 1;
  adamw::Args args{master,
                   reinterpret_cast<uint16_t*>(params_bf16),
                   exp_avg,
                   exp_avg_sq,
                   grads,
                   sum_of_squares,
                   n,
                   scalars,
                   max_norm,
                   ema.values,
                   static_cast<float>(ema.decay),
                   static_cast<float>(1.0 - ema.decay),
                   static_cast<int>(GridFor((n + per_thread - 1) / per_thread)),
                   static_cast<int>(kThreads)};
  if (vectors) {
    AdamWKernel<4><<<args.blocks, kThreads, 0, stream>>>(args);
  } else {
    AdamWKernel<1><<<args.blocks, kThreads, 0, stream>>>(args);
  }
  DT_CUDA_CHECK_LAUNCH();
}

void ZeroRanges(float* values, const uint64_t* ranges, int count, size_t longest,
                cudaStream_t stream) {
  if (count == 0 || longest == 0) return;
  const dim3 grid(count, static_cast<unsigned>((longest + kZeroChunk - 1) / kZeroChunk));
  ZeroRangesKernel<<<grid, kZeroThreads, 0, stream>>>(values, ranges);
  DT_CUDA_CHECK_LAUNCH();
}

void EmaUpdate(float* ema, const float* params, size_t n, double decay, cudaStream_t stream) {
  if (n == 0) return;
  EmaKernel<<<GridFor(n), kThreads, 0, stream>>>(ema, params, n, static_cast<float>(decay),
                                                 static_cast<float>(1.0 - decay));
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
