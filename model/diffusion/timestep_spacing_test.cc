#include "model/diffusion/timestep_spacing.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/vb_loss.h"

namespace difftrain {
namespace {

TimestepSpacing Spacing(const std::string& kind, int offset = 0, bool alpha_one = true) {
  TimestepSpacing s;
  s.kind = kind;
  s.steps_offset = offset;
  s.set_alpha_to_one = alpha_one;
  return s;
}

std::vector<int> Strided(int first, int stride, int n) {
  std::vector<int> v;
  for (int k = 0; k < n; ++k)
    v.push_back(first + k * stride);
  return v;
}

// What diffusers' set_timesteps lists for a 1000-step diffusion (tests/
// scheduler_reference_test.cc compares every step count with diffusers itself).
TEST(DiffusersTimestepsTest, KeepsDiffusersTimesteps) {
  EXPECT_EQ(*DiffusersTimesteps(1000, 50, Spacing("leading", 1)), Strided(1, 20, 50));
  EXPECT_EQ(*DiffusersTimesteps(1000, 50, Spacing("leading")), Strided(0, 20, 50));
  EXPECT_EQ(*DiffusersTimesteps(1000, 50, Spacing("trailing")), Strided(19, 20, 50));
  EXPECT_EQ(*DiffusersTimesteps(1000, 10, Spacing("linspace")),
            (std::vector<int>{0, 111, 222, 333, 444, 555, 666, 777, 888, 999}));
  EXPECT_EQ(*DiffusersTimesteps(1000, 3, Spacing("trailing")), (std::vector<int>{332, 666, 999}));
  EXPECT_EQ(*DiffusersTimesteps(1000, 1, Spacing("linspace")), (std::vector<int>{0}));
  EXPECT_EQ(*DiffusersTimesteps(1000, 1, Spacing("trailing")), (std::vector<int>{999}));
  // numpy's arange gives 62 values here; the 61 above −1 are kept.
  const std::vector<int> trailing61 = *DiffusersTimesteps(1000, 61, Spacing("trailing"));
  ASSERT_EQ(trailing61.size(), 61u);
  EXPECT_EQ(trailing61.back(), 999);
  EXPECT_GE(trailing61.front(), 0);
}

TEST(DiffusersTimestepsTest, RefusesTimestepsOutsideTheDiffusion) {
  Result<std::vector<int>> all = DiffusersTimesteps(1000, 1000, Spacing("leading", 1));
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("outside the diffusion's [0, 999]"), std::string::npos)
      << all.status().message();
  EXPECT_FALSE(DiffusersTimesteps(1000, 0, Spacing("leading")).ok());
  EXPECT_FALSE(DiffusersTimesteps(1000, 1001, Spacing("trailing")).ok());
  EXPECT_TRUE(DiffusersTimesteps(1000, 1000, Spacing("leading")).ok());
}

TEST(DiffusersStepsTest, GoesBackOneStrideAndEndsAtTheFinalAlpha) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  // 30 trailing steps: 999, 966, 932, …; each goes to t − 33 (⌊1000/30⌋), not to the next.
  const std::vector<SamplingStep> trailing = *DiffusersSteps(abar, 30, Spacing("trailing"), true);
  ASSERT_EQ(trailing.size(), 30u);
  EXPECT_EQ(trailing[29].timestep, 999);
  EXPECT_EQ(trailing[28].timestep, 966);
  EXPECT_EQ(trailing[27].timestep, 932);
  EXPECT_EQ(trailing[28].alpha_cumprod_prev, abar[933]);
  EXPECT_EQ(trailing[28].alpha_cumprod, abar[966]);
  EXPECT_EQ(trailing[0].timestep, 32);
  EXPECT_EQ(trailing[0].alpha_cumprod_prev, 1.0);
  // DDIM without set_alpha_to_one ends at ᾱ_0; DDPM always at 1.
  const TimestepSpacing sd = Spacing("leading", 1, false);
  EXPECT_EQ(DiffusersSteps(abar, 50, sd, /*ddim=*/true)->front().alpha_cumprod_prev, abar[0]);
  EXPECT_EQ(DiffusersSteps(abar, 50, sd, /*ddim=*/false)->front().alpha_cumprod_prev, 1.0);
  EXPECT_EQ(DiffusersSteps(abar, 50, sd, true)->at(1).alpha_cumprod_prev, abar[1]);
}

