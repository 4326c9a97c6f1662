// DiT's training loss on the GPU; model/diffusion/vb_loss.h's DiffusionLoss is the
// reference, computed the same way: the (weighted) ε-MSE over the first C output channels,
// plus, for learn_sigma models trained with it, the variational-bound term that trains the
// variance channels, everything summed in double.
#pragma once

#include <cstdint>
#include <vector>

#include "model/cuda/common.h"
#include "model/diffusion/vb_math.h"

namespace difftrain {
class GaussianDiffusion;
}

namespace difftrain::cuda {

// What the loss of one sample needs besides its tensors, computed on the host from its
// timestep t.
struct SampleLoss {
  StepCoefficients coefficients;  // the diffusion's at t (read by the vb term only)
  double weight = 1;              // of the sample's ε-MSE (GaussianDiffusion::LossWeights)
  int decoder = 0;                // t = 0: the vb term is the decoder's NLL
};

// The SampleLoss of each of B timesteps t of `diffusion` (loss.cc). With `sample_weights`
// (MicroBatch::sample_weights: a prior's halves), loss b's weight is also times
// sample_weights[b / frames] (a video's frames are losses of their sample's).
std::vector<SampleLoss> SampleLosses(const GaussianDiffusion& diffusion, const int64_t* t, int B,
                                     const std::vector<double>& sample_weights = {},
                                     int frames = 1);

// Writes n default SampleLoss (weight 1) to `samples` on the device and waits for the copy:
// what a step reads until a trainer uploads its batch's own (Reserve, and after a test poisons
// the activations that hold them).
void UploadUnweightedSamples(SampleLoss* samples, size_t n, cudaStream_t stream);

// Doubles of the workspace DiffusionLoss takes for a micro-batch of B.
inline size_t DiffusionLossWorkspace(int B) {
  return 2 * size_t(B);
}

// out [B, out_channels, HW] holds ε in its first C channels and, with `vb_term`
// (out_channels = 2C), v in the next C; noise, x0 and x_t are [B, C, HW] (x0 and x_t are read
// by the vb term only and may be null without it); samples [B] on the device.
//   loss[0] = Σ_b weight_b · Σ (ε − noise)² / (B·C·HW)  +  (vb term) mean_b vb_b
// dout = grad_scale · ∂loss/∂out, every output channel written (0 on v without the vb term).
void DiffusionLoss(float* loss, float* dout, const float* out, const float* noise, const float* x0,
                   const float* x_t, const SampleLoss* samples, int B, int out_channels, int C,
                   int HW, bool vb_term, float grad_scale, double* workspace, cudaStream_t stream);

// The loss DiffusionLoss wrote at `loss` (a device scalar), once the stream's work is done
// (synchronises; loss.cc).
float ReadLoss(const float* loss, cudaStream_t stream);

}  // namespace difftrain::cuda
