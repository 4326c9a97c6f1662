// What every CUDA file of the model core shares: the bf16 type, fail-fast checks for CUDA and
// cuBLASLt calls (a failing call is a broken invariant or a lost device, never user input:
// it prints file:line and aborts, like DT_CHECK), and the launch arithmetic.
//
// Conventions of model/cuda (docs/cuda.md):
//   - every op takes the stream it runs on as its last argument and never synchronises;
//   - nothing allocates inside a step: ops take their workspaces from the caller;
//   - bf16 for what GEMMs read (activations, the bf16 copy of the weights), fp32 for what
//     accumulates (the residual stream, LayerNorm statistics, gradients, optimizer state);
//   - backward adds into parameter gradients (`+=`) and writes activation gradients (`=`)
//     unless its comment says otherwise, as on the CPU (model/cpu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/check.h"

namespace difftrain::cuda {

using bf16 = __nv_bfloat16;

// Blocks of `threads` that cover n elements.
inline unsigned BlocksFor(size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace difftrain::cuda

#define DT_CUDA_CHECK(expr)                                                                       \
  do {                                                                                            \
    const cudaError_t dt_cuda_error_ = (expr);                                                    \
    DT_CHECK(dt_cuda_error_ == cudaSuccess, "{}: {}", #expr, cudaGetErrorString(dt_cuda_error_)); \
  } while (0)

// After a kernel launch: a bad launch configuration fails here, at its call site.
#define DT_CUDA_CHECK_LAUNCH() DT_CUDA_CHECK(cudaGetLastError())
