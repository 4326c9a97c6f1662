// diffusers' LCMScheduler (Luo et al., "Latent Consistency Models"): a few-step sampler for a
// model distilled to be consistent, i.e. to map any x_t of a trajectory to its x0 in one call.
// Each step takes the model's x0 prediction, mixed with x_t by the consistency model's
// boundary condition at the step's timestep t (scaled s = t · timestep_scaling, σ_data = 0.5),
//   denoised = c_out · x0 + c_skip · x_t,  c_skip = σ_data² / (s² + σ_data²),
//                                           c_out = s / √(s² + σ_data²),
// and noises it afresh to the next step's timestep,
//   x' = √ᾱ' · denoised + √(1 − ᾱ') · z,
// the last step's x' being `denoised` itself (its ᾱ' = 1, no noise).
//
// Its timesteps are its own, not a timestep spacing's: the distillation ran on the
// `original_steps` timesteps i · ⌊T/original_steps⌋ − 1 (i = 1 … original_steps); N of them,
// from the top, are taken at the indices ⌊j · original_steps/N⌋, j = 0 … N − 1 (numpy's
// linspace without its end point), so N ≤ original_steps. LatentConsistencyModelImg2ImgPipeline
// spends its strength here (`strength`): the schedule is the first ⌊original_steps·strength⌋
// of those timesteps, N of them taken from its top likewise.
//
// diffusers' TCDScheduler (Zheng et al., "Trajectory Consistency Distillation") steps on the
// same timesteps, without the boundary condition, by a strategic stochastic step of γ (the
// pipeline's `eta`): from t, with x0 and ε read from the model's output, to s = ⌊(1 − γ)·t'⌋
// below the next timestep t' (0 after the last),
//   x_s = √ᾱ_s · x0 + √(1 − ᾱ_s) · ε,
// and with γ > 0 but for the last step noised back up to t',
//   x' = √(ᾱ'/ᾱ_s) · x_s + √(1 − ᾱ'/ᾱ_s) · z;
// the last step's x' is x_s at s = 0 (timestep 0's noise level, not x0). γ = 0 is DDIM's step.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/diffusion/timestep_spacing.h"

namespace difftrain {

struct LcmOptions {
  int original_steps = 50;       // original_inference_steps: the distillation's schedule
  double timestep_scaling = 10;  // t's scale in the boundary condition
  // The part of the distillation's schedule the N steps are taken from (image to image as
  // LatentConsistencyModelImg2ImgPipeline, which passes its strength to set_timesteps), (0, 1].
  double strength = 1;

  // Errors name the key: original_inference_steps below 1, timestep_scaling not positive, a
  // strength outside (0, 1].
  Status Validate() const;
  nlohmann::json ToJson() const;
  // original_inference_steps and timestep_scaling of an LCMScheduler config (their defaults
  // where absent). Its clip_sample is the sampler's (launch's ChooseClipping).
  static Result<LcmOptions> FromDiffusersScheduler(const nlohmann::json& json);

  // The boundary condition's coefficients at timestep t.
  double SkipCoefficient(int t) const;
  double OutCoefficient(int t) const;
};

// The N steps over the diffusion's ᾱ's (`alphas_cumprod`, T of them), increasing in timestep,
// each going to the ᾱ of the step below it, the lowest to 1. Errors: original_steps above T,
// N outside [1, ⌊original_steps·strength⌋].
Result<std::vector<SamplingStep>> LcmSteps(const std::vector<double>& alphas_cumprod, int N,
                                           const LcmOptions& options);

// One TCD step: the model sees `timestep`; x0 and ε go to ᾱ_s (at s = ⌊(1 − γ)·t'⌋, the product
// in float32 as the scheduler computes it), then, noised, to ᾱ' (timestep t's, the lowest's
// timestep 0's).
struct TcdStep {
  int timestep = 0;
  double alpha_cumprod = 0, alpha_cumprod_prev = 1, alpha_cumprod_s = 1;
};

// TCD's N steps, increasing in timestep: LcmSteps' timesteps. Errors: LcmSteps', γ outside
// [0, 1].
Result<std::vector<TcdStep>> TcdSteps(const std::vector<double>& alphas_cumprod, int N,
                                      const LcmOptions& options, double gamma);

}  // namespace difftrain