TEST(PlmsCallsTest, RepeatTheSecondTimestepToRedoTheFirstStep) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  const std::vector<PlmsCall> sd = *PlmsCalls(abar, 50, Spacing("leading", 1, false));
  ASSERT_EQ(sd.size(), 51u);
  const std::vector<int> first = {sd[0].timestep, sd[1].timestep, sd[2].timestep, sd[3].timestep};
  EXPECT_EQ(first, (std::vector<int>{981, 961, 961, 941}));
  EXPECT_EQ(sd[0].alpha_cumprod, abar[981]);
  EXPECT_EQ(sd[0].alpha_cumprod_prev, abar[961]);
  EXPECT_EQ(sd[1].alpha_cumprod, abar[981]);  // the first step again
  EXPECT_EQ(sd[1].alpha_cumprod_prev, abar[961]);
  EXPECT_EQ(sd[2].alpha_cumprod, abar[961]);
  EXPECT_EQ(sd[2].alpha_cumprod_prev, abar[941]);
  EXPECT_EQ(sd.back().timestep, 1);
  EXPECT_EQ(sd.back().alpha_cumprod_prev, abar[0]);  // set_alpha_to_one false
  // linspace's 2 steps, 0 and 999: the second call redoes the step from 0 + 500, as diffusers.
  const std::vector<PlmsCall> two = *PlmsCalls(abar, 2, Spacing("linspace"));
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(two[1].timestep, 0);
  EXPECT_EQ(two[1].alpha_cumprod, abar[500]);
  EXPECT_EQ(PlmsCalls(abar, 1, Spacing("leading"))->size(), 1u);
  // From a later timestep (image to image) the calls are the list's from there, the second
  // again redoing the first's step; from the second timestep that redoes 981 → 961 (diffusers'
  // counter on the repeated 961).
  const std::vector<PlmsCall> later = *PlmsCalls(abar, 50, Spacing("leading", 1, false), 3);
  ASSERT_EQ(later.size(), 48u);
  EXPECT_EQ(later[0].timestep, 941);
  EXPECT_EQ(later[0].alpha_cumprod_prev, abar[921]);
  EXPECT_EQ(later[1].timestep, 921);
  EXPECT_EQ(later[1].alpha_cumprod, abar[941]);
  EXPECT_EQ(later[1].alpha_cumprod_prev, abar[921]);
  const std::vector<PlmsCall> second = *PlmsCalls(abar, 50, Spacing("leading", 1, false), 1);
  EXPECT_EQ(second[1].timestep, 961);
  EXPECT_EQ(second[1].alpha_cumprod, abar[981]);
}

TEST(EulerStepsTest, InterpolateSigmaAtTheSpacingsTimesteps) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  auto sigma = [&](int t) { return std::sqrt((1 - abar[t]) / abar[t]); };
  // linspace's 4 steps: 999, 666, 333, 0, each to the next σ, the last to 0.
  const std::vector<EulerStep> four = *EulerSteps(abar, 4, Spacing("linspace"));
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(four[0].timestep, 999.0f);
  EXPECT_EQ(four[1].timestep, 666.0f);
  EXPECT_DOUBLE_EQ(four[0].sigma, sigma(999));
  EXPECT_DOUBLE_EQ(four[0].sigma_next, sigma(666));
  EXPECT_EQ(four[3].timestep, 0.0f);
  EXPECT_EQ(four[3].sigma_next, 0.0);
  EXPECT_DOUBLE_EQ(EulerInitialSigma(four, Spacing("linspace")), sigma(999));
  // 7 steps: 999 · k/6 are fractional, σ between its integer neighbours.
  const std::vector<EulerStep> seven = *EulerSteps(abar, 7, Spacing("linspace"));
  EXPECT_FLOAT_EQ(seven[1].timestep, 832.5f);
  EXPECT_NEAR(seven[1].sigma, (sigma(832) + sigma(833)) / 2, 1e-6);
  // leading scales x_T by √(σ² + 1) of its first step.
  const std::vector<EulerStep> leading = *EulerSteps(abar, 50, Spacing("leading", 1));
  EXPECT_EQ(leading[0].timestep, 981.0f);
  EXPECT_DOUBLE_EQ(EulerInitialSigma(leading, Spacing("leading", 1)),
                   std::sqrt(sigma(981) * sigma(981) + 1));
}

