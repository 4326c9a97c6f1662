#include "model/diffusion/lcm.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/sampler_kind.h"

namespace difftrain {
namespace {

std::vector<int> Timesteps(const std::vector<SamplingStep>& steps) {
  std::vector<int> t;
  for (const SamplingStep& s : steps)
    t.push_back(s.timestep);
  return t;
}

// LCM's 4-step schedule of a 1000-step diffusion distilled on 50 timesteps is the model card's
// 999, 759, 499, 259; each step goes to the ᾱ of the one below, the lowest to 1.
TEST(LcmStepsTest, TakesTheDistillationsTimesteps) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  Result<std::vector<SamplingStep>> four = LcmSteps(abar, 4, LcmOptions{});
  ASSERT_TRUE(four.ok()) << four.status().message();
  EXPECT_EQ(Timesteps(*four), (std::vector<int>{259, 499, 759, 999}));
  for (size_t i = 0; i < four->size(); ++i) {
    const SamplingStep& s = (*four)[i];
    EXPECT_EQ(s.alpha_cumprod, abar[s.timestep]);
    EXPECT_EQ(s.alpha_cumprod_prev, i == 0 ? 1.0 : abar[(*four)[i - 1].timestep]);
  }
  // Every step count takes distinct timesteps of the schedule, 999 first; N = 50 all of them.
  for (int N = 1; N <= 50; ++N) {
    const std::vector<int> t = Timesteps(*LcmSteps(abar, N, LcmOptions{}));
    ASSERT_EQ(t.size(), size_t(N));
    EXPECT_EQ(t.back(), 999);
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ((t[i] + 1) % 20, 0) << N;
      if (i > 0) {
        EXPECT_LT(t[i - 1], t[i]) << N;
      }
    }
    if (N == 50) {
      EXPECT_EQ(t.front(), 19);
    }
  }
  // 8 of a 100-step distillation: stride 10, indices ⌊12.5 j⌋.
  LcmOptions hundred;
  hundred.original_steps = 100;
  EXPECT_EQ(Timesteps(*LcmSteps(abar, 8, hundred)),
            (std::vector<int>{129, 249, 379, 499, 629, 749, 879, 999}));
}

TEST(LcmStepsTest, RefusesStepsOffItsSchedule) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  Result<std::vector<SamplingStep>> many = LcmSteps(abar, 51, LcmOptions{});
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("original_inference_steps = 50"), std::string::npos)
      << many.status().message();
  EXPECT_FALSE(LcmSteps(abar, 0, LcmOptions{}).ok());
  LcmOptions o;
  o.original_steps = 1001;
  EXPECT_FALSE(LcmSteps(abar, 4, o).ok());
  o.original_steps = 0;
  EXPECT_FALSE(LcmSteps(abar, 4, o).ok());
}

// LatentConsistencyModelImg2ImgPipeline's strength: N steps from the top of the first
// ⌊original_steps × strength⌋ timesteps of the schedule (30 of 50 at 0.6: 599 down).
TEST(LcmStepsTest, StrengthTakesTheStepsFromThePartOfTheSchedule) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  LcmOptions o;
  o.strength = 0.6;
  const std::vector<SamplingStep> steps = *LcmSteps(abar, 4, o);
  std::vector<int> t;
  for (const SamplingStep& s : steps)
    t.push_back(s.timestep);
  EXPECT_EQ(t, (std::vector<int>{159, 299, 459, 599}));
  Result<std::vector<SamplingStep>> many = LcmSteps(abar, 31, o);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("from the first 30 of the distillation's 50"),
            std::string::npos)
      << many.status().message();
  o.strength = 0;
  EXPECT_FALSE(LcmSteps(abar, 4, o).ok());
}

