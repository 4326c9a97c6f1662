#include "model/diffusion/sampler_kind.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"

namespace difftrain {
namespace {

// Each sampler: its flag name, its name in messages, the diffusers scheduler it follows, the
// spacing it takes without one given (its scheduler's default; DDPM and DDIM: DiT's), whether
// that is its only spacing, whether it has Karras σ's, and whether it keeps timesteps of its
// own (the multistep solvers' set_timesteps: N + 1 points, timestep 0's dropped).
struct SamplerRow {
  SamplerKind kind;
  const char* flag;
  const char* name;
  const char* scheduler;
  const char* spacing;
  bool spacing_only;
  bool karras;
  bool own_timesteps;
};
constexpr SamplerRow kSamplers[] = {
    {SamplerKind::kDdpm, "ddpm", "DDPM", "DDPMScheduler", "respace", false, false, false},
    {SamplerKind::kDdim, "ddim", "DDIM", "DDIMScheduler", "respace", false, false, false},
    {SamplerKind::kPndm, "pndm", "PNDM", "PNDMScheduler", "leading", false, false, false},
    {SamplerKind::kEuler, "euler", "Euler", "EulerDiscreteScheduler", "linspace", false, true,
     false},
    {SamplerKind::kEulerAncestral, "euler_ancestral", "Euler ancestral",
     "EulerAncestralDiscreteScheduler", "linspace", false, false, false},
    {SamplerKind::kHeun, "heun", "Heun", "HeunDiscreteScheduler", "linspace", false, true, false},
    {SamplerKind::kLms, "lms", "LMS", "LMSDiscreteScheduler", "linspace", false, true, false},
    {SamplerKind::kKdpm2, "kdpm2", "KDPM2", "KDPM2DiscreteScheduler", "linspace", false, true,
     false},
    {SamplerKind::kKdpm2Ancestral, "kdpm2_ancestral", "KDPM2 ancestral",
     "KDPM2AncestralDiscreteScheduler", "linspace", false, true, false},
    {SamplerKind::kDpmSolver, "dpmsolver", "DPM-Solver", "DPMSolverMultistepScheduler", "linspace",
     false, true, true},
    {SamplerKind::kDpmSolverSinglestep, "dpmsolver_singlestep", "DPM-Solver singlestep",
     "DPMSolverSinglestepScheduler", "linspace", true, true, true},
    {SamplerKind::kDpmSolverSde, "dpmsolver_sde", "DPM-Solver SDE", "DPMSolverSDEScheduler",
     "linspace", false, true, false},
    {SamplerKind::kDeis, "deis", "DEIS", "DEISMultistepScheduler", "linspace", false, true, true},
    {SamplerKind::kUniPc, "unipc", "UniPC", "UniPCMultistepScheduler", "linspace", false, true,
     true},
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

bool HasLinspaceOnly(SamplerKind kind) {
  return RowOf(kind).spacing_only;
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

}  // namespace difftrain
