// The optimizer step on the GPU (model/optim/adamw.h is the reference): global gradient
// norm, clipping and AdamW on the fp32 master weights, with the bf16 copy the GEMMs read
// refreshed in the same pass, and the EMA. Everything the step needs from the gradients
// (the norm, hence the clip factor) stays on the device, so the step has no host round trip
// and a CUDA graph can capture it; only the learning rate and the step count come from the
// host, as kernel arguments (the step's AdamWScalars, the same numbers the CPU update uses).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/cuda/common.h"
#include "model/optim/adamw_scalars.h"

namespace difftrain::cuda {

// Floats of the workspace SumOfSquares takes.
size_t SumOfSquaresWorkspace(size_t n);
// *result (a device double) = Σ g[i]² over n values, summed in double precision. Several
// calls on the same result add (`accumulate`), e.g. one per gradient bucket; the first
// writes.
void SumOfSquares(double* result, const float* g, size_t n, float* workspace, bool accumulate,
                  cudaStream_t stream);

// One AdamW step on n parameters (PyTorch's semantics, as the CPU's AdamWUpdate) with the
// step's scalars (AdamWScalarsAt): reads the gradients and the squared global norm
// (*sum_of_squares, on the device), scales the gradients by min(1, max_norm / (norm + 1e-6))
// when max_norm > 0, and updates master, exp_avg and exp_avg_sq in place; writes
// params_bf16 = bf16(master). params_bf16 may be null. With `ema.values`, EmaUpdate of the new
// master in the same pass (the same numbers as the two calls: one read of master fewer, 38
// bytes a parameter instead of 42).
struct EmaOfMaster {
  float* values = nullptr;
  double decay = 0;
};
void AdamWStep(float* master, bf16* params_bf16, float* exp_avg, float* exp_avg_sq,
               const float* grads, const double* sum_of_squares, size_t n,
               const AdamWScalars& scalars, double max_norm, EmaOfMaster ema, cudaStream_t stream);

// Zeroes [offset, offset + count) of `values` for each of `count` ranges, given on the device as
// (offset, count) pairs; `longest` is the largest count. One launch for scattered ranges (a
// model's biases between its weights, which a step's first micro-batch does not write whole).
void ZeroRanges(float* values, const uint64_t* ranges, int count, size_t longest,
                cudaStream_t stream);

// ema = decay · ema + (1 − decay) · params, as the CPU's EmaUpdate.
void EmaUpdate(float* ema, const float* params, size_t n, double decay, cudaStream_t stream);

}  // namespace difftrain::cuda
