// The per-element arithmetic of DiT's learned-variance objective (vb_loss.h), written once for
// the CPU loss and the GPU's (model/cuda/loss.cu): the diffusion's coefficients at one
// timestep, and the variational-bound term of one element with its derivative in the
// variance output v. Everything is double. Compiled by nvcc these functions are both host
// and device code; elsewhere plain inline functions.
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define DT_HOST_DEVICE __host__ __device__
#else
#define DT_HOST_DEVICE
#endif

namespace difftrain {

// DiT's GaussianDiffusion arrays at one timestep t of a β schedule (the base schedule, or a
// respaced one: see sampler.h), in double.
struct StepCoefficients {
  double beta = 0, log_beta = 0;
  double alpha_cumprod = 0, alpha_cumprod_prev = 0;  // ᾱ_t and ᾱ_{t−1} (1 at t = 0)
  // x0 = sqrt_recip_alphas_cumprod · x_t − sqrt_recipm1_alphas_cumprod · ε.
  double sqrt_recip_alphas_cumprod = 0, sqrt_recipm1_alphas_cumprod = 0;
  // Posterior q(x_{t−1} | x_t, x0): mean coef1 · x0 + coef2 · x_t, variance β̃_t.
  double posterior_mean_coef1 = 0, posterior_mean_coef2 = 0;
  double posterior_variance = 0;
  // log β̃_t, with β̃_0 (which is 0) replaced by β̃_1; log β_0 for a 1-step schedule.
  double posterior_log_variance_clipped = 0;

  DT_HOST_DEVICE double PredictX0(double x_t, double eps) const {
    return sqrt_recip_alphas_cumprod * x_t - sqrt_recipm1_alphas_cumprod * eps;
  }
  // The ε that x_t and x0 imply (DiT's _predict_eps_from_xstart); x_t itself where ᾱ_t = 0
  // (zero terminal SNR: x_t is the noise).
  DT_HOST_DEVICE double PredictEps(double x_t, double x0) const {
    return alpha_cumprod > 0 ? (sqrt_recip_alphas_cumprod * x_t - x0) / sqrt_recipm1_alphas_cumprod
                             : x_t;
  }
  DT_HOST_DEVICE double PosteriorMean(double x0, double x_t) const {
    return posterior_mean_coef1 * x0 + posterior_mean_coef2 * x_t;
  }
  // The model's log-variance for the variance output v (LEARNED_RANGE).
  DT_HOST_DEVICE double LearnedLogVariance(double v) const {
    const double frac = (v + 1) / 2;
    return frac * log_beta + (1 - frac) * posterior_log_variance_clipped;
  }
  // ∂LearnedLogVariance/∂v.
  DT_HOST_DEVICE double DLogVarianceDv() const {
    return 0.5 * (log_beta - posterior_log_variance_clipped);
  }
};

namespace vb {

constexpr double kLn2 = 0.69314718055994530942;
// DiT clamps every probability of the decoder likelihood below at 1e-12 before its log.
constexpr double kMinProbability = 1e-12;

struct Cdf {
  double value, derivative;
};

// DiT's approx_standard_normal_cdf, 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 x³))), and its
// derivative in x.
DT_HOST_DEVICE inline Cdf ApproxStandardNormalCdf(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  const double th = tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return {0.5 * (1 + th), 0.5 * (1 - th * th) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x)};
}

struct Nll {
  double value, d_log_scale;
};

// −log of the probability DiT's discretized_gaussian_log_likelihood gives x (data in [−1, 1]
// quantised to 256 levels: bins of width 2/255, the outermost open beyond ±0.999) under
// N(mean, exp(log_scale)²), and its derivative in log_scale. Where the probability is clamped
// at 1e-12 the derivative is 0, as torch's clamp makes it.
DT_HOST_DEVICE inline Nll DiscretizedGaussianNll(double x, double mean, double log_scale) {
  const double centered = x - mean;
  const double inv_stdv = exp(-log_scale);
  const double plus_in = inv_stdv * (centered + 1.0 / 255.0);
  const double min_in = inv_stdv * (centered - 1.0 / 255.0);
  const Cdf plus = ApproxStandardNormalCdf(plus_in);
  const Cdf minus = ApproxStandardNormalCdf(min_in);
  // The bin's probability p and ∂p/∂log_scale; ∂plus_in/∂log_scale = −plus_in, likewise min_in.
  double p, dp;
  if (x < -0.999) {
    p = plus.value;
    dp = -plus.derivative * plus_in;
  } else if (x > 0.999) {
    p = 1.0 - minus.value;
    dp = minus.derivative * min_in;
  } else {
    p = plus.value - minus.value;
    dp = -plus.derivative * plus_in + minus.derivative * min_in;
  }
  if (p < kMinProbability) return {-log(kMinProbability), 0.0};
  return {-log(p), -dp / p};
}

struct Term {
  double value;           // nats, before the mean over elements and the division by ln 2
  double d_log_variance;  // ∂value/∂(the model's log-variance); times DLogVarianceDv: ∂/∂v
};

// The vb term of one element: the KL of the model's reverse step from the true posterior, or
// at t = 0 (`decoder`) the decoder NLL of x0. The ε prediction enters only through the model's
// mean, detached: the derivative is in the variance alone.
DT_HOST_DEVICE inline Term Element(const StepCoefficients& c, bool decoder, double eps, double v,
                                   double x0, double x_t) {
  const double model_mean = c.PosteriorMean(c.PredictX0(x_t, eps), x_t);
  const double log_variance = c.LearnedLogVariance(v);
  if (decoder) {
    const Nll nll = DiscretizedGaussianNll(x0, model_mean, 0.5 * log_variance);
    return {nll.value, 0.5 * nll.d_log_scale};
  }
  // normal_kl(true_mean, true_log_variance, model_mean, log_variance).
  const double true_log_variance = c.posterior_log_variance_clipped;
  const double diff = c.PosteriorMean(x0, x_t) - model_mean;
  const double ratio = exp(true_log_variance - log_variance);
  const double scaled_sq = diff * diff * exp(-log_variance);
  return {0.5 * (-1.0 + log_variance - true_log_variance + ratio + scaled_sq),
          0.5 * (1.0 - ratio - scaled_sq)};
}

}  // namespace vb
}  // namespace difftrain
