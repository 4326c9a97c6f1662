#include "model/diffusion/vb_loss.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

// One micro-batch of loss inputs: B samples of C channels × HW pixels, timesteps covering the
// decoder term (t = 0), its neighbours and both ends of the schedule.
class DiffusionLossTest : public ::testing::Test {
 protected:
  static constexpr int B = 6, C = 2, HW = 5;
  static constexpr size_t kN = static_cast<size_t>(C) * HW;

  void SetUp() override {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> level(0, 255);
    std::uniform_real_distribution<float> uniform(-1, 1);
    x0.resize(B * kN);
    noise.resize(B * kN);
    x_t.resize(B * kN);
    // Pixel data: 256 levels in [−1, 1], the extremes included, so the decoder term's edge
    // bins are exercised.
    for (size_t i = 0; i < x0.size(); ++i)
      x0[i] = i % 7 == 0 ? (i % 2 ? 1.0f : -1.0f) : level(rng) / 127.5f - 1.0f;
    for (float& v : noise)
      v = normal(rng);
    diffusion.QSample(x_t.data(), x0.data(), noise.data(), t.data(), B, kN);
    // ε near the true noise (so the decoder's likelihood is not clamped) and v anywhere in
    // the learned range.
    output.resize(B * 2 * kN);
    for (int b = 0; b < B; ++b) {
      for (size_t i = 0; i < kN; ++i) {
        output[b * 2 * kN + i] = noise[b * kN + i] + 0.1f * normal(rng);
        output[b * 2 * kN + kN + i] = uniform(rng);
      }
    }
  }

  double Loss(const std::vector<float>& out, std::vector<float>& dout, bool learn_sigma = true,
              float grad_scale = 1.0f) const {
    dout.assign(out.size(), 0.0f);
    return DiffusionLoss(diffusion, out.data(), x0.data(), x_t.data(), noise.data(), t.data(), B, C,
                         HW, learn_sigma, grad_scale, dout.data());
  }

  GaussianDiffusion diffusion{DiffusionConfig{}};
  std::vector<int64_t> t = {0, 1, 2, 137, 500, 999};
  std::vector<float> x0, noise, x_t, output;
};

TEST_F(DiffusionLossTest, WithoutLearnSigmaIsEpsilonMse) {
  std::vector<float> eps_only(B * kN), dout, expected(B * kN);
  for (int b = 0; b < B; ++b)
    std::copy_n(output.begin() + b * 2 * kN, kN, eps_only.begin() + b * kN);
  const double loss = Loss(eps_only, dout, /*learn_sigma=*/false, 0.5f);
  const double mse =
      EpsilonMseLoss(eps_only.data(), noise.data(), B, C, C, HW, 0.5f, expected.data());
  EXPECT_EQ(loss, mse);
  EXPECT_EQ(dout, expected);
}

// The vb term sees ε detached: the ε channels get the MSE gradient alone, bit for bit.
TEST_F(DiffusionLossTest, EpsilonChannelsGetOnlyTheMseGradient) {
  std::vector<float> dout, mse_dout(output.size());
  const double loss = Loss(output, dout);
  const double mse =
      EpsilonMseLoss(output.data(), noise.data(), B, C, 2 * C, HW, 1.0f, mse_dout.data());
  EXPECT_GT(loss, mse);  // the KL and the decoder NLL are positive
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(dout[b * 2 * kN + i], mse_dout[b * 2 * kN + i]) << "sample " << b << " i " << i;
    }
  }
}

// Central differences of the loss (computed in double from float inputs) in every variance
// output, divided by the step actually taken in float.
TEST_F(DiffusionLossTest, VarianceGradientMatchesFiniteDifferences) {
  std::vector<float> dout, scratch;
  Loss(output, dout);
  double worst = 0;
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < kN; ++i) {
      const size_t k = b * 2 * kN + kN + i;
      std::vector<float> plus = output, minus = output;
      plus[k] += 1e-3f;
      minus[k] -= 1e-3f;
      const double numeric =
          (Loss(plus, scratch) - Loss(minus, scratch)) / (static_cast<double>(plus[k]) - minus[k]);
      const double scale = std::max(std::abs(numeric), 1e-3 / (B * kN));
      const double error = std::abs(dout[k] - numeric) / scale;
      worst = std::max(worst, error);
      EXPECT_LT(error, 1e-4) << "t " << t[b] << " element " << i << ": analytic " << dout[k]
                             << ", numeric " << numeric;
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_F(DiffusionLossTest, GradScaleScalesEveryChannel) {
  std::vector<float> dout1, dout3;
  const double loss1 = Loss(output, dout1, true, 1.0f);
  const double loss3 = Loss(output, dout3, true, 3.0f);
  EXPECT_EQ(loss1, loss3);
  for (size_t k = 0; k < dout1.size(); ++k)
    ASSERT_NEAR(dout3[k], 3.0f * dout1[k], 1e-6f * std::abs(dout1[k]) + 1e-12f) << k;
}

// With the exact noise and v = −1 (the posterior's own variance) the model's reverse step is
// the true posterior: the KL vanishes and so does its gradient.
TEST_F(DiffusionLossTest, KlVanishesAtTheTruePosterior) {
  t = {1, 10, 100, 400, 800, 999};
  diffusion.QSample(x_t.data(), x0.data(), noise.data(), t.data(), B, kN);
  for (int b = 0; b < B; ++b) {
    std::copy_n(noise.begin() + b * kN, kN, output.begin() + b * 2 * kN);
    std::fill_n(output.begin() + b * 2 * kN + kN, kN, -1.0f);
  }
  std::vector<float> dout;
  EXPECT_NEAR(Loss(output, dout), 0.0, 1e-9);
  for (float g : dout)
    ASSERT_NEAR(g, 0.0f, 1e-7f);
}

TEST(CoefficientsAtTest, MatchesTheClosedForms) {
  const GaussianDiffusion diffusion{DiffusionConfig{}};
  const auto& betas = diffusion.betas();
  const auto& abar = diffusion.alphas_cumprod();
  for (int t : {0, 1, 500, 999}) {
    const StepCoefficients c = CoefficientsAt(betas, abar, t);
    const double prev = t > 0 ? abar[t - 1] : 1.0;
    // Without noise, x_t = √ᾱ_t · x0 and the posterior mean is the noiseless x_{t−1}.
    const double x0 = 0.7, x_t = std::sqrt(abar[t]) * x0;
    EXPECT_NEAR(c.PosteriorMean(x0, x_t), std::sqrt(prev) * x0, 1e-12) << t;
    EXPECT_NEAR(c.PredictX0(std::sqrt(abar[t]) * x0 + std::sqrt(1 - abar[t]) * 0.3, 0.3), x0, 1e-9)
        << t;
    EXPECT_DOUBLE_EQ(c.LearnedLogVariance(1.0), std::log(betas[t])) << t;
    EXPECT_DOUBLE_EQ(c.LearnedLogVariance(-1.0), c.posterior_log_variance_clipped) << t;
  }
  EXPECT_EQ(CoefficientsAt(betas, abar, 0).posterior_variance, 0.0);
  EXPECT_DOUBLE_EQ(CoefficientsAt(betas, abar, 0).posterior_log_variance_clipped,
                   std::log(CoefficientsAt(betas, abar, 1).posterior_variance));
}

}  // namespace
}  // namespace difftrain
