// Where a sampler's N steps fall on the T timesteps of the diffusion, and where each goes.
// (PNDM's calls and Euler's steps below.)
//
// respace (DiT's respace.py, the default): N timesteps evenly strided over [0, T − 1]
// (SpaceTimesteps); the sampler runs the respaced process, each step going to the kept
// timestep before it, the last (at timestep 0) to ᾱ = 1.
//
// leading, trailing, linspace: the timestep_spacing of diffusers' DDPM and DDIM schedulers
// (set_timesteps), as a Stable Diffusion pipeline samples:
//   leading   k · ⌊T/N⌋ + steps_offset for k = 0 … N − 1 (SD's configs: steps_offset 1)
//   trailing  round(T − k · T/N) − 1, numpy's arange and round (half to even)
//   linspace  round(k · (T − 1)/(N − 1)), numpy's linspace
// A step from timestep t goes to ᾱ_{t − ⌊T/N⌋}, as the schedulers' step() computes its
// previous timestep (where T/N is not whole, trailing and linspace steps skip or overlap
// the timestep before them, as diffusers'). Below 0 it goes to the final ᾱ: DDIM's is 1 with
// set_alpha_to_one and ᾱ_0 without (SD's configs: false); DDPM's is always 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

struct TimestepSpacing {
  std::string kind = "respace";  // respace, leading, trailing or linspace
  int steps_offset = 0;          // added to leading's timesteps
  bool set_alpha_to_one = true;  // DDIM's final ᾱ: 1, or ᾱ_0
  // use_karras_sigmas (Euler, Heun, LMS, DPM-Solver++, UniPC): the steps' σ's are Karras et al.'s
  // schedule (KarrasSigmas) and each step's timestep the one its σ falls at
  // (SigmaToTimestep), as those schedulers' set_timesteps replace the spacing's.
  bool karras = false;
  // EulerDiscreteScheduler's sigma_min and sigma_max, the ends of its Karras σ's; 0: the σ's of
  // the spacing's first and last timesteps.
  double sigma_min = 0, sigma_max = 0;

  bool diffusers() const { return kind != "respace"; }
  // Errors name the key: an unknown kind, a negative offset, an offset,
  // set_alpha_to_one = false or Karras σ's given to respace, sigma_min or sigma_max without
  // Karras σ's, negative or crossed.
  Status Validate() const;
  nlohmann::json ToJson() const;
  // The sampling keys of a diffusers scheduler config (scheduler_config.json):
  // timestep_spacing, steps_offset (0), set_alpha_to_one; the defaults are the class's
  // (_class_name): timestep_spacing linspace for the Euler, Euler ancestral, Heun, LMS,
  // DPM-Solver multistep and UniPC schedulers, else leading; set_alpha_to_one false for a
  // PNDMScheduler, else true as DDIM's; use_karras_sigmas where the class has it (Euler, Heun,
  // LMS, DPM-Solver, UniPC), and an Euler's sigma_min and sigma_max with it. Refused by name:
  // thresholding (dynamic thresholding is not implemented), an EulerDiscreteScheduler's
  // interpolation_type log_linear and timestep_type continuous, a Heun's clip_sample.
  static Result<TimestepSpacing> FromDiffusersScheduler(const nlohmann::json& json);
};

// One sampling step: the model sees `timestep`; the step goes from ᾱ_t to ᾱ_prev.
struct SamplingStep {
  int timestep = 0;
  double alpha_cumprod = 0, alpha_cumprod_prev = 1;
};

// DiT's space_timesteps(T, "N"): N timesteps evenly strided over [0, T − 1], each position
// rounded half to even as Python's round does, in increasing order. Needs 1 ≤ N ≤ T.
std::vector<int> SpaceTimesteps(int T, int N);

// The N timesteps a diffusers spacing keeps of T, increasing (diffusers lists them
// decreasing). Errors: N outside [1, T], a timestep outside [0, T − 1] (leading's offset).
Result<std::vector<int>> DiffusersTimesteps(int T, int N, const TimestepSpacing& spacing);

// The steps of a diffusers spacing over the diffusion's ᾱ's (`alphas_cumprod`, T of them),
// increasing in timestep: DDIM's (`ddim`) final ᾱ per set_alpha_to_one, DDPM's 1.
Result<std::vector<SamplingStep>> DiffusersSteps(const std::vector<double>& alphas_cumprod, int N,
                                                 const TimestepSpacing& spacing, bool ddim);

// One model call of diffusers' PNDMScheduler with skip_prk_steps (Stable Diffusion 1.x's
// scheduler; its pseudo linear multistep steps, Liu et al., "Pseudo Numerical Methods for
// Diffusion Models on Manifolds"): the model sees `timestep`, and the step moves x from ᾱ_t
// to ᾱ_prev.
struct PlmsCall {
  int timestep = 0;
  double alpha_cumprod = 0, alpha_cumprod_prev = 1;
};

// PNDM's N + 1 calls for N ≥ 2 steps (1 for N = 1), in the order they run: with the kept
// timesteps t_0 < … < t_{N−1} (DiffusersTimesteps), t_{N−1}, t_{N−2}, t_{N−2}, t_{N−3}, …,
// t_0. Each steps from its timestep t to t − ⌊T/N⌋, except the second, which redoes the first
// step: from t + ⌊T/N⌋ to t (t_{N−1} → t_{N−2} where T/N is whole). Below timestep 0 the
// final ᾱ of set_alpha_to_one. Sampling that starts at step `begin` (image to image) makes the
// calls from the begin-th of these timesteps on, the second of them redoing the first's step as
// above, as PNDMScheduler's counter does from set_begin_index (at begin 1 the repeated t_{N−2}
// makes that second call step from t_{N−1} to t_{N−2} again, as diffusers'). Errors:
// DiffusersTimesteps', and a second call past T − 1.
Result<std::vector<PlmsCall>> PlmsCalls(const std::vector<double>& alphas_cumprod, int N,
                                        const TimestepSpacing& spacing, int begin = 0);

