// The per-step numbers of an AdamW update, worked out once on the host in double precision
// (AdamWScalarsAt, model/optim/adamw.h) and applied in float by the CPU update and the GPU
// kernel (model/cuda/optimizer.h) alike, so both take exactly the same step. No dependencies:
// CUDA sources include it.
#pragma once

namespace difftrain {

struct AdamWScalars {
  float beta1, beta2, eps;
  float decay;       // 1 − lr · weight_decay, applied to the weights first
  float step_size;   // lr / (1 − beta1^step)
  float bias2_sqrt;  // sqrt(1 − beta2^step)
};

}  // namespace difftrain
