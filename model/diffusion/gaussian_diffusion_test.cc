#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/timestep_spacing.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/tensor/rng.h"

namespace difftrain {
namespace {

// Improved DDPM's ᾱ at the end of step i of T: f((i + 1)/T) / f(0), f(s) = cos²((s + .008)/1.008 ·
// π/2).
double CosineAlphaBarAfter(int i, int T) {
  auto f = [](double s) { return std::pow(std::cos((s + 0.008) / 1.008 * M_PI / 2), 2); };
  return f(static_cast<double>(i + 1) / T) / f(0);
}

TEST(GaussianDiffusionTest, CosineScheduleFollowsTheSquaredCosineUntilTheCap) {
  DiffusionConfig config;
  config.schedule = "cosine";
  const GaussianDiffusion diffusion(config);
  const auto& abar = diffusion.alphas_cumprod();
  for (int i : {0, 1, 10, 250, 500, 900, 990}) {
    EXPECT_NEAR(abar[i] / CosineAlphaBarAfter(i, 1000), 1.0, 1e-9) << "step " << i;
  }
  // The last β would be 1 (ᾱ reaches 0): it is capped at 0.999, so ᾱ stays positive.
  EXPECT_DOUBLE_EQ(diffusion.betas().back(), 0.999);
  EXPECT_GT(abar.back(), 0);
  // Slower than the linear schedule at first, so more steps see a recognisable image.
  const GaussianDiffusion linear{DiffusionConfig{}};
  EXPECT_GT(abar[500], linear.alphas_cumprod()[500]);
}

// Stable Diffusion's schedule: β = linspace(√0.00085, √0.012, 1000)², endpoints exact.
TEST(GaussianDiffusionTest, ScaledLinearScheduleIsLinearInTheSquareRoot) {
  DiffusionConfig config;
  config.schedule = "scaled_linear";
  config.beta_start = 0.00085;
  config.beta_end = 0.012;
  const GaussianDiffusion diffusion(config);
  const auto& betas = diffusion.betas();
  EXPECT_NEAR(betas.front(), 0.00085, 1e-15);
  EXPECT_NEAR(betas.back(), 0.012, 1e-15);
  const double step = (std::sqrt(0.012) - std::sqrt(0.00085)) / 999;
  for (int i : {1, 500, 998})
    EXPECT_NEAR(std::sqrt(betas[i]), std::sqrt(0.00085) + i * step, 1e-15) << "step " << i;
}

// v = √ᾱ·ε − √(1 − ᾱ)·x0 for v-prediction; the noise itself for ε-prediction.
TEST(GaussianDiffusionTest, TargetIsNoiseOrV) {
  DiffusionConfig config;
  const std::vector<float> x0 = {1.0f, -2.0f, 0.5f, 3.0f}, noise = {0.25f, 1.0f, -1.0f, 2.0f};
  const std::vector<int64_t> t = {0, 700};
  std::vector<float> target(4);
  GaussianDiffusion(config).Target(target.data(), x0.data(), noise.data(), t.data(), 2, 2);
  EXPECT_EQ(target, noise);
  config.prediction = "v";
  const GaussianDiffusion v(config);
  v.Target(target.data(), x0.data(), noise.data(), t.data(), 2, 2);
  for (int i = 0; i < 4; ++i) {
    const double abar = v.alphas_cumprod()[t[i / 2]];
    EXPECT_NEAR(target[i], std::sqrt(abar) * noise[i] - std::sqrt(1 - abar) * x0[i], 1e-6);
  }
}

TEST(GaussianDiffusionTest, MinSnrWeightsTheLowNoiseStepsDown) {
  DiffusionConfig config;
  EXPECT_TRUE(
      GaussianDiffusion(config).LossWeights(std::vector<int64_t>{0, 999}.data(), 2).empty());
  config.loss_weighting = "min_snr";
  config.min_snr_gamma = 5;
  const GaussianDiffusion diffusion(config);
  const auto& abar = diffusion.alphas_cumprod();
  for (int64_t t : {0, 10, 100, 300, 999}) {
    const double snr = abar[t] / (1 - abar[t]);
    EXPECT_DOUBLE_EQ(diffusion.LossWeight(t), snr > 5 ? 5 / snr : 1.0) << "t " << t;
  }
  EXPECT_LT(diffusion.LossWeight(0), 1e-3);  // SNR_0 ≈ 1e4
  EXPECT_EQ(diffusion.LossWeight(999), 1.0);
  const std::vector<int64_t> t = {0, 999};
  EXPECT_EQ(diffusion.LossWeights(t.data(), 2),
            (std::vector<double>{diffusion.LossWeight(0), 1.0}));
}

// Under v-prediction the v-MSE is (SNR + 1) times the x0-MSE, so min-SNR's weight is
// min(SNR, γ) / (SNR + 1): the same weight of the x0 error as ε-prediction's.
TEST(GaussianDiffusionTest, MinSnrUnderVPredictionWeighsTheX0ErrorAlike) {
  DiffusionConfig config;
  config.loss_weighting = "min_snr";
  config.min_snr_gamma = 5;
  const GaussianDiffusion eps(config);
  config.prediction = "v";
  ASSERT_TRUE(config.Validate().ok());
  const GaussianDiffusion v(config);
  const auto& abar = v.alphas_cumprod();
  for (int64_t t : {0, 10, 100, 300, 999}) {
    const double snr = abar[t] / (1 - abar[t]);
    EXPECT_NEAR(v.LossWeight(t), std::min(snr, 5.0) / (snr + 1), 1e-15) << "t " << t;
    // x0-MSE weights: ε's weight × SNR, v's weight × (SNR + 1).
    EXPECT_NEAR(v.LossWeight(t) * (snr + 1), eps.LossWeight(t) * snr, 1e-9 * snr) << "t " << t;
  }
}

TEST(GaussianDiffusionTest, WeightedMseScalesEachSamplesLossAndGradient) {
  const std::vector<float> output = {1, 2, 3, 4}, noise = {0, 0, 0, 0};
  const std::vector<double> weights = {0.5, 2};
  std::vector<float> dout(4);
  // B = 2 samples of one element each in one channel, with two output channels.
  const double loss =
      EpsilonMseLoss(output.data(), noise.data(), 2, 1, 2, 1, 1.0f, dout.data(), weights.data());
  EXPECT_DOUBLE_EQ(loss, (0.5 * 1 + 2 * 9) / 2.0);
  EXPECT_FLOAT_EQ(dout[0], 0.5f * 2 * 1 / 2);
  EXPECT_FLOAT_EQ(dout[1], 0);  // the variance channel
  EXPECT_FLOAT_EQ(dout[2], 2.0f * 2 * 3 / 2);
  EXPECT_FLOAT_EQ(dout[3], 0);
}

// Zero terminal SNR (Lin et al.'s Algorithm 1): √ᾱ_t moved linearly so that the last is 0 and
// the first kept, which leaves every other ᾱ between, in order; the last β is 1.
TEST(GaussianDiffusionTest, ZeroTerminalSnrEndsInPureNoise) {
  for (const char* schedule : {"linear", "scaled_linear", "cosine"}) {
    SCOPED_TRACE(schedule);
    DiffusionConfig config;
    config.schedule = schedule;
    config.prediction = "v";
    const GaussianDiffusion plain(config);
    config.zero_terminal_snr = true;
    const GaussianDiffusion zero(config);
    const std::vector<double>&a = plain.alphas_cumprod(), &z = zero.alphas_cumprod();
    EXPECT_EQ(z.back(), 0.0);
    EXPECT_EQ(zero.betas().back(), 1.0);
    EXPECT_GT(a.back(), 0.0);
    EXPECT_NEAR(z.front(), a.front(), 1e-15);
    // √ᾱ' is an affine map of √ᾱ: equal steps in √ᾱ stay equal in proportion.
    const double scale =
        (std::sqrt(z[500]) - std::sqrt(z[0])) / (std::sqrt(a[500]) - std::sqrt(a[0]));
    for (int t = 1; t < config.steps; ++t) {
      ASSERT_LT(z[t], z[t - 1]) << t;
      ASSERT_LE(z[t], a[t]) << t;
      ASSERT_NEAR(std::sqrt(z[t]) - std::sqrt(z[0]), scale * (std::sqrt(a[t]) - std::sqrt(a[0])),
                  1e-12)
          << t;
    }
    // x_t at the last timestep is the noise, and the v target −x0.
    const float x0[2] = {0.5f, -0.25f}, noise[2] = {1.5f, 2.0f};
    const int64_t last = config.steps - 1;
    float x_t[2], target[2];
    zero.QSample(x_t, x0, noise, &last, 1, 2);
    zero.Target(target, x0, noise, &last, 1, 2);
    EXPECT_EQ(x_t[0], noise[0]);
    EXPECT_EQ(target[1], -x0[1]);
  }
}

TEST(DiffusionConfigTest, BadChoicesNameTheField) {
  DiffusionConfig config;
  config.schedule = "sigmoid";
  EXPECT_EQ(config.Validate().message(),
            "diffusion.schedule: expected linear, scaled_linear or cosine, found 'sigmoid'");
  config = {};
  config.loss_weighting = "snr";
  EXPECT_EQ(config.Validate().message(),
            "diffusion.loss_weighting: expected uniform or min_snr, found 'snr'");
  config = {};
  config.min_snr_gamma = 0;
  EXPECT_EQ(config.Validate().message(),
            "diffusion.min_snr_gamma: expected a positive number, found 0");
  config = {};
  config.zero_terminal_snr = true;
  EXPECT_EQ(config.Validate().message().rfind("diffusion.zero_terminal_snr needs prediction v", 0),
            0u)
      << config.Validate().message();
  config.prediction = "v";
  config.steps = 1;
  EXPECT_EQ(config.Validate().message(), "diffusion.zero_terminal_snr needs at least 2 steps");
  config = {};
  config.noise_offset = -0.1;
  EXPECT_EQ(config.Validate().message(),
            "diffusion.noise_offset: expected a number >= 0, found -0.1");
  config = {};
  config.input_perturbation = std::nan("");
  EXPECT_EQ(config.Validate().message(),
            "diffusion.input_perturbation: expected a number >= 0, found nan");
}

// The noise extras are recorded where set and only there: the metadata of a run without them is
// what it always was.
TEST(DiffusionConfigTest, NoiseExtrasAreRecordedOnlyWhereSet) {
  DiffusionConfig config;
  EXPECT_FALSE(config.ToJson().contains("noise_offset"));
  EXPECT_FALSE(config.ToJson().contains("input_perturbation"));
  config.noise_offset = 0.05;
  config.input_perturbation = 0.1;
  Result<DiffusionConfig> back = DiffusionConfig::FromJson(config.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->noise_offset, 0.05);
  EXPECT_EQ(back->input_perturbation, 0.1);
}

// The offset is one N(0, 1) draw a channel, scaled, shared by the channel's frames and
// positions; the perturbation one draw a value, scaled; both after whatever the stream held.
TEST(NoiseExtrasTest, OffsetAChannelThenPerturbationAValue) {
  DiffusionConfig config;
  config.noise_offset = 0.5;
  config.input_perturbation = 0.25;
  const GaussianDiffusion diffusion(config);
  constexpr int kFrames = 2, kChannels = 3;
  constexpr size_t kPlane = 4, kN = kFrames * kChannels * kPlane;
  std::vector<float> noise(kN), perturbation(kN);
  for (size_t i = 0; i < kN; ++i)
    noise[i] = 0.01f * static_cast<float>(i);
  const std::vector<float> before = noise;
  Rng rng(11, RngStream::kNoise, 0);
  diffusion.DrawNoiseExtras(rng, kFrames, kChannels, kPlane, noise.data(), perturbation.data());
  Rng same(11, RngStream::kNoise, 0);
  float shift[kChannels];
  for (float& s : shift)
    s = 0.5f * static_cast<float>(same.Normal());
  for (int f = 0; f < kFrames; ++f) {
    for (int c = 0; c < kChannels; ++c) {
      for (size_t i = 0; i < kPlane; ++i) {
        const size_t at = (size_t(f) * kChannels + c) * kPlane + i;
        EXPECT_EQ(noise[at], before[at] + shift[c]) << "frame " << f << " channel " << c;
      }
    }
  }
  for (size_t i = 0; i < kN; ++i)
    EXPECT_EQ(perturbation[i], 0.25f * static_cast<float>(same.Normal())) << i;

  // x_t of the perturbed noise: the sum first, then q_sample's mix.
  const int64_t t = 300;
  std::vector<float> x0(kN, 1.0f), x_t(kN);
  diffusion.QSample(x_t.data(), x0.data(), noise.data(), &t, 1, kN, perturbation.data());
  const float a = static_cast<float>(std::sqrt(diffusion.alphas_cumprod()[t]));
  const float s = static_cast<float>(std::sqrt(1.0 - diffusion.alphas_cumprod()[t]));
  for (size_t i = 0; i < kN; ++i)
    EXPECT_EQ(x_t[i], a * x0[i] + s * (noise[i] + perturbation[i])) << i;
}

TEST(DiffusionConfigTest, JsonRoundTrips) {
  DiffusionConfig config;
  config.schedule = "cosine";
  config.loss_weighting = "min_snr";
  config.min_snr_gamma = 3;
  config.frame_noise_correlation = 0.25;
  config.prediction = "v";
  config.zero_terminal_snr = true;
  Result<DiffusionConfig> back = DiffusionConfig::FromJson(config.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), config.ToJson());
  // A checkpoint from before the schedule was recorded reads as linear and uniform.
  Result<DiffusionConfig> old =
      DiffusionConfig::FromJson({{"steps", 1000}, {"beta_start", 1e-4}, {"beta_end", 0.02}});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->schedule, "linear");
  EXPECT_FALSE(old->zero_terminal_snr);
  EXPECT_FALSE(DiffusionConfig::FromJson({{"steps", "many"}}).ok());
}

