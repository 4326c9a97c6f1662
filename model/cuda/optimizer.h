// The optimizer step on the GPU (model/optim/adamw.h is the reference): global gradient
// norm, clipping and AdamW on the fp32 master weights, with the bf16 copy the GEMMs read
// refreshed in the same pass, and the EMA. Everything the step needs from the gradients
// (the norm, hence the clip factor) stays on the device, so the step has no host round trip
// and a CUDA graph can capture it; only the learning rate and the step count come from the
// host, as kernel arguments.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// Floats of the workspace SumOfSquares takes.
size_t SumOfSquaresWorkspace(size_t n);
// *result (a device double) = Σ g[i]² over n values, summed in double precision. Several
// calls on the same result add (`accumulate`), e.g. one per gradient bucket; the first
// writes.
void SumOfSquares(double* result, const float* g, size_t n, float* workspace, bool accumulate,
                  cudaStream_t stream);

struct AdamWArgs {
  float lr;
  float beta1, beta2, eps, weight_decay;
  int64_t step;    // 1-based, for bias correction
  float max_norm;  // clipping: gradients scale by min(1, max_norm / (norm + 1e-6)); 0: off
};

// One AdamW step on n parameters (PyTorch's semantics, as the CPU's AdamWUpdate): reads the
// gradients, the squared global norm (*sum_of_squares, on the device), and updates master,
// exp_avg and exp_avg_sq in place; writes params_bf16 = bf16(master). params_bf16 may be null.
void AdamWStep(float* master, bf16* params_bf16, float* exp_avg, float* exp_avg_sq,
               const float* grads, const double* sum_of_squares, size_t n, const AdamWArgs& args,
               cudaStream_t stream);

// ema = decay · ema + (1 − decay) · params
void EmaUpdate(float* ema, const float* params, size_t n, float decay, cudaStream_t stream);

}  // namespace difftrain::cuda
