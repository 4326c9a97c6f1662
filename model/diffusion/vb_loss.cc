#include "model/diffusion/vb_loss.h"

#include <cmath>

#include "common/check.h"

namespace difftrain {
namespace {

constexpr double kLn2 = 0.69314718055994530942;
// DiT clamps every probability of the decoder likelihood below at 1e-12 before its log.
constexpr double kMinProbability = 1e-12;

struct Cdf {
  double value, derivative;
};

// DiT's approx_standard_normal_cdf, 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 x³))), and its
// derivative in x.
Cdf ApproxStandardNormalCdf(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  const double th = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return {0.5 * (1 + th), 0.5 * (1 - th * th) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x)};
}

struct Nll {
  double value, d_log_scale;
};

// −log of the probability DiT's discretized_gaussian_log_likelihood gives x (data in [−1, 1]
// quantised to 256 levels: bins of width 2/255, the outermost open beyond ±0.999) under
// N(mean, exp(log_scale)²), and its derivative in log_scale. Where the probability is clamped
// at 1e-12 the derivative is 0, as torch's clamp makes it.
Nll DiscretizedGaussianNll(double x, double mean, double log_scale) {
  const double centered = x - mean;
  const double inv_stdv = std::exp(-log_scale);
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
  if (p < kMinProbability) return {-std::log(kMinProbability), 0.0};
  return {-std::log(p), -dp / p};
}

// The vb term of one sample of n elements (bits, the mean over its elements): the KL of the
// model's reverse step from the true posterior, or at t = 0 the decoder NLL. The ε prediction
// enters only through the model's mean, detached. Writes grad_coeff · ∂(n · vb)/∂v to dv.
double SampleVb(const StepCoefficients& c, bool decoder, const float* eps, const float* v,
                const float* x0, const float* x_t, size_t n, double grad_coeff, float* dv) {
  const double true_log_variance = c.posterior_log_variance_clipped;
  const double d_log_variance_dv = 0.5 * (c.log_beta - c.posterior_log_variance_clipped);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double model_mean = c.PosteriorMean(c.PredictX0(x_t[i], eps[i]), x_t[i]);
    const double log_variance = c.LearnedLogVariance(v[i]);
    double term, d_log_variance;
    if (decoder) {
      const Nll nll = DiscretizedGaussianNll(x0[i], model_mean, 0.5 * log_variance);
      term = nll.value;
      d_log_variance = 0.5 * nll.d_log_scale;
    } else {
      // normal_kl(true_mean, true_log_variance, model_mean, log_variance).
      const double true_mean = c.PosteriorMean(x0[i], x_t[i]);
      const double diff = true_mean - model_mean;
      const double ratio = std::exp(true_log_variance - log_variance);
      const double scaled_sq = diff * diff * std::exp(-log_variance);
      term = 0.5 * (-1.0 + log_variance - true_log_variance + ratio + scaled_sq);
      d_log_variance = 0.5 * (1.0 - ratio - scaled_sq);
    }
    sum += term;
    dv[i] = static_cast<float>(grad_coeff * d_log_variance * d_log_variance_dv);
  }
  return sum / (static_cast<double>(n) * kLn2);
}

}  // namespace

StepCoefficients CoefficientsAt(const std::vector<double>& betas,
                                const std::vector<double>& alphas_cumprod, int t) {
  const int steps = static_cast<int>(betas.size());
  DT_CHECK(alphas_cumprod.size() == betas.size(), "{} betas but {} alphas_cumprod", steps,
           alphas_cumprod.size());
  DT_CHECK(t >= 0 && t < steps, "timestep {} outside [0, {})", t, steps);
  auto posterior_variance = [&](int s) {
    const double prev = s > 0 ? alphas_cumprod[s - 1] : 1.0;
    return betas[s] * (1.0 - prev) / (1.0 - alphas_cumprod[s]);
  };
  StepCoefficients c;
  c.beta = betas[t];
  c.log_beta = std::log(c.beta);
  c.alpha_cumprod = alphas_cumprod[t];
  c.alpha_cumprod_prev = t > 0 ? alphas_cumprod[t - 1] : 1.0;
  c.sqrt_recip_alphas_cumprod = std::sqrt(1.0 / c.alpha_cumprod);
  c.sqrt_recipm1_alphas_cumprod = std::sqrt(1.0 / c.alpha_cumprod - 1.0);
  c.posterior_mean_coef1 = c.beta * std::sqrt(c.alpha_cumprod_prev) / (1.0 - c.alpha_cumprod);
  c.posterior_mean_coef2 =
      (1.0 - c.alpha_cumprod_prev) * std::sqrt(1.0 - c.beta) / (1.0 - c.alpha_cumprod);
  c.posterior_variance = posterior_variance(t);
  // β̃_0 is 0; DiT takes β̃_1 in its place. A 1-step schedule has no β̃_1 (DiT's array is
  // empty there); log β_0 stands in, so the learned range collapses to it.
  c.posterior_log_variance_clipped =
      steps > 1 ? std::log(posterior_variance(t == 0 ? 1 : t)) : c.log_beta;
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
  const double grad_coeff = grad_scale / (static_cast<double>(B) * n * kLn2);
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