// The ancestral split: σ_up² + σ_down² = σ'², σ_down = σ'²/σ in exact arithmetic. Where σ is far
// above σ', σ'² − σ_up² rounds below 0: σ_down is then 0, not NaN (scheduler_fuzz found a NaN
// KDPM2 ancestral midpoint of such a schedule; this pair is one, in doubles).
TEST(SplitAncestralStepTest, DownIsNeverNaN) {
  const AncestralSigmas split = SplitAncestralStep(14.6, 7.3);
  EXPECT_NEAR(split.down, 7.3 * 7.3 / 14.6, 1e-12);
  EXPECT_NEAR(split.up * split.up + split.down * split.down, 7.3 * 7.3, 1e-12);
  const double sigma = 3393281115.7936854, next = 0.040598704408715235;
  ASSERT_LT(next * next - next * next * (sigma * sigma - next * next) / (sigma * sigma), 0.0);
  const AncestralSigmas far = SplitAncestralStep(sigma, next);
  EXPECT_EQ(far.down, 0.0);
  EXPECT_EQ(far.up, next);
}

// KDPM2's midpoints: the geometric mean of σ and σ' (ancestral: of σ and σ_down), where the
// diffusion's σ is that; none on the last step; Karras timesteps rounded, the midpoints' not.
TEST(Kdpm2StepsTest, MidpointsAreGeometricMeansInSigma) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  for (bool ancestral : {false, true}) {
    SCOPED_TRACE(ancestral);
    const std::vector<EulerStep> steps = *Kdpm2Steps(abar, 5, Spacing("linspace"), ancestral);
    const std::vector<EulerStep> euler = *EulerSteps(abar, 5, Spacing("linspace"));
    ASSERT_EQ(steps.size(), 5u);
    for (size_t k = 0; k + 1 < steps.size(); ++k) {
      const EulerStep& s = steps[k];
      EXPECT_EQ(s.timestep, euler[k].timestep);
      EXPECT_EQ(s.sigma_next, euler[k].sigma_next);
      const double up = SplitAncestralStep(s.sigma, s.sigma_next).up;
      const double to = ancestral ? std::sqrt(s.sigma_next * s.sigma_next - up * up) : s.sigma_next;
      EXPECT_NEAR(s.sigma_mid, std::sqrt(s.sigma * to), 1e-12 * s.sigma);
      if (!ancestral) {
        EXPECT_GT(s.timestep_mid, euler[k + 1].timestep);
      }
      EXPECT_LT(s.timestep_mid, s.timestep);
      // The model sees the midpoint where the diffusion's σ is σ_mid.
      const int lo = static_cast<int>(std::floor(s.timestep_mid));
      EXPECT_GE(s.sigma_mid, DiffusionSigma(abar, lo));
      EXPECT_LE(s.sigma_mid, DiffusionSigma(abar, lo + 1));
    }
    EXPECT_EQ(steps.back().sigma_mid, 0.0);
    EXPECT_EQ(steps.back().sigma_next, 0.0);
  }
  TimestepSpacing karras = Spacing("linspace");
  karras.karras = true;
  const Result<std::vector<EulerStep>> rounded = Kdpm2Steps(abar, 6, karras, false);
  ASSERT_TRUE(rounded.ok()) << rounded.status().message();
  for (const EulerStep& s : *rounded)
    EXPECT_EQ(s.timestep, std::nearbyint(s.timestep));
  // DPM-Solver SDE's: KDPM2's midpoints, its Karras timesteps as Euler's (unrounded).
  const std::vector<EulerStep> sde = *DpmSdeSteps(abar, 6, karras);
  const std::vector<EulerStep> euler_karras = *EulerSteps(abar, 6, karras);
  bool fractional = false;
  for (size_t k = 0; k < sde.size(); ++k) {
    EXPECT_EQ(sde[k].timestep, euler_karras[k].timestep);
    EXPECT_EQ(sde[k].sigma_mid, (*rounded)[k].sigma_mid);
    fractional |= sde[k].timestep != std::nearbyint(sde[k].timestep);
  }
  EXPECT_TRUE(fractional);
}

