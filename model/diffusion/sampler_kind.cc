#include "model/diffusion/sampler_kind.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"

namespace difftrain {
namespace {

// Each sampler: its flag name, its name in messages, the diffusers scheduler it follows, the
// spacing it takes without one given (its scheduler's default; DDPM and DDIM: DiT's), where its
// steps fall when that is its only spacing (else null), whether it has Karras σ's, whether it
// keeps timesteps of its own (the multistep solvers' set_timesteps: N + 1 points, timestep 0's
// dropped; LCM's distillation schedule), and its class's default β's.
enum class Betas { kDdpm, kSd, kSdScaled };
struct SamplerRow {
  SamplerKind kind;
  const char* flag;
  const char* name;
  const char* scheduler;
  const char* spacing;
  const char* one_spacing;
  bool karras;
  bool own_timesteps;
  Betas betas;
};
constexpr SamplerRow kSamplers[] = {
    {SamplerKind::kDdpm, "ddpm", "DDPM", "DDPMScheduler", "respace", nullptr, false, false,
     Betas::kDdpm},
    {SamplerKind::kDdim, "ddim", "DDIM", "DDIMScheduler", "respace", nullptr, false, false,
     Betas::kDdpm},
    {SamplerKind::kPndm, "pndm", "PNDM", "PNDMScheduler", "leading", nullptr, false, false,
     Betas::kDdpm},
    {SamplerKind::kEuler, "euler", "Euler", "EulerDiscreteScheduler", "linspace", nullptr, true,
     false, Betas::kDdpm},
    {SamplerKind::kEulerAncestral, "euler_ancestral", "Euler ancestral",
     "EulerAncestralDiscreteScheduler", "linspace", nullptr, false, false, Betas::kDdpm},
    {SamplerKind::kHeun, "heun", "Heun", "HeunDiscreteScheduler", "linspace", nullptr, true, false,
     Betas::kSd},
    {SamplerKind::kLms, "lms", "LMS", "LMSDiscreteScheduler", "linspace", nullptr, true, false,
     Betas::kDdpm},
    {SamplerKind::kKdpm2, "kdpm2", "KDPM2", "KDPM2DiscreteScheduler", "linspace", nullptr, true,
     false, Betas::kSd},
    {SamplerKind::kKdpm2Ancestral, "kdpm2_ancestral", "KDPM2 ancestral",
     "KDPM2AncestralDiscreteScheduler", "linspace", nullptr, true, false, Betas::kSd},
    {SamplerKind::kDpmSolver, "dpmsolver", "DPM-Solver", "DPMSolverMultistepScheduler", "linspace",
     nullptr, true, true, Betas::kDdpm},
    {SamplerKind::kDpmSolverSinglestep, "dpmsolver_singlestep", "DPM-Solver singlestep",
     "DPMSolverSinglestepScheduler", "linspace", "by linspace", true, true, Betas::kDdpm},
    {SamplerKind::kDpmSolverSde, "dpmsolver_sde", "DPM-Solver SDE", "DPMSolverSDEScheduler",
     "linspace", nullptr, true, false, Betas::kSd},
    {SamplerKind::kDeis, "deis", "DEIS", "DEISMultistepScheduler", "linspace", nullptr, true, true,
     Betas::kDdpm},
    {SamplerKind::kUniPc, "unipc", "UniPC", "UniPCMultistepScheduler", "linspace", nullptr, true,
     true, Betas::kDdpm},
    {SamplerKind::kLcm, "lcm", "LCM", "LCMScheduler", "leading",
     "on the distillation's original_inference_steps timesteps", false, true, Betas::kSdScaled},
    {SamplerKind::kTcd, "tcd", "TCD", "TCDScheduler", "leading",
     "on the distillation's original_inference_steps timesteps", false, true, Betas::kSdScaled},
};

const SamplerRow& RowOf(SamplerKind kind) {
  for (const SamplerRow& s : kSamplers) {
    if (s.kind == kind) return s;
  }
  DT_CHECK(false, "sampler kind {}", static_cast<int>(kind));
  return kSamplers[0];
}

}  // namespace

Result<SamplerKind> ParseSamplerKind(const std::string& name) {
  std::vector<std::string> flags;
  for (const SamplerRow& s : kSamplers) {
    if (name == s.flag) return s.kind;
    flags.push_back(s.flag);
  }
  return Errorf("unknown sampler '{}' (expected {})", name, fmt::join(flags, ", "));
}

std::string SamplerFlag(SamplerKind kind) {
  return RowOf(kind).flag;
}

std::string SamplerName(SamplerKind kind) {
  return RowOf(kind).name;
}

std::string SchedulerClassOf(SamplerKind kind) {
  return RowOf(kind).scheduler;
}

std::string DefaultSpacing(SamplerKind kind) {
  return RowOf(kind).spacing;
}

bool HasOneSpacing(SamplerKind kind) {
  return RowOf(kind).one_spacing != nullptr;
}

std::string OneSpacingWords(SamplerKind kind) {
  const char* words = RowOf(kind).one_spacing;
  return words != nullptr ? words : "";
}

bool TakesKarrasSigmas(SamplerKind kind) {
  return RowOf(kind).karras;
}

bool KeepsItsOwnTimesteps(SamplerKind kind) {
  return RowOf(kind).own_timesteps;
}

std::string KarrasSamplerNames() {
  std::vector<std::string> names;
  for (const SamplerRow& s : kSamplers) {
    if (s.karras) names.push_back(s.flag);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

std::optional<SamplerKind> SamplerOfScheduler(const std::string& scheduler_class) {
  for (const SamplerRow& s : kSamplers) {
    if (scheduler_class == s.scheduler) return s.kind;
  }
  return std::nullopt;
}

BetaDefaults DiffusersBetaDefaults(const std::string& scheduler_class) {
  const std::optional<SamplerKind> sampler = SamplerOfScheduler(scheduler_class);
  const Betas betas = sampler ? RowOf(*sampler).betas : Betas::kDdpm;
  if (betas == Betas::kDdpm) return {};
  return {0.00085, 0.012, betas == Betas::kSd ? "linear" : "scaled_linear"};
}

}  // namespace difftrain
