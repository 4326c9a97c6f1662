#include "model/diffusion/vb_loss.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace difftrain {
namespace {

// The vb term of one sample of n elements (bits, the mean over its elements): the KL of the
// model's reverse step from the true posterior, or at t = 0 the decoder NLL. The ε prediction
// enters only through the model's mean, detached. Writes grad_coeff · ∂(n · vb)/∂v to dv.
double SampleVb(const StepCoefficients& c, bool decoder, const float* eps, const float* v,
                const float* x0, const float* x_t, size_t n, double grad_coeff, float* dv) {
  const double d_log_variance_dv = c.DLogVarianceDv();
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const vb::Term term = vb::Element(c, decoder, eps[i], v[i], x0[i], x_t[i]);
    sum += term.value;
    dv[i] = static_cast<float>(grad_coeff * term.d_log_variance * d_log_variance_dv);
  }
  return sum / (static_cast<double>(n) * vb::kLn2);
}

}  // namespace

namespace {

// Every coefficient but the clipped log-variance, from β, ᾱ_t and ᾱ_prev.
StepCoefficients Coefficients(double beta, double alpha_cumprod, double alpha_cumprod_prev) {
  StepCoefficients c;
  c.beta = beta;
  c.log_beta = std::log(c.beta);
  c.alpha_cumprod = alpha_cumprod;
  c.alpha_cumprod_prev = alpha_cumprod_prev;
  c.sqrt_recip_alphas_cumprod = std::sqrt(1.0 / c.alpha_cumprod);
  c.sqrt_recipm1_alphas_cumprod = std::sqrt(1.0 / c.alpha_cumprod - 1.0);
  c.posterior_mean_coef1 = c.beta * std::sqrt(c.alpha_cumprod_prev) / (1.0 - c.alpha_cumprod);
  c.posterior_mean_coef2 =
      (1.0 - c.alpha_cumprod_prev) * std::sqrt(1.0 - c.beta) / (1.0 - c.alpha_cumprod);
  c.posterior_variance = c.beta * (1.0 - c.alpha_cumprod_prev) / (1.0 - c.alpha_cumprod);
  return c;
}

}  // namespace

StepCoefficients CoefficientsAt(const std::vector<double>& betas,
                                const std::vector<double>& alphas_cumprod, int t) {
  const int steps = static_cast<int>(betas.size());
  DT_CHECK(alphas_cumprod.size() == betas.size(), "{} betas but {} alphas_cumprod", steps,
           alphas_cumprod.size());
  DT_CHECK(t >= 0 && t < steps, "timestep {} outside [0, {})", t, steps);
  auto at = [&](int s) {
    return Coefficients(betas[s], alphas_cumprod[s], s > 0 ? alphas_cumprod[s - 1] : 1.0);
  };
  StepCoefficients c = at(t);
  // β̃_0 is 0; DiT takes β̃_1 in its place. A 1-step schedule has no β̃_1 (DiT's array is
  // empty there); log β_0 stands in, so the learned range collapses to it.
  c.posterior_log_variance_clipped =
      steps > 1 ? std::log(t == 0 ? at(1).posterior_variance : c.posterior_variance) : c.log_beta;
  return c;
}

StepCoefficients CoefficientsBetween(double alpha_cumprod, double alpha_cumprod_prev) {
  StepCoefficients c =
      Coefficients(1.0 - alpha_cumprod / alpha_cumprod_prev, alpha_cumprod, alpha_cumprod_prev);
  c.posterior_log_variance_clipped = std::log(std::max(c.posterior_variance, 1e-20));
  return c;
}

double DiffusionLoss(const GaussianDiffusion& diffusion, const float* output, const float* x0,
                     const float* x_t, const float* noise, const int64_t* t, int B, int C, int HW,
                     bool learn_sigma, float grad_scale, float* dout, const double* weights) {
  const int out_channels = learn_sigma ? 2 * C : C;
  const double mse =
      EpsilonMseLoss(output, noise, B, C, out_channels, HW, grad_scale, dout, weights);
  if (!learn_sigma) return mse;

  const size_t n = static_cast<size_t>(C) * HW;
  const double grad_coeff = grad_scale / (static_cast<double>(B) * n * vb::kLn2);
  // Per-sample terms summed in order afterwards, so the loss does not depend on the threads.
  std::vector<double> vb(B);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; ++b) {
    DT_CHECK(t[b] >= 0 && t[b] < diffusion.steps(), "timestep {} out of range", t[b]);
    const StepCoefficients c =
        CoefficientsAt(diffusion.betas(), diffusion.alphas_cumprod(), static_cast<int>(t[b]));
    const size_t out = static_cast<size_t>(b) * 2 * n, in = static_cast<size_t>(b) * n;
    vb[b] = SampleVb(c, t[b] == 0, output + out, output + out + n, x0 + in, x_t + in, n, grad_coeff,
                     dout + out + n);
  }
  double vb_sum = 0;
  for (double term : vb)
    vb_sum += term;
  return mse + vb_sum / B;
}

}  // namespace difftrain