TEST(TimestepSpacingTest, ReadsASchedulerConfig) {
  // Stable Diffusion 1.5's scheduler_config.json (PNDMScheduler), its sampling keys.
  Result<TimestepSpacing> sd = TimestepSpacing::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"_class_name": "PNDMScheduler", "beta_schedule": "scaled_linear",
          "set_alpha_to_one": false, "skip_prk_steps": true, "steps_offset": 1})"));
  ASSERT_TRUE(sd.ok()) << sd.status().message();
  EXPECT_EQ(sd->kind, "leading");
  EXPECT_EQ(sd->steps_offset, 1);
  EXPECT_FALSE(sd->set_alpha_to_one);
  Result<TimestepSpacing> defaults =
      TimestepSpacing::FromDiffusersScheduler(nlohmann::json::object());
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(
      defaults->ToJson(),
      nlohmann::json::parse(R"({"kind": "leading", "steps_offset": 0, "set_alpha_to_one": true})"));

  // An Euler scheduler's spacing defaults to linspace; its other sigma options are refused.
  EXPECT_EQ(TimestepSpacing::FromDiffusersScheduler(
                nlohmann::json::parse(R"({"_class_name": "EulerDiscreteScheduler"})"))
                ->kind,
            "linspace");
  for (const auto& [json, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"_class_name": "HeunDiscreteScheduler", "clip_sample": true})", "clip_sample"},
           {R"({"_class_name": "EulerDiscreteScheduler", "use_karras_sigmas": true,
                "sigma_min": 2, "sigma_max": 1})",
            "sigma_min 2 must be below sigma_max 1"},
           {R"({"_class_name": "EulerDiscreteScheduler", "interpolation_type": "log_linear"})",
            "interpolation_type"},
           {R"({"timestep_spacing": "karras"})", "'karras'"},
           {R"({"timestep_spacing": "respace"})", "respace"},
           {R"({"thresholding": true})", "thresholding"},
           {R"({"steps_offset": -1})", "steps_offset"},
           {R"({"steps_offset": "one"})", "malformed"}}) {
    Result<TimestepSpacing> bad =
        TimestepSpacing::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().message();
  }
  EXPECT_FALSE(Spacing("respace", 1).Validate().ok());
  EXPECT_FALSE(Spacing("respace", 0, false).Validate().ok());
  EXPECT_EQ(Spacing("respace").ToJson(), nlohmann::json::parse(R"({"kind": "respace"})"));
  TimestepSpacing respaced_karras;
  respaced_karras.karras = true;
  EXPECT_FALSE(respaced_karras.Validate().ok());
  TimestepSpacing bounds_alone = Spacing("linspace");
  bounds_alone.sigma_max = 10;
  EXPECT_FALSE(bounds_alone.Validate().ok());

  // use_karras_sigmas where the class has it; an Euler's σ bounds with it.
  Result<TimestepSpacing> euler = TimestepSpacing::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"_class_name": "EulerDiscreteScheduler", "use_karras_sigmas": true,
          "sigma_min": null, "sigma_max": 14.6})"));
  ASSERT_TRUE(euler.ok()) << euler.status().message();
  EXPECT_TRUE(euler->karras);
  EXPECT_EQ(euler->sigma_min, 0);
  EXPECT_EQ(euler->sigma_max, 14.6);
  EXPECT_EQ(euler->ToJson()["karras_sigmas"], true);
  for (const char* name :
       {"HeunDiscreteScheduler", "DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler",
        "DEISMultistepScheduler", "DPMSolverSDEScheduler", "UniPCMultistepScheduler"}) {
    Result<TimestepSpacing> read = TimestepSpacing::FromDiffusersScheduler(
        {{"_class_name", name}, {"use_karras_sigmas", true}, {"sigma_max", 3}});
    ASSERT_TRUE(read.ok()) << name << ": " << read.status().message();
    EXPECT_TRUE(read->karras) << name;
    EXPECT_EQ(read->kind, "linspace") << name;
    EXPECT_EQ(read->sigma_max, 0) << name << ": only Euler's config has sigma_max";
  }
  // DPMSolverSinglestepScheduler has no timestep_spacing: linspace whatever the config says.
  Result<TimestepSpacing> singlestep = TimestepSpacing::FromDiffusersScheduler(
      {{"_class_name", "DPMSolverSinglestepScheduler"}, {"timestep_spacing", "leading"}});
  ASSERT_TRUE(singlestep.ok()) << singlestep.status().message();
  EXPECT_EQ(singlestep->kind, "linspace");
  // A class without Karras σ's ignores the key, as diffusers does.
  EXPECT_FALSE(TimestepSpacing::FromDiffusersScheduler(
                   {{"_class_name", "DDIMScheduler"}, {"use_karras_sigmas", true}})
                   ->karras);
}

