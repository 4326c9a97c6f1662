// The samplers by name, and the diffusers scheduler class each follows: one table
// (sampler_kind.cc) that the samplers (sampler.h), the spacing read from a scheduler config
// (timestep_spacing.h) and the CLI all read.
//
// DDPM (ancestral), DDIM, PNDM's pseudo linear multistep (diffusers' PNDMScheduler with
// skip_prk_steps; N steps make N + 1 model calls), Euler (diffusers' EulerDiscreteScheduler,
// s_churn 0), Euler ancestral (EulerAncestralDiscreteScheduler: Euler's steps, each to
// σ_down = √(σ'² − σ_up²), σ_up = σ'·√(σ² − σ'²)/σ, then noise of σ_up added) or Heun
// (HeunDiscreteScheduler: Euler's steps, each but the last corrected by a second model call at
// its end, the mean of the two slopes taken; 2N − 1 calls) or LMS (LMSDiscreteScheduler:
// Euler's steps, each with the linear multistep combination of the last 4 slopes,
// LmsCoefficient) or KDPM2 (KDPM2DiscreteScheduler, k-diffusion's DPM2: each step but the last
// takes the slope at its midpoint σ_mid = √(σ·σ'), reached by an Euler half step; 2N − 1 calls)
// or KDPM2 ancestral (KDPM2AncestralDiscreteScheduler: the same to σ_down, the midpoint
// √(σ·σ_down), then noise of σ_up) or DPM-Solver SDE (DPMSolverSDEScheduler, k-diffusion's DPM++
// SDE: two ancestral half steps, to the midpoint √(σ·σ') and from σ again to σ' with the
// midpoint's x0, on Brownian noise; 2N − 1 calls); PNDM, Euler, Heun, LMS and KDPM2 are
// deterministic (timestep_spacing.h). DPM-Solver++ multistep and singlestep (dpm_solver.h), DEIS
// (deis.h), UniPC (unipc.h), LCM and TCD (LCMScheduler, TCDScheduler: lcm.h) likewise.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace difftrain {

enum class SamplerKind {
  kDdpm,
  kDdim,
  kPndm,
  kEuler,
  kEulerAncestral,
  kHeun,
  kLms,
  kKdpm2,
  kKdpm2Ancestral,
  kDpmSolver,
  kDpmSolverSinglestep,
  kDpmSolverSde,
  kDeis,
  kUniPc,
  kLcm,
  kTcd
};

// "ddpm", "ddim", "pndm", "euler", "euler_ancestral", "heun", "lms", "kdpm2",
// "kdpm2_ancestral", "dpmsolver", "dpmsolver_singlestep", "dpmsolver_sde", "deis", "unipc",
// "lcm" or "tcd".
Result<SamplerKind> ParseSamplerKind(const std::string& name);
// Its name in messages: "DDPM", "Euler ancestral", "DPM-Solver singlestep" …
std::string SamplerName(SamplerKind kind);
// The diffusers scheduler class it follows: "EulerDiscreteScheduler" …
std::string SchedulerClassOf(SamplerKind kind);
// The spacing a sampler takes where none is given: DiT's respacing ("respace") for DDPM and
// DDIM, its scheduler's default for the others (leading for PNDM, else linspace).
std::string DefaultSpacing(SamplerKind kind);
// Whether it has that spacing only: DPMSolverSinglestepScheduler spaces its steps by linspace
// and has no timestep_spacing key (nor steps_offset); LCMScheduler and TCDScheduler have the key
// and ignore it, their steps falling on the distillation's timesteps (lcm.h).
bool HasOneSpacing(SamplerKind kind);
// Where such a sampler's steps fall, for messages: "by linspace" …
std::string OneSpacingWords(SamplerKind kind);
// Whether a sampler can step on Karras σ's (TimestepSpacing::karras): Euler, Heun, LMS, KDPM2
// (ancestral too), DPM-Solver++ (multistep, singlestep, SDE), DEIS and UniPC, as their
// schedulers' use_karras_sigmas.
bool TakesKarrasSigmas(SamplerKind kind);
// Whether it keeps timesteps of its own rather than a spacing's (DiffusersTimesteps): DPM-Solver++
// (multistep, singlestep), DEIS and UniPC (MultistepTimesteps, dpm_solver.h), LCM and TCD
// (LcmSteps, TcdSteps).
bool KeepsItsOwnTimesteps(SamplerKind kind);
// Those samplers' names, "euler, heun, …", for messages.
std::string KarrasSamplerNames();
// The sampler that follows a diffusers scheduler class (_class_name: DDPMScheduler,
// DDIMScheduler, PNDMScheduler, EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
// HeunDiscreteScheduler, LMSDiscreteScheduler, KDPM2DiscreteScheduler,
// KDPM2AncestralDiscreteScheduler, DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler,
// DPMSolverSDEScheduler, DEISMultistepScheduler, UniPCMultistepScheduler, LCMScheduler,
// TCDScheduler); none for another.
std::optional<SamplerKind> SamplerOfScheduler(const std::string& scheduler_class);
// The β schedule a diffusers scheduler class takes where its config names none: DDPM's
// (linear from 1e-4 to 0.02) for most and an unknown class, Stable Diffusion's ends (0.00085 to
// 0.012, linear) for the Heun, KDPM2 (ancestral) and DPM-Solver SDE schedulers, and scaled_linear
// between those for LCMScheduler and TCDScheduler.
struct BetaDefaults {
  double start = 1e-4, end = 0.02;
  std::string schedule = "linear";  // diffusers' beta_schedule
};
BetaDefaults DiffusersBetaDefaults(const std::string& scheduler_class);
// Its flag name ("euler_ancestral"), as ParseSamplerKind reads it.
std::string SamplerFlag(SamplerKind kind);

}  // namespace difftrain