// TCD steps on LCM's timesteps, each through s = ⌊(1 − γ)·t'⌋ below the next one, the last to
// timestep 0 (ᾱ_0, not 1); γ = 0 goes straight to t'.
TEST(LcmStepsTest, TcdStepsThroughItsIntermediateTimesteps) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  Result<std::vector<TcdStep>> tcd = TcdSteps(abar, 4, LcmOptions{}, 0.3);
  ASSERT_TRUE(tcd.ok()) << tcd.status().message();
  const std::vector<int> t = {259, 499, 759, 999}, next = {0, 259, 499, 759},
                         s = {0, 181, 349, 531};
  ASSERT_EQ(tcd->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*tcd)[i].timestep, t[i]);
    EXPECT_EQ((*tcd)[i].alpha_cumprod, abar[t[i]]);
    EXPECT_EQ((*tcd)[i].alpha_cumprod_prev, abar[next[i]]);
    EXPECT_EQ((*tcd)[i].alpha_cumprod_s, abar[s[i]]) << i;
  }
  Result<std::vector<TcdStep>> straight = TcdSteps(abar, 4, LcmOptions{}, 0);
  ASSERT_TRUE(straight.ok());
  for (const TcdStep& step : *straight)
    EXPECT_EQ(step.alpha_cumprod_s, step.alpha_cumprod_prev);
  EXPECT_FALSE(TcdSteps(abar, 4, LcmOptions{}, 1.5).ok());
  EXPECT_FALSE(TcdSteps(abar, 51, LcmOptions{}, 0.3).ok());
}

// The boundary condition: at t = 0 the model's output is ignored (c_skip 1, c_out 0); above, its
// coefficients at s = t · timestep_scaling. And the config keys, with their defaults.
TEST(LcmOptionsTest, BoundaryConditionAndConfig) {
  LcmOptions o;
  EXPECT_EQ(o.SkipCoefficient(0), 1.0);
  EXPECT_EQ(o.OutCoefficient(0), 0.0);
  // s = 19 · 10: c_skip = 0.25/(190² + 0.25), c_out = 190/√(190² + 0.25).
  EXPECT_DOUBLE_EQ(o.SkipCoefficient(19), 0.25 / (190.0 * 190.0 + 0.25));
  EXPECT_DOUBLE_EQ(o.OutCoefficient(19), 190.0 / std::sqrt(190.0 * 190.0 + 0.25));

  Result<LcmOptions> read = LcmOptions::FromDiffusersScheduler(
      {{"_class_name", "LCMScheduler"}, {"original_inference_steps", 25}, {"timestep_scaling", 2}});
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->original_steps, 25);
  EXPECT_EQ(read->timestep_scaling, 2.0);
  EXPECT_EQ(read->ToJson()["original_inference_steps"], 25);
  const Result<LcmOptions> defaults = LcmOptions::FromDiffusersScheduler(nlohmann::json::object());
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->original_steps, 50);
  EXPECT_EQ(defaults->timestep_scaling, 10.0);
  // clip_sample is the sampler's (ReadDiffusersClipping), not the schedule's.
  EXPECT_TRUE(LcmOptions::FromDiffusersScheduler({{"clip_sample", true}}).ok());
  EXPECT_FALSE(LcmOptions::FromDiffusersScheduler({{"timestep_scaling", 0}}).ok());
  EXPECT_FALSE(LcmOptions::FromDiffusersScheduler({{"original_inference_steps", "x"}}).ok());
}

// LCMScheduler's class defaults: scaled_linear from 0.00085 to 0.012, the pipeline's sampler.
TEST(LcmOptionsTest, SchedulerClassDefaults) {
  EXPECT_EQ(SamplerOfScheduler("LCMScheduler"), SamplerKind::kLcm);
  Result<DiffusionConfig> lcm =
      DiffusionConfig::FromDiffusersScheduler({{"_class_name", "LCMScheduler"}});
  ASSERT_TRUE(lcm.ok()) << lcm.status().message();
  EXPECT_EQ(lcm->schedule, "scaled_linear");
  EXPECT_EQ(lcm->beta_start, 0.00085);
  EXPECT_EQ(lcm->beta_end, 0.012);
  Result<DiffusionConfig> heun =
      DiffusionConfig::FromDiffusersScheduler({{"_class_name", "HeunDiscreteScheduler"}});
  ASSERT_TRUE(heun.ok());
  EXPECT_EQ(heun->schedule, "linear");
  EXPECT_EQ(heun->beta_start, 0.00085);
  Result<DiffusionConfig> other =
      DiffusionConfig::FromDiffusersScheduler({{"_class_name", "SomeScheduler"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->beta_start, 1e-4);
}

}  // namespace
}  // namespace difftrain
