// diffusers' DEISMultistepScheduler (Zhang & Chen, "Fast Sampling of Diffusion Models with
// Exponential Integrator"; algorithm_type deis, solver_type logrho): a multistep solver of the
// probability-flow ODE written in ρ = σ (the VE σ, √((1 − ᾱ)/ᾱ)) and x/α,
//   d(x/α)/dρ = ε(x, ρ),
// with ε interpolated by the Lagrange polynomial in log ρ through the last `order` steps' ε's
// (the model's output turned into x0, then into ε = (x − α x0)/σ_t, as diffusers does) and
// integrated exactly over the step: from ρ_s0 (this step's, with ε_0) to ρ_t, with ε_1, ε_2 at
// the steps before,
//   first order   x' = (α_t/α_s0) x + α_t (ρ_t − ρ_s0) ε_0 (DDIM's step)
//   second order  x' = α_t (x/α_s0 + c_0 ε_0 + c_1 ε_1), c_i = ∫ ℓ_i(log ρ) dρ over [ρ_s0, ρ_t]
//   third order   the same with three Lagrange basis polynomials.
// Its timesteps and σ's are DPM-Solver's (MultistepTimesteps, dpm_solver.h), its final σ
// timestep 0's, or with Karras σ's the last Karras σ (σ_0) again, whose step leaves x as it is.
// The order warms up from 1 and, with lower_order_final and fewer than 15 steps, the last step
// is of first order and the one before at most of second, as DPM-Solver's (DpmSolverSteps).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/diffusion/dpm_solver.h"
#include "model/diffusion/timestep_spacing.h"

namespace difftrain {

struct DeisOptions {
  int order = 2;  // solver_order: 1, 2 or 3
  bool lower_order_final = true;

  nlohmann::json ToJson() const;
  // The keys of a DEISMultistepScheduler config (its spacing and use_karras_sigmas are
  // TimestepSpacing's). Another class's algorithm_type (dpmsolver, dpmsolver++) reads as deis
  // and its solver_type (midpoint, heun, bh1, bh2) as logrho, as the class's constructor maps
  // them. Refused by name: another algorithm_type (sde-dpmsolver++ …) or solver_type,
  // solver_order outside 1 … 3.
  static Result<DeisOptions> FromDiffusersScheduler(const nlohmann::json& json);
};

// The N steps in the order they run, each a linear combination of its x and the ε's
// (LinearStep, restart set); from step `begin` the orders warm up as DpmSolverSteps'.
// Errors: MultistepTimesteps'.
Result<std::vector<LinearStep>> DeisSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing,
                                          const DeisOptions& options, int begin = 0);

}  // namespace difftrain
