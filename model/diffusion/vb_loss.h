// The learned-variance objective DiT trains with learn_sigma (Nichol & Dhariwal's hybrid
// loss, as in DiT's gaussian_diffusion.py with loss_type MSE, model_var_type LEARNED_RANGE and
// model_mean_type EPSILON), and the per-timestep coefficients of the diffusion that it and the
// samplers (sampler.h) share.
//
// With learn_sigma the model output [B, 2C, H, W] holds ε (the first C channels) and v (the
// last C). The model's reverse step p(x_{t−1} | x_t) has the mean of the posterior
// q(x_{t−1} | x_t, x0) at x0 = x0(x_t, ε) and the log-variance
//   frac · log β_t + (1 − frac) · log β̃_t,   frac = (v + 1) / 2,
// interpolating between DiT's two fixed choices (β̃_t the posterior variance, clipped at t = 0
// to β̃_1 as DiT does). The loss of sample b is
//   mse_b = mean over its C·H·W elements of (ε − noise)²
//   vb_b  = mean over its elements of KL(q(x_{t−1} | x_t, x0) ‖ p(x_{t−1} | x_t)) / ln 2
//           (at t = 0 instead −log p(x0 | x_1) under DiT's discretized Gaussian with bins of
//           width 2/255, edge bins open beyond ±0.999, also / ln 2)
// and the batch's loss is the mean over the batch of mse_b + vb_b. The vb term sees ε
// detached: its gradient reaches only the v channels, and ε is trained by the MSE alone.
//
// Everything is computed in double from the fp32 inputs (DiT computes in fp32 with the
// coefficients rounded to fp32; the two agree to rounding).
#pragma once

#include <cstdint>
#include <vector>

#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/vb_math.h"

namespace difftrain {

// The coefficients at timestep t (0 ≤ t < betas.size()) of the schedule `betas` with
// cumulative products `alphas_cumprod`.
StepCoefficients CoefficientsAt(const std::vector<double>& betas,
                                const std::vector<double>& alphas_cumprod, int t);

// The coefficients of one step from ᾱ_t = `alpha_cumprod` to ᾱ_prev = `alpha_cumprod_prev`,
// as diffusers' DDPM scheduler computes them: β = 1 − ᾱ_t / ᾱ_prev, and the log-variance
// floor log max(β̃, 1e-20) in place of DiT's clipping.
StepCoefficients CoefficientsBetween(double alpha_cumprod, double alpha_cumprod_prev);

// The training loss of one micro-batch. `output` is the model output [B, out_channels, HW]
// (out_channels = 2C with learn_sigma, else C); x0, x_t and noise are [B, C, HW]; t [B].
// Writes dout = grad_scale · ∂loss/∂output for every output channel and returns the loss.
// learn_sigma = false is EpsilonMseLoss exactly; learn_sigma = true adds the mean vb term
// above (its gradient lands in the v channels only). Per-sample `weights` (null: 1) scale
// the ε-MSE term only (GaussianDiffusion::LossWeights); the vb term is never weighted.
double DiffusionLoss(const GaussianDiffusion& diffusion, const float* output, const float* x0,
                     const float* x_t, const float* noise, const int64_t* t, int B, int C, int HW,
                     bool learn_sigma, float grad_scale, float* dout,
                     const double* weights = nullptr);

}  // namespace difftrain
