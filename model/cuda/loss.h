// DiT's ε-prediction loss on the GPU (model/diffusion/gaussian_diffusion.h's EpsilonMseLoss
// is the reference): the mean squared error between the first C channels of the model's
// output [B, C_out, H·W] and the noise ε [B, C, H·W].
#pragma once

#include "model/cuda/common.h"

namespace difftrain::cuda {

// loss[0] = mean((out[:, :C] − target)²) over B·C·HW values; dout = 2 (out − target) / n on
// those channels and 0 on the others (the learned-variance channels, whose
// variational-bound term is not computed here). dout and loss are written.
void EpsilonMseLoss(float* loss, float* dout, const float* out, const float* target, int B,
                    int out_channels, int C, int HW, cudaStream_t stream);

}  // namespace difftrain::cuda
