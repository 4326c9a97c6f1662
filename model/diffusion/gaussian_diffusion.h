// Gaussian diffusion as DiT trains it: a linear β schedule over 1000 steps (β from 1e-4 to
// 0.02, in double precision), q_sample, and the ε-prediction MSE objective.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

struct DiffusionConfig {
  int steps = 1000;
  double beta_start = 1e-4;
  double beta_end = 0.02;

  Status Validate() const;
  nlohmann::json ToJson() const;
};

class GaussianDiffusion {
 public:
  explicit GaussianDiffusion(const DiffusionConfig& config);

  int steps() const { return config_.steps; }
  const std::vector<double>& betas() const { return betas_; }
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }

  // x_t = √ᾱ_t · x0 + √(1 − ᾱ_t) · noise for each of B samples of n values. The coefficients
  // are rounded to fp32 before the product, as DiT's _extract_into_tensor does.
  void QSample(float* x_t, const float* x0, const float* noise, const int64_t* t, int B,
               size_t n) const;

 private:
  DiffusionConfig config_;
  std::vector<double> betas_, alphas_cumprod_;
};

// The ε-prediction loss: mean over every element of the first C channels of the output
// ([B, out_channels, HW]) of (output − noise)²; the variance channels (learn_sigma) get no
// gradient from it. Writes dout = grad_scale · ∂loss/∂output (zero in the variance channels)
// and returns the loss.
double EpsilonMseLoss(const float* output, const float* noise, int B, int C, int out_channels,
                      int HW, float grad_scale, float* dout);

}  // namespace difftrain
