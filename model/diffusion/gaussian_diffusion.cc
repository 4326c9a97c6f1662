#include "model/diffusion/gaussian_diffusion.h"

#include <cmath>
#include <cstring>

#include "common/check.h"

namespace difftrain {

Status DiffusionConfig::Validate() const {
  if (steps < 1) return Errorf("diffusion.steps must be positive, got {}", steps);
  if (!(beta_start > 0 && beta_start <= beta_end && beta_end < 1)) {
    return Errorf("diffusion betas must satisfy 0 < beta_start <= beta_end < 1, got {} and {}",
                  beta_start, beta_end);
  }
  return Status::Ok();
}

nlohmann::json DiffusionConfig::ToJson() const {
  return {
      {"schedule", "linear"}, {"steps", steps}, {"beta_start", beta_start}, {"beta_end", beta_end}};
}

GaussianDiffusion::GaussianDiffusion(const DiffusionConfig& config) : config_(config) {
  Status valid = config.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  const int n = config.steps;
  betas_.resize(n);
  alphas_cumprod_.resize(n);
  double cumprod = 1.0;
  for (int i = 0; i < n; ++i) {
    // numpy.linspace(beta_start, beta_end, n): start + i·step, the last value exact.
    betas_[i] = n == 1 ? config.beta_start
                       : config.beta_start + (config.beta_end - config.beta_start) * i / (n - 1);
    cumprod *= 1.0 - betas_[i];
    alphas_cumprod_[i] = cumprod;
  }
}

void GaussianDiffusion::QSample(float* x_t, const float* x0, const float* noise, const int64_t* t,
                                int B, size_t n) const {
  for (int b = 0; b < B; ++b) {
    DT_CHECK(t[b] >= 0 && t[b] < config_.steps, "timestep {} out of range", t[b]);
    const float a = static_cast<float>(std::sqrt(alphas_cumprod_[t[b]]));
    const float s = static_cast<float>(std::sqrt(1.0 - alphas_cumprod_[t[b]]));
    const size_t base = static_cast<size_t>(b) * n;
    for (size_t i = 0; i < n; ++i)
      x_t[base + i] = a * x0[base + i] + s * noise[base + i];
  }
}

double EpsilonMseLoss(const float* output, const float* noise, int B, int C, int out_channels,
                      int HW, float grad_scale, float* dout) {
  const size_t count = static_cast<size_t>(B) * C * HW;
  const float grad_coeff = static_cast<float>(2.0 / static_cast<double>(count)) * grad_scale;
  std::memset(dout, 0, static_cast<size_t>(B) * out_channels * HW * sizeof(float));
  double sum = 0;
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < static_cast<size_t>(C) * HW; ++i) {
      const size_t o = static_cast<size_t>(b) * out_channels * HW + i;
      const float diff = output[o] - noise[static_cast<size_t>(b) * C * HW + i];
      sum += static_cast<double>(diff) * diff;
      dout[o] = grad_coeff * diff;
    }
  }
  return sum / static_cast<double>(count);
}

}  // namespace difftrain
