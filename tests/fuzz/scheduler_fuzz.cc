// libFuzzer target: a pipeline's scheduler_config.json, read as `difftrain sample --pretrained`
// reads it (the diffusion's β's, the timestep spacing, and the options of DPM-Solver++, DEIS,
// UniPC and LCM), then every sampler's steps laid out over the diffusion at 1, 2, 3, 7 and 25
// steps and from a later step (image to image), and every kind of Sampler made from them as
// `difftrain sample` makes it, on arbitrary JSON. Each must give its steps or
// an error, never crash, hang, or allocate without bound (num_train_timesteps sizes the
// diffusion's tables); and every timestep a step names must lie in [0, T): the sampler indexes
// the diffusion's tables with them.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/diffusion/deis.h"
#include "model/diffusion/dpm_solver.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/lcm.h"
#include "model/diffusion/sampler.h"
#include "model/diffusion/timestep_spacing.h"
#include "model/diffusion/unipc.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

namespace {

using namespace difftrain;

int T = 0;  // the diffusion's timesteps, for InRange

void InRange(int t) {
  if (t < 0 || t >= T) std::abort();
}

// Each step's timestep in range, for steps of any kind that have one.
template <typename Step>
void Check(const Result<std::vector<Step>>& steps) {
  if (!steps.ok()) return;
  for (const Step& s : *steps)
    InRange(s.timestep);
}

// Euler's and its kin's timesteps are fractional, in [0, T − 1].
void Check(const Result<std::vector<EulerStep>>& steps) {
  if (!steps.ok()) return;
  for (const EulerStep& s : *steps) {
    if (!(s.timestep >= 0 && s.timestep <= T - 1) ||
        !(s.timestep_mid >= 0 && s.timestep_mid <= T - 1)) {
      std::fprintf(stderr, "a step at timestep %.9g (midpoint %.9g) of T = %d\n", s.timestep,
                   s.timestep_mid, T);
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json json =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  Result<DiffusionConfig> config = DiffusionConfig::FromDiffusersScheduler(json);
  Result<TimestepSpacing> spacing = TimestepSpacing::FromDiffusersScheduler(json);
  Result<DpmSolverOptions> dpm = DpmSolverOptions::FromDiffusersScheduler(json);
  Result<DpmSolverOptions> dpm_single = DpmSolverOptions::FromDiffusersScheduler(json, true);
  Result<DeisOptions> deis = DeisOptions::FromDiffusersScheduler(json);
  Result<UniPcOptions> unipc = UniPcOptions::FromDiffusersScheduler(json);
  Result<LcmOptions> lcm = LcmOptions::FromDiffusersScheduler(json);
  if (!config.ok() || !config->Validate().ok() || !spacing.ok() || !spacing->Validate().ok())
    return 0;
  const GaussianDiffusion diffusion(*config);
  T = diffusion.steps();
  if (T != config->steps || diffusion.alphas_cumprod().size() != size_t(T)) std::abort();
  // As Sampler::Create steps: σ-space samplers take 2^-24 for a terminal ᾱ of 0.
  std::vector<double> abar = diffusion.alphas_cumprod();
  if (abar.back() == 0) abar.back() = std::ldexp(1.0, -24);
  for (int N : {1, 2, 3, 7, 25}) {
    Result<std::vector<int>> kept = DiffusersTimesteps(T, N, *spacing);
    if (kept.ok()) {
      for (int t : *kept)
        InRange(t);
    }
    Check(DiffusersSteps(diffusion.alphas_cumprod(), N, *spacing, /*ddim=*/true));
    Check(PlmsCalls(abar, N, *spacing, N / 2));
    Result<MultistepSchedule> multistep = MultistepTimesteps(abar, N, *spacing);
    if (multistep.ok()) {
      for (int t : multistep->timesteps)
        InRange(t);
    }
    Check(EulerSteps(abar, N, *spacing));
    Check(Kdpm2Steps(abar, N, *spacing, /*ancestral=*/true));
    Check(DpmSdeSteps(abar, N, *spacing));
    if (dpm.ok()) Check(DpmSolverSteps(abar, N, *spacing, *dpm, N / 2));
    if (dpm_single.ok()) Check(DpmSolverSinglestepSteps(abar, N, *spacing, *dpm_single));
    if (deis.ok()) Check(DeisSteps(abar, N, *spacing, *deis));
    if (unipc.ok()) Check(UniPcSteps(abar, N, *spacing, *unipc, N / 2));
    if (lcm.ok() && lcm->Validate().ok()) {
      Check(LcmSteps(abar, N, *lcm));
      Check(TcdSteps(abar, N, *lcm, /*gamma=*/0.3));
    }
    // The whole sampler, as `difftrain sample` makes it, for every kind, from x_T and from an
    // image (half the steps).
    for (int k = 0; k <= static_cast<int>(SamplerKind::kTcd); ++k) {
      SamplerOptions options;
      options.kind = static_cast<SamplerKind>(k);
      options.steps = N;
      options.spacing = *spacing;
      if (dpm.ok())
        options.dpm = options.kind == SamplerKind::kDpmSolverSinglestep && dpm_single.ok()
                          ? *dpm_single
                          : *dpm;
      if (deis.ok()) options.deis = *deis;
      if (unipc.ok()) options.unipc = *unipc;
      if (lcm.ok()) options.lcm = *lcm;
      const DenoiserShape shape{.channels = 1, .height = 2, .width = 2, .learn_sigma = false};
      (void)Sampler::Create(diffusion, shape, options);
      options.strength = 0.5;
      (void)Sampler::Create(diffusion, shape, options);
    }
  }
  return 0;
}
