#include "model/diffusion/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

constexpr int kC = 2, kH = 3, kW = 3;
constexpr size_t kN = kC * kH * kW;
constexpr int kNumClasses = 5;
constexpr SamplerKind kEverySampler[] = {SamplerKind::kDdpm,
                                         SamplerKind::kDdim,
                                         SamplerKind::kPndm,
                                         SamplerKind::kEuler,
                                         SamplerKind::kEulerAncestral,
                                         SamplerKind::kHeun,
                                         SamplerKind::kLms,
                                         SamplerKind::kKdpm2,
                                         SamplerKind::kKdpm2Ancestral,
                                         SamplerKind::kDpmSolver,
                                         SamplerKind::kDpmSolverSinglestep,
                                         SamplerKind::kDpmSolverSde,
                                         SamplerKind::kDeis,
                                         SamplerKind::kUniPc,
                                         SamplerKind::kLcm,
                                         SamplerKind::kTcd};

// A smooth made-up model whose ε depends on x_t, t and the label, and whose v varies in
// (−1, 1): enough to tell conditional from unconditional and one timestep from another.
void ToyModel(const float* x_t, const float* t, const int32_t* y, int B, float* out,
              bool learn_sigma) {
  const size_t out_n = (learn_sigma ? 2 : 1) * kN;
  for (int b = 0; b < B; ++b) {
    for (size_t j = 0; j < kN; ++j) {
      const float x = x_t[b * kN + j];
      out[b * out_n + j] = 0.6f * x + 0.05f * (y[b] + 1) * std::sin(0.01f * t[b] + j);
      if (learn_sigma) out[b * out_n + kN + j] = std::tanh(0.3f * x + 0.1f * y[b]);
    }
  }
}

class SamplerTest : public ::testing::Test {
 protected:
  Sampler Make(SamplerOptions options, bool learn_sigma = true) const {
    DenoiserShape shape{kC, kH, kW, learn_sigma, kNumClasses};
    Result<Sampler> sampler = Sampler::Create(diffusion, shape, options);
    EXPECT_TRUE(sampler.ok()) << sampler.status().message();
    return std::move(sampler).value();
  }
  static Denoiser Toy(bool learn_sigma = true) {
    return [learn_sigma](const float* x, const float* t, const int32_t* y, int B, float* out) {
      ToyModel(x, t, y, B, out, learn_sigma);
    };
  }
  // A perfect denoiser for data that is always `x0`: it returns the exact noise of x_t.
  Denoiser Perfect(const std::vector<float>& x0, bool learn_sigma) const {
    return [this, x0, learn_sigma](const float* x_t, const float* t, const int32_t*, int B,
                                   float* out) {
      const size_t out_n = (learn_sigma ? 2 : 1) * kN;
      for (int b = 0; b < B; ++b) {
        const double abar = diffusion.alphas_cumprod()[static_cast<int>(t[b])];
        for (size_t j = 0; j < kN; ++j) {
          out[b * out_n + j] =
              static_cast<float>((x_t[b * kN + j] - std::sqrt(abar) * x0[j]) / std::sqrt(1 - abar));
          if (learn_sigma) out[b * out_n + kN + j] = 0.0f;
        }
      }
    };
  }
  std::vector<float> Draw(const Sampler& sampler, const Denoiser& model,
                          const std::vector<int32_t>& labels, int64_t first = 0) const {
    std::vector<float> out(labels.size() * kN);
    sampler.Sample(model, labels.data(), static_cast<int>(labels.size()), first, out.data());
    return out;
  }

  GaussianDiffusion diffusion{DiffusionConfig{}};
};

