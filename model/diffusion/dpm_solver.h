// diffusers' DPMSolverMultistepScheduler with algorithm_type dpmsolver++ (Lu et al.,
// "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic Models"):
// deterministic multistep steps on the data prediction x0, of first or second order.
//
// Its N timesteps are its own (set_timesteps): linspace round(k · (T − 1)/N) and leading
// k · ⌊T/(N + 1)⌋ + steps_offset for k = 1 … N (N + 1 points, timestep 0's dropped), trailing
// as the other schedulers'. σ_k = √((1 − ᾱ)/ᾱ) at each, then the final σ: 0
// (final_sigmas_type zero) or timestep 0's (sigma_min). With α = 1/√(σ² + 1), σ_t = σ·α and
// λ = −log σ, step k from σ_k to σ_{k+1} (h = λ_{k+1} − λ_k) with the model's x0 m_k:
//   first order   x' = (σ_t' / σ_t) x − α' (e^{−h} − 1) m_k            (x' = m_k where σ' = 0)
//   second order  x' = (σ_t' / σ_t) x − α' (e^{−h} − 1) (m_k + c · D1), D1 = (m_k − m_{k−1}) / r,
//                 r = (λ_k − λ_{k−1}) / h, c = 1/2 (midpoint) or, for heun, the D1 term is
//                 + α' ((e^{−h} − 1)/h + 1) D1
// With use_karras_sigmas (TimestepSpacing::karras) the N σ's are Karras's over the whole
// diffusion, σ_{T−1} to σ_0, each step at its σ's timestep rounded (MultistepTimesteps).
// The first step is of first order, and so is the last where final_sigmas_type is zero,
// euler_at_final is set, or lower_order_final with fewer than 15 steps.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/diffusion/timestep_spacing.h"

namespace difftrain {

struct DpmSolverOptions {
  int order = 2;      // solver_order: 1 or 2
  bool heun = false;  // solver_type heun; else midpoint
  bool lower_order_final = true;
  bool euler_at_final = false;
  bool final_sigma_min = false;  // final_sigmas_type sigma_min; else zero

  nlohmann::json ToJson() const;
  // The keys of a DPMSolverMultistepScheduler config (its spacing and use_karras_sigmas are
  // TimestepSpacing's). Refused by name: algorithm_type other than dpmsolver++, solver_order 3,
  // use_lu_lambdas, a finite
  // lambda_min_clipped, variance_type, thresholding.
  static Result<DpmSolverOptions> FromDiffusersScheduler(const nlohmann::json& json);
};

struct DpmStep {
  int timestep = 0;
  double sigma = 0, sigma_next = 0, sigma_prev = 0;  // σ_k, σ_{k+1}, σ_{k−1} (second order)
  int order = 1;
};

// The timesteps and σ's of DPMSolverMultistepScheduler's and UniPCMultistepScheduler's
// set_timesteps, in the order they run (decreasing): linspace round(k · (T − 1)/N) and
// leading k · ⌊T/(N + 1)⌋ + steps_offset for k = 1 … N, trailing as the other schedulers'; or
// Karras's σ's. Errors: N outside [1, T], a timestep outside the diffusion.
struct MultistepSchedule {
  std::vector<int> timesteps;
  std::vector<double> sigmas;
};
Result<MultistepSchedule> MultistepTimesteps(const std::vector<double>& alphas_cumprod, int N,
                                             const TimestepSpacing& spacing);

// The N steps in the order they run. Errors: N outside [1, T], a timestep outside the
// diffusion.
Result<std::vector<DpmStep>> DpmSolverSteps(const std::vector<double>& alphas_cumprod, int N,
                                            const TimestepSpacing& spacing,
                                            const DpmSolverOptions& options);

}  // namespace difftrain