// ρ = 0 is independent noise drawn in order, as training and sampling always drew it (the
// pinned checksums depend on it).
TEST(FrameNoiseTest, UncorrelatedNoiseIsTheStreamInOrder) {
  Rng a(3, RngStream::kNoise, 7), b(3, RngStream::kNoise, 7);
  std::vector<float> noise(4 * 6);
  DrawFrameNoise(a, 0.0, 4, 6, noise.data());
  for (float v : noise)
    EXPECT_EQ(v, static_cast<float>(b.Normal()));
}

// Each value stays N(0, 1); two frames' values at one position correlate by ρ, two positions
// do not.
TEST(FrameNoiseTest, FramesCorrelateByRhoAtEveryPosition) {
  constexpr int kFrames = 3;
  constexpr size_t kFrame = 40000;
  for (double rho : {0.0, 0.3, 0.8}) {
    Rng rng(1, RngStream::kNoise, 0);
    std::vector<double> z(kFrames * kFrame);
    DrawFrameNoise(rng, rho, kFrames, kFrame, z.data());
    auto moment = [&](int f, int g, size_t shift) {
      double sum = 0;
      for (size_t i = 0; i + shift < kFrame; ++i)
        sum += z[f * kFrame + i] * z[g * kFrame + i + shift];
      return sum / (kFrame - shift);
    };
    for (int f = 0; f < kFrames; ++f)
      EXPECT_NEAR(moment(f, f, 0), 1.0, 0.03) << "rho " << rho << " frame " << f;
    EXPECT_NEAR(moment(0, 2, 0), rho, 0.03) << "rho " << rho;
    EXPECT_NEAR(moment(1, 2, 0), rho, 0.03) << "rho " << rho;
    EXPECT_NEAR(moment(0, 1, 1), 0.0, 0.03) << "rho " << rho << ": neighbouring positions";
  }
}

