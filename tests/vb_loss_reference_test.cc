// Checks DiffusionLoss (the ε-MSE, uniform or min-SNR weighted, and with learn_sigma DiT's
// variational-bound term; linear and cosine schedules) against the float64 PyTorch port of
// DiT's diffusion: the test writes one call's inputs, loss and
// gradient to a safetensors file, and tests/reference/check_vb_loss.py recomputes them with
// autograd (relative L2 error <= 1e-5 for the loss and for dout).
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/diffusion/vb_loss.h"
#include "model/io/safetensors.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

struct LossCase {
  const char* name;
  bool learn_sigma;
  // ε drawn near the true noise (a trained model) or independently of it (an untrained one,
  // whose decoder likelihood is clamped at t = 0).
  bool near_noise;
  float grad_scale;
  // Corrupts one gradient element before writing: the checker must then fail.
  bool corrupt;
  const char* schedule = "linear";
  const char* loss_weighting = "uniform";
};

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << c.name;
}

class VbLossReferenceTest : public ::testing::TestWithParam<LossCase> {
 protected:
  void TearDown() override {
    // A failing case keeps its files for a closer look.
    if (HasFailure()) {
      std::cout << "files kept in " << temp_.path() << "\n";
      temp_.Keep();
    }
  }

  TempDir temp_{"vb_loss_reference"};
  std::filesystem::path dir_ = temp_.path();
};

TEST_P(VbLossReferenceTest, MatchesReference) {
  const LossCase& c = GetParam();
  constexpr int B = 8, C = 3, H = 4, W = 4, HW = H * W;
  const int out_channels = c.learn_sigma ? 2 * C : C;
  const size_t n = static_cast<size_t>(C) * HW;
  DiffusionConfig config;
  config.schedule = c.schedule;
  config.loss_weighting = c.loss_weighting;
  const GaussianDiffusion diffusion(config);

  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> level(0, 255);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<int64_t> t = {0, 0, 1, 2, 50, 400, 998, 999};
  std::vector<float> x0(B * n), noise(B * n), x_t(B * n), output(B * out_channels * HW);
  for (float& v : x0)
    v = level(rng) / 127.5f - 1.0f;
  for (float& v : noise)
    v = normal(rng);
  diffusion.QSample(x_t.data(), x0.data(), noise.data(), t.data(), B, n);
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < n; ++i) {
      const float eps = c.near_noise ? noise[b * n + i] + 0.05f * normal(rng) : normal(rng);
      output[b * out_channels * HW + i] = eps;
      if (c.learn_sigma) output[b * out_channels * HW + n + i] = uniform(rng);
    }
  }

  std::vector<float> dout(output.size());
  const std::vector<double> weights = diffusion.LossWeights(t.data(), B);
  const float loss = static_cast<float>(DiffusionLoss(
      diffusion, output.data(), x0.data(), x_t.data(), noise.data(), t.data(), B, C, HW,
      c.learn_sigma, c.grad_scale, dout.data(), weights.empty() ? nullptr : weights.data()));
  if (c.corrupt)
    dout[out_channels * HW - 1] += 1e-2f * std::abs(dout[out_channels * HW - 1]) + 1e-4f;

  io::SafetensorsWriter file;
  const std::vector<int64_t> image = {B, C, H, W}, out_shape = {B, out_channels, H, W};
  file.AddF32("output", out_shape, output.data());
  file.AddF32("x0", image, x0.data());
  file.AddF32("x_t", image, x_t.data());
  file.AddF32("noise", image, noise.data());
  file.Add("t", io::DType::kI64, {B}, t.data());
  file.AddF32("loss", {1}, &loss);
  file.AddF32("dout", out_shape, dout.data());
  file.SetMetadata("format", "difftrain-loss-check");
  file.SetMetadata("diffusion", config.ToJson().dump());
  file.SetMetadata("learn_sigma", c.learn_sigma ? "true" : "false");
  file.SetMetadata("grad_scale", std::to_string(c.grad_scale));
  const std::string path = (dir_ / "loss.safetensors").string();
  ASSERT_TRUE(file.WriteAtomic(path).ok());

  const CommandResult checked = RunCommand(
      "/usr/bin/python3 " + ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/check_vb_loss.py") +
      " " + ShellQuote(path));
  EXPECT_EQ(checked.exit_code, c.corrupt ? 1 : 0) << checked.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VbLossReferenceTest,
    ::testing::Values(
        LossCase{"LearnSigmaNearNoise", true, true, 1.0f, false},
        LossCase{"LearnSigmaUntrained", true, false, 1.0f, false},
        LossCase{"LearnSigmaGradScale", true, true, 0.25f, false},
        LossCase{"EpsilonOnly", false, false, 1.0f, false},
        LossCase{"CorruptGradientIsCaught", true, true, 1.0f, true},
        LossCase{"CosineSchedule", true, true, 1.0f, false, "cosine"},
        LossCase{"MinSnrWeighted", false, true, 0.5f, false, "linear", "min_snr"},
        LossCase{"CosineMinSnrLearnSigma", true, true, 1.0f, false, "cosine", "min_snr"},
        LossCase{"CorruptWeightedGradientIsCaught", false, true, 1.0f, true, "cosine", "min_snr"}),
    [](const ::testing::TestParamInfo<LossCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace difftrain