// σ = √((1 − ᾱ_t)/ᾱ_t) at timestep t: the noise-to-signal ratio the σ-space samplers
// (Euler, Heun, DPM-Solver++, UniPC) step in.
inline double DiffusionSigma(const std::vector<double>& alphas_cumprod, int t) {
  return std::sqrt((1 - alphas_cumprod[t]) / alphas_cumprod[t]);
}

// Karras et al.'s σ's ("Elucidating the Design Space of Diffusion-Based Generative Models",
// ρ = 7): N of them from sigma_max down to sigma_min, evenly spaced in σ^(1/ρ).
std::vector<double> KarrasSigmas(double sigma_min, double sigma_max, int N);

// The (fractional) timestep where the diffusion's σ = √((1 − ᾱ)/ᾱ) equals `sigma`, log σ
// interpolated linearly between integer timesteps, clamped to [0, T − 1] (diffusers'
// _sigma_to_t).
double SigmaToTimestep(double sigma, const std::vector<double>& alphas_cumprod);

// One step of diffusers' EulerDiscreteScheduler (deterministic: s_churn 0), which integrates
// the probability-flow ODE in σ = √((1 − ᾱ)/ᾱ) with x scaled by √(σ² + 1) from the model's
// input: the model sees x / √(σ² + 1) at `timestep` (a float: linspace's are fractional), and
// x moves by (x − x0)/σ · (σ_next − σ).
struct EulerStep {
  float timestep = 0;
  double sigma = 0, sigma_next = 0;
  // KDPM2's and DPM-Solver SDE's midpoint (Kdpm2Steps, DpmSdeSteps), 0 where there is none,
  // and the timestep the model sees it at.
  double sigma_mid = 0;
  float timestep_mid = 0;
};

// An ancestral step from σ to σ' (Euler ancestral's, KDPM2 ancestral's) goes deterministically
// to σ_down = √(σ'² − σ_up²), then adds noise of σ_up = σ'·√(σ² − σ'²)/σ.
struct AncestralSigmas {
  double up, down;
};
inline AncestralSigmas SplitAncestralStep(double sigma, double sigma_next) {
  const double up = std::sqrt(sigma_next * sigma_next * (sigma * sigma - sigma_next * sigma_next) /
                              (sigma * sigma));
  // σ'² − σ_up² is σ'⁴/σ² ≥ 0 in exact arithmetic; rounded, it can come out below 0 where σ'⁴/σ²
  // is below σ'²'s last bit (σ far above σ': scheduler_fuzz found a NaN σ_down), so it is
  // clamped there; elsewhere the result is diffusers' to the bit.
  return {up, std::sqrt(std::max(0.0, sigma_next * sigma_next - up * up))};
}

// Euler's N steps, in the order they run: the timesteps of the spacing (linspace's unrounded,
// as float32: numpy.linspace(0, T − 1, N)), σ interpolated linearly between the diffusion's
// integer timesteps, the last step to σ = 0. With Karras σ's: N of them from the first
// step's σ (or sigma_max) to the last's (or sigma_min), each at its SigmaToTimestep (float32,
// unrounded). diffusers' HeunDiscreteScheduler, EulerAncestralDiscreteScheduler (without Karras
// σ's) and LMSDiscreteScheduler take the same steps.
Result<std::vector<EulerStep>> EulerSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing);
// KDPM2's N steps (diffusers' KDPM2DiscreteScheduler, k-diffusion's DPM2): Euler's, with
// Karras timesteps rounded, and each step but the last with its midpoint σ_mid, the geometric
// mean of σ and σ' (ancestral: of σ and σ_down), at its SigmaToTimestep (unrounded).
Result<std::vector<EulerStep>> Kdpm2Steps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing, bool ancestral);
// DPM-Solver SDE's N steps (diffusers' DPMSolverSDEScheduler, k-diffusion's DPM++ SDE): Euler's
// (Karras timesteps unrounded), each step but the last with its midpoint σ_mid, the geometric
// mean of σ and σ', at its SigmaToTimestep (unrounded).
Result<std::vector<EulerStep>> DpmSdeSteps(const std::vector<double>& alphas_cumprod, int N,
                                           const TimestepSpacing& spacing);

// The coefficient of the slope of step k − j (j < order ≤ k + 1) in LMS's step k (diffusers'
// LMSDiscreteScheduler.get_lms_coefficient): the integral from σ_k to σ_{k+1} (0 after the
// last step) of the Lagrange basis polynomial through σ_k, …, σ_{k−order+1} that is 1 at
// σ_{k−j}.
double LmsCoefficient(const std::vector<EulerStep>& steps, int k, int order, int j);

// The σ x_T is scaled by (diffusers' init_noise_sigma): the first step's σ for linspace and
// trailing, √(σ² + 1) for leading.
double EulerInitialSigma(const std::vector<EulerStep>& steps, const TimestepSpacing& spacing);

}  // namespace difftrain