// Karras's σ's run from σ_max to σ_min evenly in σ^(1/7); each sits at the timestep whose σ it
// is, log σ interpolated.
TEST(KarrasSigmasTest, SpanTheRangeAndMapBackToTheirTimesteps) {
  const std::vector<double> sigmas = KarrasSigmas(0.03, 14.6, 5);
  ASSERT_EQ(sigmas.size(), 5u);
  EXPECT_DOUBLE_EQ(sigmas.front(), 14.6);
  EXPECT_NEAR(sigmas.back(), 0.03, 1e-15);
  EXPECT_NEAR(std::pow(sigmas[2], 1 / 7.0), (std::pow(14.6, 1 / 7.0) + std::pow(0.03, 1 / 7.0)) / 2,
              1e-12);
  ASSERT_EQ(KarrasSigmas(0.03, 14.6, 1).size(), 1u);
  EXPECT_DOUBLE_EQ(KarrasSigmas(0.03, 14.6, 1)[0], 14.6);
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  for (int t : {0, 1, 250, 998, 999})
    EXPECT_NEAR(SigmaToTimestep(DiffusionSigma(abar, t), abar), t, 1e-9) << t;
  const double half =
      std::exp((std::log(DiffusionSigma(abar, 500)) + std::log(DiffusionSigma(abar, 501))) / 2);
  EXPECT_NEAR(SigmaToTimestep(half, abar), 500.5, 1e-9);
  EXPECT_EQ(SigmaToTimestep(1e-6, abar), 0);
  EXPECT_EQ(SigmaToTimestep(1e6, abar), 999);

  // Euler's Karras steps: from the spacing's first σ to its last, at their timesteps.
  TimestepSpacing spacing = Spacing("linspace");
  spacing.karras = true;
  const std::vector<EulerStep> steps = *EulerSteps(abar, 10, spacing);
  EXPECT_DOUBLE_EQ(steps.front().sigma, DiffusionSigma(abar, 999));
  EXPECT_NEAR(steps.back().sigma, DiffusionSigma(abar, 0), 1e-12);
  EXPECT_EQ(steps.back().sigma_next, 0);
  for (const EulerStep& s : steps)
    EXPECT_NEAR(s.timestep, SigmaToTimestep(s.sigma, abar), 1e-3);
  spacing.sigma_max = 100;
  EXPECT_DOUBLE_EQ(EulerSteps(abar, 10, spacing)->front().sigma, 100);
}

// LMS's coefficients integrate the Lagrange basis over the step: at order 1 the step's dσ; at
// any order they sum to it (the basis sums to 1) and integrate the slopes' σ's exactly.
TEST(LmsCoefficientTest, IntegrateTheLagrangeBasis) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<EulerStep> steps =
      *EulerSteps(diffusion.alphas_cumprod(), 8, Spacing("linspace"));
  for (int k = 0; k < 8; ++k) {
    const double a = steps[k].sigma, b = steps[k].sigma_next;
    EXPECT_NEAR(LmsCoefficient(steps, k, 1, 0), b - a, 1e-12 * std::abs(b - a));
    const int order = std::min(k + 1, 4);
    double sum = 0, moment = 0;
    for (int j = 0; j < order; ++j) {
      sum += LmsCoefficient(steps, k, order, j);
      moment += LmsCoefficient(steps, k, order, j) * steps[k - j].sigma;
    }
    EXPECT_NEAR(sum, b - a, 1e-9 * std::abs(b - a)) << k;
    // Σ_j c_j σ_{k−j} = ∫ τ dτ from order 2, the basis reproducing the polynomial τ.
    if (order >= 2) {
      EXPECT_NEAR(moment, (b * b - a * a) / 2, 1e-9 * std::abs(b * b - a * a)) << k;
    }
  }
}

// Between consecutive timesteps of the schedule, a step's coefficients are the schedule's.
TEST(CoefficientsBetweenTest, AreTheScheduleCoefficientsBetweenNeighbours) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  for (int t : {1, 2, 500, 999}) {
    const StepCoefficients at = CoefficientsAt(diffusion.betas(), diffusion.alphas_cumprod(), t);
    const StepCoefficients between =
        CoefficientsBetween(diffusion.alphas_cumprod()[t], diffusion.alphas_cumprod()[t - 1]);
    EXPECT_NEAR(between.beta, at.beta, 1e-12 * at.beta) << t;
    EXPECT_NEAR(between.posterior_mean_coef1, at.posterior_mean_coef1, 1e-9) << t;
    EXPECT_NEAR(between.posterior_mean_coef2, at.posterior_mean_coef2, 1e-9) << t;
    EXPECT_NEAR(between.posterior_log_variance_clipped, at.posterior_log_variance_clipped, 1e-9)
        << t;
  }
  // From timestep 0 to ᾱ = 1 the posterior variance is 0: diffusers floors it at 1e-20.
  EXPECT_DOUBLE_EQ(
      CoefficientsBetween(diffusion.alphas_cumprod()[0], 1.0).posterior_log_variance_clipped,
      std::log(1e-20));
}

}  // namespace
}  // namespace difftrain