TEST(FrameNoiseTest, CorrelationOutsideZeroToOneIsRefused) {
  DiffusionConfig config;
  for (double rho : {-0.1, 1.0, 1.5}) {
    config.frame_noise_correlation = rho;
    const Status status = config.Validate();
    EXPECT_FALSE(status.ok()) << rho;
    EXPECT_NE(status.message().find("diffusion.frame_noise_correlation"), std::string::npos);
  }
}

}  // namespace
}  // namespace difftrain

namespace difftrain {
namespace {

// A diffusers scheduler config (as Stable Diffusion 2's DDIMScheduler saves it) says the
// training process; its sampling-time keys are not read, and what is not implemented is
// refused by name.
TEST(DiffusersSchedulerTest, ReadsTheTrainingProcess) {
  Result<DiffusionConfig> c = DiffusionConfig::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"_class_name": "DDIMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
          "beta_start": 0.00085, "clip_sample": false, "num_train_timesteps": 1000,
          "prediction_type": "v_prediction", "set_alpha_to_one": false, "steps_offset": 1,
          "timestep_spacing": "leading", "trained_betas": null,
          "rescale_betas_zero_snr": false})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->schedule, "scaled_linear");
  EXPECT_EQ(c->beta_start, 0.00085);
  EXPECT_EQ(c->beta_end, 0.012);
  EXPECT_EQ(c->prediction, "v");
  EXPECT_EQ(c->steps, 1000);
  c = DiffusionConfig::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"beta_schedule": "squaredcos_cap_v2", "num_train_timesteps": 500})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->schedule, "cosine");
  EXPECT_EQ(c->steps, 500);
  EXPECT_EQ(c->prediction, "epsilon");
  EXPECT_FALSE(c->zero_terminal_snr);
  // The class's default betas: Heun's and KDPM2's are Stable Diffusion's, DDIM's DDPM's.
  for (const auto& [name, start] :
       std::vector<std::pair<std::string, double>>{{"HeunDiscreteScheduler", 0.00085},
                                                   {"KDPM2DiscreteScheduler", 0.00085},
                                                   {"KDPM2AncestralDiscreteScheduler", 0.00085},
                                                   {"DDIMScheduler", 1e-4}}) {
    c = DiffusionConfig::FromDiffusersScheduler({{"_class_name", name}});
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->beta_start, start) << name;
  }
  c = DiffusionConfig::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"prediction_type": "v_prediction", "rescale_betas_zero_snr": true})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->zero_terminal_snr);

  for (const auto& [json, message] : std::vector<std::pair<const char*, const char*>>{
           {R"({"beta_schedule": "sigmoid"})", "beta_schedule: 'sigmoid' is not supported"},
           {R"({"prediction_type": "sample"})", "prediction_type: 'sample' is not supported"},
           {R"({"trained_betas": [0.1, 0.2]})", "trained_betas"},
           {R"({"rescale_betas_zero_snr": true})",
            "rescale_betas_zero_snr: true needs prediction_type v_prediction"},
           {R"({"num_train_timesteps": "many"})", "malformed scheduler config"},
           // A number past int's range, and tables past any schedule's (scheduler_fuzz).
           {R"({"num_train_timesteps": 1e300})", "num_train_timesteps: 1e+300 is not an integer"},
           {R"({"num_train_timesteps": 2000000000})",
            "diffusion.steps 2000000000 is more than the 1000000 a schedule may have"},
           // ᾱ falls below float32's range (2.9e-176 by the last step): the ancestral samplers'
           // σ arithmetic overflowed to NaN timesteps (scheduler_fuzz).
           {R"({"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.812})",
            "the schedule's alpha_cumprod falls to 1.04e-38 at timestep 640 of 1000"},
       }) {
    Result<DiffusionConfig> bad =
        DiffusionConfig::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << bad.status().message();
  }
}

}  // namespace
}  // namespace difftrain