TEST(SpaceTimestepsTest, KeepsDitsTimesteps) {
  // Values from DiT's space_timesteps (tests/reference/diffusion_torch.py ports it).
  const std::vector<int> kept = SpaceTimesteps(1000, 250);
  ASSERT_EQ(kept.size(), 250u);
  EXPECT_EQ(std::vector<int>(kept.begin(), kept.begin() + 4), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(std::vector<int>(kept.begin() + 40, kept.begin() + 46),
            (std::vector<int>{160, 164, 169, 173, 177, 181}));
  EXPECT_EQ(kept.back(), 999);
  EXPECT_EQ(std::accumulate(kept.begin(), kept.end(), 0), 124875);
  const std::vector<int> fifty = SpaceTimesteps(1000, 50);
  EXPECT_EQ(std::vector<int>(fifty.begin(), fifty.begin() + 8),
            (std::vector<int>{0, 20, 41, 61, 82, 102, 122, 143}));
  EXPECT_EQ(SpaceTimesteps(10, 4), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(SpaceTimesteps(1000, 1), (std::vector<int>{0}));
  // Positions 0, 1.25, 2.5, 3.75, 5: Python rounds 2.5 to even.
  EXPECT_EQ(SpaceTimesteps(6, 5), (std::vector<int>{0, 1, 2, 4, 5}));
  std::vector<int> all(7);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(SpaceTimesteps(7, 7), all);
}

// The respaced process's ᾱ at step i is the base process's ᾱ at the kept timestep.
TEST_F(SamplerTest, RespacedProcessKeepsTheAlphaBars) {
  SamplerOptions options;
  options.steps = 50;
  const Sampler sampler = Make(options);
  ASSERT_EQ(sampler.betas().size(), 50u);
  double abar = 1;
  for (size_t i = 0; i < sampler.timesteps().size(); ++i) {
    abar *= 1 - sampler.betas()[i];
    EXPECT_NEAR(abar, diffusion.alphas_cumprod()[sampler.timesteps()[i]], 1e-14) << i;
  }
  // Keeping every step gives back the process (to rounding: β'_k = 1 − ᾱ_k / ᾱ_{k−1}).
  options.steps = 1000;
  const Sampler all = Make(options);
  for (int k = 0; k < 1000; ++k)
    ASSERT_NEAR(all.betas()[k], diffusion.betas()[k], 1e-12 * diffusion.betas()[k]) << k;
}

TEST_F(SamplerTest, ShapesRangeAndDeterminism) {
  for (SamplerKind kind : {SamplerKind::kDdpm, SamplerKind::kDdim}) {
    SamplerOptions options;
    options.kind = kind;
    options.steps = 20;
    options.eta = kind == SamplerKind::kDdim ? 0.5 : 0.0;
    options.cfg_scale = 3;
    options.seed = 11;
    const std::vector<int32_t> labels = {0, 1, 4, 2};
    const std::vector<float> a = Draw(Make(options), Toy(), labels);
    ASSERT_EQ(a.size(), labels.size() * kN);
    for (float v : a) {
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_LE(std::abs(v), 1.0f);
    }
    EXPECT_EQ(Draw(Make(options), Toy(), labels), a);
    options.seed = 12;
    EXPECT_NE(Draw(Make(options), Toy(), labels), a);
  }
}

// Sample n's noise is addressed by n: drawing in batches of any size gives the same samples.
TEST_F(SamplerTest, SamplesDoNotDependOnTheBatch) {
  for (SamplerKind kind : {SamplerKind::kDdpm, SamplerKind::kDdim, SamplerKind::kEulerAncestral,
                           SamplerKind::kDpmSolverSde, SamplerKind::kLcm, SamplerKind::kTcd}) {
    SamplerOptions options;
    options.kind = kind;
    options.steps = 10;
    options.eta = kind == SamplerKind::kDdim ? 1.0 : kind == SamplerKind::kTcd ? 0.3 : 0.0;
    options.cfg_scale = 2.5;
    if (DefaultSpacing(kind) != "respace") {
      options.spacing.kind = "linspace";
      options.clip_denoised = false;
    }
    const Sampler sampler = Make(options);
    const std::vector<int32_t> labels = {3, 1, 4, 1, 0, 2};
    const std::vector<float> whole = Draw(sampler, Toy(), labels);
    std::vector<float> pieces;
    for (int first = 0; first < 6; first += 4) {
      const int B = std::min(4, 6 - first);
      const std::vector<float> part =
          Draw(sampler, Toy(), {labels.begin() + first, labels.begin() + first + B}, first);
      pieces.insert(pieces.end(), part.begin(), part.end());
    }
    EXPECT_EQ(pieces, whole);
    const std::vector<float> third = Draw(sampler, Toy(), {labels[3]}, 3);
    EXPECT_TRUE(std::equal(third.begin(), third.end(), whole.begin() + 3 * kN));
    // The stochastic samplers' seed reaches every sample.
    options.seed = 1;
    EXPECT_NE(Draw(Make(options), Toy(), {labels[3]}, 3), third);
  }
}

// The stochastic samplers sample the data's distribution: with the exact denoiser of Gaussian
// data N(0, s²) (E[x0 | x_t] = √ᾱ s² x_t/(ᾱ s² + 1 − ᾱ)), DPM-Solver SDE's samples have variance
// s² within 3% after 100 steps (measured 0.2452 for 0.25; 0.2155 at 20 steps, 0.2491 at 300),
// Euler ancestral's, of first order, after 999 (0.2472; 0.2211 at 100). DPM-Solver SDE's second
// noise shares its first half with the midpoint's (one Brownian path); drawn independently it
// gives 0.2213 at 100 steps. The standard error of a variance here is 0.7%.
TEST_F(SamplerTest, StochasticSamplersSampleAGaussiansVariance) {
  constexpr double kS2 = 0.25;
  const std::vector<double>& abar_t = diffusion.alphas_cumprod();
  // σ at a fractional timestep as the samplers interpolate it, and ᾱ = 1/(σ² + 1) there.
  const Denoiser exact = [&](const float* x_t, const float* t, const int32_t*, int B, float* out) {
    for (int b = 0; b < B; ++b) {
      const int lo = std::min(static_cast<int>(std::floor(t[b])), 998);
      const double w = t[b] - lo;
      const double sigma =
          (1 - w) * std::sqrt(1 / abar_t[lo] - 1) + w * std::sqrt(1 / abar_t[lo + 1] - 1);
      const double abar = 1 / (sigma * sigma + 1);
      for (size_t j = 0; j < kN; ++j) {
        const double x = x_t[b * kN + j];
        const double x0 = std::sqrt(abar) * kS2 * x / (abar * kS2 + 1 - abar);
        out[b * kN + j] = static_cast<float>((x - std::sqrt(abar) * x0) / std::sqrt(1 - abar));
      }
    }
  };
  for (const auto& [kind, steps] : std::vector<std::pair<SamplerKind, int>>{
           {SamplerKind::kEulerAncestral, 999}, {SamplerKind::kDpmSolverSde, 100}}) {
    SCOPED_TRACE(SamplerName(kind));
    SamplerOptions options;
    options.kind = kind;
    options.steps = steps;
    options.spacing.kind = "linspace";
    options.clip_denoised = false;
    const Sampler sampler = Make(options, /*learn_sigma=*/false);
    const std::vector<float> x = Draw(sampler, exact, std::vector<int32_t>(2000, 0));
    double sum = 0, square = 0;
    for (float v : x) {
      sum += v;
      square += double(v) * v;
    }
    const double mean = sum / x.size(), variance = square / x.size() - mean * mean;
    EXPECT_NEAR(mean, 0.0, 0.02);
    EXPECT_NEAR(variance, kS2, 0.03 * kS2);
  }
}

TEST_F(SamplerTest, DdimWithEtaZeroIsDeterministicGivenXT) {
  SamplerOptions options;
  options.kind = SamplerKind::kDdim;
  options.steps = 25;
  std::vector<float> x_T(3 * kN);
  for (size_t j = 0; j < x_T.size(); ++j)
    x_T[j] = std::sin(1.7f * j);
  const std::vector<int32_t> labels = {0, 1, 2};
  auto denoise = [&](uint64_t seed, double eta) {
    options.seed = seed;
    options.eta = eta;
    std::vector<float> x = x_T;
    Make(options).Denoise(Toy(), labels.data(), 3, 0, x.data());
    return x;
  };
  EXPECT_EQ(denoise(1, 0.0), denoise(2, 0.0));
  EXPECT_NE(denoise(1, 0.5), denoise(2, 0.5));
}

// With a model that knows the data is the point mass x0, every x0 prediction is x0 and every
// sampler must land on it.
TEST_F(SamplerTest, PerfectDenoiserRecoversThePointMass) {
  std::vector<float> x0(kN);
  for (size_t j = 0; j < kN; ++j)
    x0[j] = 0.9f * std::cos(0.7f * j);
  struct Case {
    SamplerKind kind;
    int steps;
    double eta;
    bool learn_sigma, clip;
  };
  for (const Case& c :
       {Case{SamplerKind::kDdpm, 1000, 0, false, true},
        Case{SamplerKind::kDdpm, 50, 0, true, false}, Case{SamplerKind::kDdpm, 7, 0, true, true},
        Case{SamplerKind::kDdim, 50, 0, true, true},
        Case{SamplerKind::kDdim, 20, 1, false, false}}) {
    SamplerOptions options;
    options.kind = c.kind;
    options.steps = c.steps;
    options.eta = c.eta;
    options.clip_denoised = c.clip;
    options.seed = 5;
    const std::vector<float> x =
        Draw(Make(options, c.learn_sigma), Perfect(x0, c.learn_sigma), {0, 1, 2});
    for (size_t k = 0; k < x.size(); ++k) {
      ASSERT_NEAR(x[k], x0[k % kN], 1e-3)
          << "sampler " << static_cast<int>(c.kind) << " steps " << c.steps << " element " << k;
    }
  }
}

// Image to image: an image noised as its scheduler's add_noise (√ᾱ_t at the first step's
// timestep, σ in Euler's scale, α and σα of DPM-Solver's σ) and the last ⌊N·strength⌋ steps
// of a perfect denoiser land on it; a strength that leaves no step, or none in (0, 1], is an
// error, and so is LCM's schedule strength without an image.
TEST_F(SamplerTest, StartsFromAnImageNoisedToItsFirstStep) {
  std::vector<float> x0(kN), noise(kN);
  for (size_t j = 0; j < kN; ++j) {
    x0[j] = 0.9f * std::cos(0.7f * j);
    noise[j] = std::sin(1.3f * j);
  }
  TimestepSpacing leading;
  leading.kind = "leading";
  struct Case {
    SamplerKind kind;
    TimestepSpacing spacing;
  };
  for (const Case& c :
       {Case{SamplerKind::kDdim, TimestepSpacing{}}, Case{SamplerKind::kEuler, leading},
        Case{SamplerKind::kDpmSolver, leading}}) {
    SCOPED_TRACE(SamplerName(c.kind));
    SamplerOptions options;
    options.kind = c.kind;
    options.spacing = c.spacing;
    options.steps = 20;
    options.strength = 0.4;
    options.clip_denoised = false;
    const Sampler sampler = Make(options, false);
    EXPECT_EQ(sampler.steps_run(), 8);
    EXPECT_EQ(sampler.first_step(), 12);
    std::vector<float> x(kN);
    sampler.AddNoise(x0.data(), noise.data(), kN, x.data());
    const double abar = diffusion.alphas_cumprod()[sampler.start_timestep()];
    const double sigma = std::sqrt((1 - abar) / abar);
    const double a = c.kind == SamplerKind::kEuler ? 1 : std::sqrt(abar);
    const double s = c.kind == SamplerKind::kEuler ? sigma : std::sqrt(1 - abar);
    for (size_t j = 0; j < kN; ++j)
      ASSERT_NEAR(x[j], a * x0[j] + s * noise[j], 1e-5) << j;
    const int32_t label = 0;
    sampler.Denoise(Perfect(x0, false), &label, 1, 0, x.data());
    for (size_t j = 0; j < kN; ++j)
      ASSERT_NEAR(x[j], x0[j], 1e-3) << j;
  }
  SamplerOptions options;
  options.steps = 10;
  for (double bad : {0.0, 0.05, 1.5}) {
    options.strength = bad;
    EXPECT_FALSE(Sampler::Create(diffusion, DenoiserShape{kC, kH, kW, true, -1}, options).ok())
        << bad;
  }
  options.strength.reset();
  options.kind = SamplerKind::kLcm;
  options.spacing.kind = "leading";
  options.clip_denoised = false;
  options.lcm.strength = 0.5;
  Result<Sampler> lcm = Sampler::Create(diffusion, DenoiserShape{kC, kH, kW, true, -1}, options);
  ASSERT_FALSE(lcm.ok());
  EXPECT_NE(lcm.status().message().find("for LCM sampling from an image"), std::string::npos);
}

// SDXL's experts (denoising_end, denoising_start): 10 Euler (or DDIM) steps at leading timesteps
// 900, 800, …, 0 are cut at T − round(0.7 T) = 300, the base's 7 at or above it and the
// refiner's 3 below; the base's end and the refiner's start of one cut together run every step,
// as one sampler does. (A multistep solver's orders warm up again at the start, as diffusers'
// do: its halves are not its whole run; tests/sdxl_refiner_reference_test.cc checks them.)
TEST_F(SamplerTest, DenoisingEndAndStartCutEulersStepsAtTheirTimestep) {
  SamplerOptions options;
  for (const SamplerKind kind : {SamplerKind::kEuler, SamplerKind::kDdim}) {
    SCOPED_TRACE(SamplerName(kind));
    options = SamplerOptions();
    options.kind = kind;
    options.spacing.kind = "leading";
    options.steps = 10;
    options.clip_denoised = false;
    const Sampler whole = Make(options, false);
    options.denoising_end = 0.7;
    const Sampler base = Make(options, false);
    EXPECT_EQ(base.steps_run(), 7);
    EXPECT_EQ(base.first_step(), 0);
    options.denoising_end.reset();
    options.denoising_start = 0.7;
    const Sampler refiner = Make(options, false);
    EXPECT_EQ(refiner.steps_run(), 3);
    EXPECT_EQ(refiner.first_step(), 7);
    EXPECT_EQ(refiner.start_timestep(), 200);
    // A model that is not perfect, so that every step shows.
    const Denoiser model = [](const float* x, const float*, const int32_t*, int B, float* out) {
      for (size_t j = 0; j < B * kN; ++j)
        out[j] = 0.5f * x[j];
    };
    const int32_t label = 0;
    std::vector<float> one(kN), two(kN);
    whole.Sample(model, &label, 1, 0, one.data());
    base.Sample(model, &label, 1, 0, two.data());
    EXPECT_NE(two, one);
    refiner.Denoise(model, &label, 1, 0, two.data());
    for (size_t j = 0; j < kN; ++j)
      ASSERT_NEAR(two[j], one[j], 1e-6 * (1 + std::abs(one[j]))) << j;
  }

  // Refused: outside (0, 1), with a strength, with another sampler, leaving no step.
  const auto refusal = [&](const SamplerOptions& o) {
    Result<Sampler> s = Sampler::Create(diffusion, DenoiserShape{kC, kH, kW, true, -1}, o);
    return s.ok() ? std::string("accepted") : s.status().message();
  };
  SamplerOptions bad = options;
  bad.denoising_start = 1.0;
  EXPECT_NE(refusal(bad).find("must be in (0, 1), got 1"), std::string::npos);
  bad = options;
  bad.strength = 0.5;
  EXPECT_NE(refusal(bad).find("not both"), std::string::npos);
  bad = options;
  bad.kind = SamplerKind::kHeun;
  EXPECT_NE(refusal(bad).find("is for the euler, ddim, dpmsolver, deis and unipc samplers"),
            std::string::npos);
  bad = options;
  bad.denoising_end = 0.5;
  EXPECT_NE(refusal(bad).find("leaves none of the 10 steps"), std::string::npos);
}

// Inpainting with a model of the sampled channels alone (KeptImage), every sampler: a mask that
// paints everything samples as no mask does, bit for bit; outside a partial mask the samples end
// on the image itself; and from the second model call on, the model sees the image there noised
// to the call's level with the sample's own x_T (DDIM: √ᾱ_t·x0 + √(1 − ᾱ_t)·z).
TEST_F(SamplerTest, InpaintingKeepsTheImageOutsideItsMask) {
  const int N = 2;
  std::vector<float> x0(N * kN), all(N * kH * kW, 1.0f), half(N * kH * kW);
  for (size_t j = 0; j < x0.size(); ++j)
    x0[j] = 0.8f * std::cos(0.9f * j);
  for (size_t j = 0; j < half.size(); ++j)
    half[j] = j % 3 == 1 ? 1.0f : 0.0f;
  const std::vector<int32_t> labels = {1, 3};
  for (SamplerKind kind : kEverySampler) {
    SCOPED_TRACE(SamplerName(kind));
    SamplerOptions options;
    options.kind = kind;
    options.steps = 8;
    options.seed = 4;
    options.cfg_scale = 2;
    options.spacing.kind = DefaultSpacing(kind) == "respace" ? "leading" : DefaultSpacing(kind);
    options.clip_denoised = false;
    const Sampler sampler = Make(options, false);
    const Denoiser toy = Toy(false);
    const std::vector<float> plain = Draw(sampler, toy, labels);
    std::vector<float> x(N * kN);
    KeptImage everything{x0.data(), all.data(), nullptr};
    sampler.Sample(toy, labels.data(), N, 0, x.data(), &everything);
    EXPECT_EQ(x, plain);
    // From given x_T's z, which are also the image's noise; the second call's inputs (the
    // conditional half of the guided batch).
    std::vector<float> z(N * kN);
    for (size_t e = 0; e < z.size(); ++e)
      z[e] = std::sin(2.1f * e + 0.3f);
    int calls = 0;
    std::vector<float> second;
    const Denoiser watched = [&](const float* x_t, const float* t, const int32_t* y, int B,
                                 float* out) {
      if (calls++ == 1) second.assign(x_t, x_t + N * kN);
      toy(x_t, t, y, B, out);
    };
    KeptImage kept{x0.data(), half.data(), z.data()};
    x = z;
    sampler.Denoise(watched, labels.data(), N, 0, x.data(), &kept);
    ASSERT_EQ(second.size(), N * kN);
    // DDIM's second call is at the second highest of its timesteps.
    const std::vector<int>& t = sampler.timesteps();
    const double abar =
        kind == SamplerKind::kDdim ? diffusion.alphas_cumprod()[t[t.size() - 2]] : 0;
    for (size_t e = 0; e < x.size(); ++e) {
      if (half[e / kN * kH * kW + e % (kH * kW)] == 0) {
        ASSERT_EQ(x[e], x0[e]) << e;
        if (kind == SamplerKind::kDdim) {
          ASSERT_FLOAT_EQ(second[e], std::sqrt(abar) * x0[e] + std::sqrt(1 - abar) * z[e]) << e;
        }
      } else {
        ASSERT_NE(x[e], x0[e]) << e;
      }
    }
  }
}

// Zero terminal SNR: the first step is from ᾱ = 0, where x_t is pure noise and only v tells
// x0 (x0 = −v). Every sampler lands on the point mass of a perfect v-model: DDPM and DDIM
// from ᾱ = 0 itself, the others from 2^−24 in its place (σ ≈ 4096), as diffusers'. Two land
// near it by design, as diffusers' do without zero terminal SNR too: PNDM averages the raw v's
// of its first two calls (at x_999 and x_949) before reading them as ε at x_999, UniPC's last
// step stays at the last timestep's σ (t = 49 here, σ ≈ 0.07).
TEST_F(SamplerTest, ZeroTerminalSnrSamplersRecoverThePointMass) {
  DiffusionConfig config;
  config.prediction = "v";
  config.zero_terminal_snr = true;
  const GaussianDiffusion zero(config);
  ASSERT_EQ(zero.alphas_cumprod().back(), 0.0);
  std::vector<float> x0(kN);
  for (size_t j = 0; j < kN; ++j)
    x0[j] = 0.9f * std::cos(0.7f * j);
  std::vector<float> first_calls;
  // v = √ᾱ·ε − √(1 − ᾱ)·x0 of the exact ε = (x_t − √ᾱ·x0)/√(1 − ᾱ); −x0 at ᾱ = 0.
  const Denoiser perfect_v = [&](const float* x_t, const float* t, const int32_t*, int B,
                                 float* out) {
    first_calls.push_back(t[0]);
    for (int b = 0; b < B; ++b) {
      const double abar = zero.alphas_cumprod()[std::lround(t[b])];
      for (size_t j = 0; j < kN; ++j) {
        const double eps = (x_t[b * kN + j] - std::sqrt(abar) * x0[j]) / std::sqrt(1 - abar);
        out[b * kN + j] = static_cast<float>(std::sqrt(abar) * eps - std::sqrt(1 - abar) * x0[j]);
      }
    }
  };
  const DenoiserShape shape{kC, kH, kW, /*learn_sigma=*/false, kNumClasses};
  for (SamplerKind kind : kEverySampler) {
    for (const char* spacing : {"respace", "trailing"}) {
      SamplerOptions options;
      options.kind = kind;
      options.steps = 20;
      options.seed = 3;
      // DPM-Solver singlestep has linspace only, which starts at T − 1 too (LCM's timesteps
      // likewise).
      options.spacing.kind =
          HasOneSpacing(kind) && spacing != std::string("respace") ? DefaultSpacing(kind) : spacing;
      if (DefaultSpacing(kind) != "respace") {
        if (options.spacing.kind == "respace") continue;  // diffusers' samplers: trailing only
        options.clip_denoised = false;
      }
      SCOPED_TRACE(std::string(spacing) + " " + std::to_string(static_cast<int>(kind)));
      Result<Sampler> sampler = Sampler::Create(zero, shape, options);
      ASSERT_TRUE(sampler.ok()) << sampler.status().message();
      first_calls.clear();
      const std::vector<float> x = Draw(*sampler, perfect_v, {0, 1});
      ASSERT_FALSE(first_calls.empty());
      EXPECT_EQ(first_calls.front(), 999.0f);  // both spacings start at the last timestep
      // PNDM, UniPC, DEIS and TCD end at σ_0, x0 plus σ_0 ≈ 0.01 times the noise left.
      const bool near = kind == SamplerKind::kPndm || kind == SamplerKind::kUniPc ||
                        kind == SamplerKind::kDeis || kind == SamplerKind::kTcd;
      for (size_t k = 0; k < x.size(); ++k)
        ASSERT_NEAR(x[k], x0[k % kN], near ? 3e-2 : 1e-4) << k;
    }
  }
}

// A model of v-prediction is sampled through the ε its output implies at each step: the v
// of the toy model's ε, sampled from a v-prediction diffusion, gives the toy model's samples
// (DDIM and DDPM, with guidance, whose combination of v's is that of the ε's).
TEST_F(SamplerTest, VPredictionSamplesTheModelOfTheEpsilonItImplies) {
  DiffusionConfig v_config;
  v_config.prediction = "v";
  const GaussianDiffusion v_diffusion(v_config);
  const Denoiser toy = Toy(/*learn_sigma=*/false);
  const Denoiser as_v = [&](const float* x_t, const float* t, const int32_t* y, int B, float* out) {
    toy(x_t, t, y, B, out);
    for (int b = 0; b < B; ++b) {
      const double abar = v_diffusion.alphas_cumprod()[static_cast<int>(t[b])];
      for (size_t j = 0; j < kN; ++j) {
        // v = √ᾱ·ε − √(1 − ᾱ)·x0 with x0 = (x_t − √(1 − ᾱ)·ε) / √ᾱ.
        const double eps = out[b * kN + j], x = x_t[b * kN + j];
        const double x0 = (x - std::sqrt(1 - abar) * eps) / std::sqrt(abar);
        out[b * kN + j] = static_cast<float>(std::sqrt(abar) * eps - std::sqrt(1 - abar) * x0);
      }
    }
  };
  for (SamplerKind kind : {SamplerKind::kDdim, SamplerKind::kDdpm}) {
    SamplerOptions options;
    options.kind = kind;
    options.steps = 25;
    options.cfg_scale = 3;
    options.seed = 9;
    DenoiserShape shape{kC, kH, kW, /*learn_sigma=*/false, kNumClasses};
    Result<Sampler> eps_sampler = Sampler::Create(diffusion, shape, options);
    Result<Sampler> v_sampler = Sampler::Create(v_diffusion, shape, options);
    ASSERT_TRUE(eps_sampler.ok() && v_sampler.ok());
    const std::vector<float> expected = Draw(*eps_sampler, toy, {0, 3, 4});
    const std::vector<float> got = Draw(*v_sampler, as_v, {0, 3, 4});
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_NEAR(got[k], expected[k], 2e-4) << "sampler " << static_cast<int>(kind) << " " << k;
    // Read as ε, the same outputs sample something else: the sampler does convert.
    EXPECT_GT(std::abs(Draw(*eps_sampler, as_v, {0, 3, 4})[0] - expected[0]), 1e-2);
  }
}

// A video model trained with frame-correlated noise starts (and, DDPM, steps) from noise of
// the same correlation: under a model that predicts no noise, DDIM's x_T survives scaled, so
// the frames of a sample correlate as the prior does.
TEST_F(SamplerTest, FrameCorrelatedNoiseReachesTheSamples) {
  const Denoiser silent = [](const float*, const float*, const int32_t*, int B, float* out) {
    std::fill(out, out + B * kN, 0.0f);  // ε only (no learned σ)
  };
  auto frame_correlation = [&](double rho, SamplerKind kind) {
    DiffusionConfig config;
    config.frame_noise_correlation = rho;
    const GaussianDiffusion correlated(config);
    SamplerOptions options;
    options.kind = kind;
    options.steps = 10;
    options.seed = 4;
    options.clip_denoised = false;  // keeps the noise Gaussian
    // The toy's sample as 2 frames of one channel.
    static_assert(kC == 2);
    DenoiserShape shape{1, kH, kW, /*learn_sigma=*/false, kNumClasses, /*frames=*/2};
    Result<Sampler> sampler = Sampler::Create(correlated, shape, options);
    EXPECT_TRUE(sampler.ok()) << sampler.status().message();
    const std::vector<float> x = Draw(*sampler, silent, std::vector<int32_t>(200, 0));
    double cross = 0, first = 0, second = 0;
    for (size_t b = 0; b < 200; ++b) {
      for (size_t j = 0; j < kN / 2; ++j) {
        const double u = x[b * kN + j], v = x[b * kN + kN / 2 + j];
        cross += u * v;
        first += u * u;
        second += v * v;
      }
    }
    return cross / std::sqrt(first * second);
  };
  EXPECT_NEAR(frame_correlation(0.0, SamplerKind::kDdim), 0.0, 0.1);
  EXPECT_NEAR(frame_correlation(0.7, SamplerKind::kDdim), 0.7, 0.1);
  EXPECT_NEAR(frame_correlation(0.7, SamplerKind::kDdpm), 0.7, 0.1);
}

// g = 1 is the conditional model alone: one batch of N, the labels as given.
TEST_F(SamplerTest, GuidanceScaleOneIsTheConditionalModel) {
  SamplerOptions options;
  options.steps = 5;
  const Sampler sampler = Make(options);
  const std::vector<int32_t> labels = {2, 0};
  int calls = 0;
  const Denoiser checked = [&](const float* x, const float* t, const int32_t* y, int B,
                               float* out) {
    ++calls;
    EXPECT_EQ(B, 2);
    EXPECT_EQ(std::vector<int32_t>(y, y + B), labels);
    ToyModel(x, t, y, B, out, true);
  };
  EXPECT_EQ(Draw(sampler, checked, labels), Draw(sampler, Toy(), labels));
  EXPECT_EQ(calls, 5);
}

// Guided sampling equals sampling with a model that itself returns ε_u + g(ε_c − ε_u) (and
// the conditional v), i.e. the doubled batch is split and combined as intended.
TEST_F(SamplerTest, GuidanceCombinesConditionalAndUnconditional) {
  constexpr double g = 3.0;
  const Denoiser combined = [](const float* x, const float* t, const int32_t* y, int B,
                               float* out) {
    std::vector<float> cond(B * 2 * kN), uncond(B * 2 * kN);
    std::vector<int32_t> null(B, kNumClasses);
    ToyModel(x, t, y, B, cond.data(), true);
    ToyModel(x, t, null.data(), B, uncond.data(), true);
    for (size_t k = 0; k < cond.size(); ++k) {
      const bool eps = k % (2 * kN) < kN;
      out[k] = eps ? static_cast<float>(uncond[k] + g * (double(cond[k]) - uncond[k])) : cond[k];
    }
  };
  for (SamplerKind kind : {SamplerKind::kDdpm, SamplerKind::kDdim}) {
    SamplerOptions options;
    options.kind = kind;
    options.steps = 10;
    options.seed = 3;
    const std::vector<float> plain = Draw(Make(options), combined, {1, 4, 0});
    options.cfg_scale = g;
    const std::vector<float> guided = Draw(Make(options), Toy(), {1, 4, 0});
    for (size_t k = 0; k < plain.size(); ++k)
      ASSERT_NEAR(guided[k], plain[k], 1e-5) << k;
  }
}

// A made-up text model: ε depends on x_t, t and the text embedding [2, 3] (a zero text is
// the unconditional one).
void ToyTextModel(const float* x_t, const float* t, const float* context, int B, float* out) {
  for (int b = 0; b < B; ++b) {
    float text = 0;
    for (int i = 0; i < 6; ++i)
      text += (i + 1) * context[b * 6 + i];
    for (size_t j = 0; j < kN; ++j)
      out[b * kN + j] = 0.6f * x_t[b * kN + j] + 0.05f * text * std::sin(0.01f * t[b] + j);
  }
}

// Guidance from prompts: DDIM with prompts, guided, equals the unguided sampler on the
// explicit ε(x, ∅) + g · (ε(x, prompt) − ε(x, ∅)) with ∅ the all-zero embedding, or the null
// text given (a pretrained model's empty prompt).
TEST_F(SamplerTest, TextGuidanceCombinesPromptAndUnconditionalText) {
  constexpr double g = 2.5;
  const std::vector<float> prompts = {0.5f,  -1, 0.25f, 2, 0,  1,      // prompt 0
                                      -0.5f, 1,  1,     0, -2, 0.5f};  // prompt 1
  std::vector<float> previous;
  for (const std::vector<float>& null_text :
       {std::vector<float>{}, std::vector<float>{0.3f, 0.1f, -0.7f, 0, 1, 0.2f}}) {
    SCOPED_TRACE(null_text.empty() ? "zeros" : "a null text");
    const Denoiser combined = [&prompts, &null_text](const float* x, const float* t,
                                                     const int32_t* y, int B, float* out) {
      std::vector<float> context(B * 6), unconditional(B * 6, 0.0f), cond(B * kN), uncond(B * kN);
      for (int b = 0; b < B; ++b) {
        std::copy_n(prompts.data() + y[b] * 6, 6, context.data() + b * 6);
        if (!null_text.empty()) std::copy_n(null_text.data(), 6, unconditional.data() + b * 6);
      }
      ToyTextModel(x, t, context.data(), B, cond.data());
      ToyTextModel(x, t, unconditional.data(), B, uncond.data());
      for (size_t k = 0; k < cond.size(); ++k)
        out[k] = static_cast<float>(uncond[k] + g * (double(cond[k]) - uncond[k]));
    };
    const Denoiser text = PromptDenoiser(ToyTextModel, prompts, 2 * 3, null_text);
    SamplerOptions options;
    options.kind = SamplerKind::kDdim;
    options.steps = 10;
    options.seed = 4;
    const DenoiserShape shape{kC, kH, kW, /*learn_sigma=*/false, /*null_class=*/2};
    const std::vector<int32_t> rows = {1, 0, 1};
    std::vector<float> plain(rows.size() * kN), guided(rows.size() * kN);
    Result<Sampler> unguided = Sampler::Create(diffusion, shape, options);
    ASSERT_TRUE(unguided.ok());
    unguided->Sample(combined, rows.data(), 3, 0, plain.data());
    options.cfg_scale = g;
    Result<Sampler> with_guidance = Sampler::Create(diffusion, shape, options);
    ASSERT_TRUE(with_guidance.ok());
    with_guidance->Sample(text, rows.data(), 3, 0, guided.data());
    for (size_t k = 0; k < plain.size(); ++k)
      ASSERT_NEAR(guided[k], plain[k], 1e-5) << k;
    // Samples of the two prompts differ, and the null text changes them.
    EXPECT_NE(std::vector<float>(guided.begin(), guided.begin() + kN),
              std::vector<float>(guided.begin() + kN, guided.begin() + 2 * kN));
    EXPECT_NE(guided, previous);
    previous = guided;
  }
}

// Guidance limited to an interval of timesteps: steps inside it run the doubled batch and
// combine as above, steps outside run the conditional model alone. An interval holding
// every step is plain guidance; one holding none is no guidance.
TEST_F(SamplerTest, GuidanceIntervalGuidesOnlyItsSteps) {
  SamplerOptions options;
  options.kind = SamplerKind::kDdim;
  options.steps = 10;  // timesteps 0, 111, 222, …, 999
  options.cfg_scale = 3.0;
  const std::vector<int32_t> labels = {1, 4};
  const std::vector<float> guided_everywhere = Draw(Make(options), Toy(), labels);

  options.cfg_from = 0;
  options.cfg_to = 999;
  EXPECT_EQ(Draw(Make(options), Toy(), labels), guided_everywhere);

  options.cfg_from = 300;
  options.cfg_to = 700;
  std::vector<int> guided_timesteps;
  const Denoiser recorded = [&](const float* x, const float* t, const int32_t* y, int B,
                                float* out) {
    if (B == 4) {
      guided_timesteps.push_back(static_cast<int>(t[0]));
      EXPECT_EQ(std::vector<int32_t>(y, y + B), (std::vector<int32_t>{1, 4, 5, 5}));
    } else {
      EXPECT_EQ(B, 2);
    }
    ToyModel(x, t, y, B, out, true);
  };
  const std::vector<float> partly = Draw(Make(options), recorded, labels);
  EXPECT_EQ(guided_timesteps, (std::vector<int>{666, 555, 444, 333}));
  EXPECT_NE(partly, guided_everywhere);

  options.cfg_from = 1000;
  options.cfg_to = 2000;  // past every timestep
  SamplerOptions unguided = options;
  unguided.cfg_scale = 1.0;
  EXPECT_EQ(Draw(Make(options), Toy(), labels), Draw(Make(unguided), Toy(), labels));
}

// v = −1 selects the posterior variance, which is what a model without learn_sigma samples
// with: the two must agree bit for bit.
TEST_F(SamplerTest, LearnedVarianceAtMinusOneIsTheFixedSmallVariance) {
  SamplerOptions options;
  options.steps = 10;
  options.seed = 9;
  const Denoiser learned = [](const float* x, const float* t, const int32_t* y, int B, float* out) {
    std::vector<float> eps(B * kN);
    ToyModel(x, t, y, B, eps.data(), false);
    for (int b = 0; b < B; ++b) {
      std::copy_n(eps.begin() + b * kN, kN, out + b * 2 * kN);
      std::fill_n(out + b * 2 * kN + kN, kN, -1.0f);
    }
  };
  EXPECT_EQ(Draw(Make(options, true), learned, {0, 3}),
            Draw(Make(options, false), Toy(false), {0, 3}));
}

TEST_F(SamplerTest, RejectsBadOptions) {
  DenoiserShape shape{kC, kH, kW, true, kNumClasses};
  auto error = [&](SamplerOptions options, DenoiserShape s) {
    Result<Sampler> sampler = Sampler::Create(diffusion, s, options);
    return sampler.ok() ? std::string("ok") : sampler.status().message();
  };
  SamplerOptions options;
  options.steps = 0;
  EXPECT_NE(error(options, shape).find("between 1 and the diffusion's 1000 steps"),
            std::string::npos);
  options.steps = 1001;
  EXPECT_NE(error(options, shape).find("got 1001"), std::string::npos);
  options = {};
  options.eta = 0.5;
  EXPECT_NE(error(options, shape).find("DDIM"), std::string::npos);
  options.kind = SamplerKind::kDdim;
  options.eta = 1.5;
  EXPECT_NE(error(options, shape).find("eta must be in [0, 1]"), std::string::npos);
  options = {};
  options.cfg_scale = 4;
  DenoiserShape unconditional = shape;
  unconditional.null_class = -1;
  EXPECT_NE(error(options, unconditional).find("no null class"), std::string::npos);
  EXPECT_EQ(error(options, shape), "ok");
  options.cfg_from = 600;
  options.cfg_to = 100;
  EXPECT_NE(error(options, shape).find("guidance interval [600, 100]"), std::string::npos);
  options.cfg_from = -1;
  EXPECT_NE(error(options, shape).find("guidance interval [-1, 100]"), std::string::npos);
  EXPECT_FALSE(ParseSamplerKind("euler_a").ok());
  options = {};
  options.clip_denoised = false;
  options.spacing.kind = "leading";
  options.spacing.karras = true;
  options.kind = SamplerKind::kPndm;
  EXPECT_NE(error(options, shape).find("Karras sigmas are for"), std::string::npos);
  options.kind = SamplerKind::kDdim;
  EXPECT_NE(error(options, shape).find("Karras sigmas are for"), std::string::npos);
  for (SamplerKind k : {SamplerKind::kEuler, SamplerKind::kHeun, SamplerKind::kKdpm2,
                        SamplerKind::kKdpm2Ancestral, SamplerKind::kDpmSolver,
                        SamplerKind::kDpmSolverSde, SamplerKind::kDeis, SamplerKind::kUniPc}) {
    options.kind = k;
    EXPECT_EQ(error(options, shape), "ok");
  }
  // DPM-Solver singlestep: linspace only, no SDE.
  options.kind = SamplerKind::kDpmSolverSinglestep;
  EXPECT_NE(error(options, shape).find("linspace only, not leading"), std::string::npos);
  options.spacing.kind = "linspace";
  EXPECT_EQ(error(options, shape), "ok");
  options.dpm.sde = true;
  EXPECT_NE(error(options, shape).find("DPM-Solver singlestep has no SDE"), std::string::npos);
  options.dpm.sde = false;
  options.guidance_rescale = 1.5;
  EXPECT_NE(error(options, shape).find("guidance rescale must be in [0, 1]"), std::string::npos);
  options = {};
  options.kind = SamplerKind::kUniPc;
  options.clip_denoised = false;
  EXPECT_NE(error(options, shape).find("UniPCMultistepScheduler"), std::string::npos);
}

// Guidance rescale scales each sample's guided output to φ · std(cond)/std(guided) + 1 − φ of
// itself: at φ = 1 the guided output has the conditional output's standard deviation.
TEST_F(SamplerTest, GuidanceRescaleMatchesTheConditionalDeviation) {
  SamplerOptions options;
  options.kind = SamplerKind::kDdim;
  options.steps = 1;
  options.cfg_scale = 5;
  options.clip_denoised = false;
  // A model whose conditional output is x and whose unconditional output is x/2 + 0.3.
  std::vector<float> seen;
  const Denoiser affine = [&](const float* x, const float*, const int32_t* y, int B, float* out) {
    for (int b = 0; b < B; ++b) {
      for (size_t j = 0; j < kN; ++j) {
        const float v = x[(b % (B / 2)) * kN + j];
        out[b * 2 * kN + j] = y[b] == kNumClasses ? v / 2 + 0.3f : v;
        out[b * 2 * kN + kN + j] = 0;
      }
    }
  };
  std::vector<float> x(kN);
  for (size_t j = 0; j < kN; ++j)
    x[j] = std::sin(0.7f * j);
  const auto deviation = [](const std::vector<double>& v) {
    double mean = 0, square = 0;
    for (double e : v)
      mean += e;
    mean /= v.size();
    for (double e : v)
      square += (e - mean) * (e - mean);
    return std::sqrt(square / (v.size() - 1));
  };
  std::vector<double> cond(x.begin(), x.end()), guided(kN);
  for (size_t j = 0; j < kN; ++j)
    guided[j] = (x[j] / 2 + 0.3) + 5 * (x[j] - (x[j] / 2 + 0.3));
  for (double phi : {0.0, 0.7, 1.0}) {
    options.guidance_rescale = phi;
    Result<Sampler> sampler = Sampler::Create(diffusion, {kC, kH, kW, true, kNumClasses}, options);
    ASSERT_TRUE(sampler.ok()) << sampler.status().message();
    // One DDIM step from timestep 0 to ᾱ = 1 returns x0 = (x − √(1 − ᾱ) ε)/√ᾱ: ε is read back.
    std::vector<float> got = x;
    const int32_t label = 1;
    sampler->Denoise(affine, &label, 1, 0, got.data());
    const StepCoefficients& c = sampler->coefficients()[0];
    const double factor = phi * deviation(cond) / deviation(guided) + 1 - phi;
    for (size_t j = 0; j < kN; j += 7) {
      const double eps = guided[j] * factor;
      EXPECT_NEAR(got[j], c.PredictX0(x[j], eps), 1e-4) << phi << " " << j;
    }
  }
}

}  // namespace
}  // namespace difftrain