namespace difftrain {
namespace {

// A process written as a pipeline's scheduler config reads back as itself, every schedule and
// prediction, with zero terminal SNR; training-only fields stay out of it.
TEST(DiffusionConfigTest, WrittenAsADiffusersSchedulerReadsBack) {
  for (const char* schedule : {"linear", "scaled_linear", "cosine"}) {
    for (const bool v : {false, true}) {
      DiffusionConfig c;
      c.schedule = schedule;
      c.steps = 500;
      c.beta_start = 0.00085;
      c.beta_end = 0.012;
      c.prediction = v ? "v" : "epsilon";
      c.zero_terminal_snr = v;
      const nlohmann::json written = c.ToDiffusersScheduler();
      EXPECT_FALSE(written.contains("loss_weighting"));
      Result<DiffusionConfig> read = DiffusionConfig::FromDiffusersScheduler(written);
      ASSERT_TRUE(read.ok()) << read.status().message();
      EXPECT_EQ(read->ToJson(), c.ToJson()) << written.dump();
      Result<TimestepSpacing> spacing = TimestepSpacing::FromDiffusersScheduler(written);
      ASSERT_TRUE(spacing.ok()) << spacing.status().message();
      EXPECT_EQ(spacing->kind, v ? "trailing" : "leading");
    }
  }
}

}  // namespace
}  // namespace difftrain
