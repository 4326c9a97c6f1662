// diffusers' DPMSolverMultistepScheduler with algorithm_type dpmsolver++ (Lu et al.,
// "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion Probabilistic Models"):
// deterministic multistep steps on the data prediction x0, of first, second or third order; or
// with sde-dpmsolver++, the stochastic steps of first or second order ("DPM++ 2M SDE").
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
//   third order   x' = (σ_t' / σ_t) x − α' (e^{−h} − 1) m_k + α' ((e^{−h} − 1)/h + 1) D1
//                 − α' ((e^{−h} − 1 + h)/h² − 1/2) D2, with D1_0 = (m_k − m_{k−1})/r0,
//                 D1_1 = (m_{k−1} − m_{k−2})/r1 (r1 = (λ_{k−1} − λ_{k−2})/h),
//                 D1 = D1_0 + r0/(r0 + r1) (D1_0 − D1_1), D2 = (D1_0 − D1_1)/(r0 + r1)
//   SDE           x' = (σ_t' / σ_t) e^{−h} x + α' (1 − e^{−2h}) (m_k [+ c · D1])
//                 + σ_t' √(1 − e^{−2h}) z, c = 1/2 (midpoint) or, for heun, the D1 term is
//                 α' ((1 − e^{−2h})/(−2h) + 1) D1; z the sample's step noise
// With use_karras_sigmas (TimestepSpacing::karras) the N σ's are Karras's over the whole
// diffusion, σ_{T−1} to σ_0, each step at its σ's timestep rounded (MultistepTimesteps).
// The first step is of first order, and so is the last where final_sigmas_type is zero,
// euler_at_final is set, or lower_order_final with fewer than 15 steps; the second (and with
// lower_order_final and fewer than 15 steps the one before last) is at most of second order.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/diffusion/timestep_spacing.h"

namespace difftrain {

struct DpmSolverOptions {
  int order = 2;      // solver_order: 1, 2, or (not with sde) 3
  bool heun = false;  // solver_type heun; else midpoint
  bool sde = false;   // algorithm_type sde-dpmsolver++; else dpmsolver++
  bool lower_order_final = true;
  bool euler_at_final = false;
  bool final_sigma_min = false;  // final_sigmas_type sigma_min; else zero

  nlohmann::json ToJson() const;
  // The keys of a DPMSolverMultistepScheduler config, or with `singlestep` a
  // DPMSolverSinglestepScheduler's (its spacing and use_karras_sigmas are TimestepSpacing's).
  // Refused by name: algorithm_type other than dpmsolver++ and (multistep) sde-dpmsolver++,
  // solver_order above 3 (or 3 with sde-dpmsolver++), use_lu_lambdas, a finite
  // lambda_min_clipped, variance_type, thresholding. The singlestep class's lower_order_final
  // defaults to false.
  static Result<DpmSolverOptions> FromDiffusersScheduler(const nlohmann::json& json,
                                                         bool singlestep = false);
};

struct DpmStep {
  int timestep = 0;
  double sigma = 0, sigma_next = 0;
  double sigma_prev = 0, sigma_prev2 = 0;  // σ_{k−1} (second order), σ_{k−2} (third)
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

// The N steps in the order they run. Sampling that starts at step `begin` (image to image)
// warms the order up from there, as diffusers' lower_order_nums counts from set_begin_index;
// the steps before it are listed as they would be without. Errors: N outside [1, T], a
// timestep outside the diffusion.
Result<std::vector<DpmStep>> DpmSolverSteps(const std::vector<double>& alphas_cumprod, int N,
                                            const TimestepSpacing& spacing,
                                            const DpmSolverOptions& options, int begin = 0);

// diffusers' DPMSolverSinglestepScheduler (dpmsolver++; Lu et al.'s singlestep DPM-Solver):
// its steps come in groups of `order` model calls, each step of the group from the group's
// first x (the anchor, at σ_a): the first of first order, the second of second order from the
// anchor's x0 and the first step's, the third of third order. So a group of order 2 takes x
// from σ_a to σ_{a+2} with two model calls. Its timesteps are linspace's, its σ's as the
// multistep solver's (Karras's too), and the final σ 0 or σ_0 (final_sigmas_type).
// The orders: groups of [1, 2] ([1, 2, 3]) for solver_order 2 (3); with lower_order_final
// (forced where the final σ is 0 or N is not a multiple of the order) the last group is cut:
// order 2 ends [1, 1] for even N and [1] for odd; order 3 ends [1, 2, 1] (…, [1, 2], [1]) for
// N % 3 = 0, [1] for 1 and [1, 2] for 2.
// With x0's m_0 (this step's), m_1, m_2 (the steps' before it in the group) and h = λ' − λ_a,
// r_i = (λ_{s_i} − λ_a)/h, E = α'(e^{−h} − 1), F = α'((e^{−h} − 1)/h + 1),
// G = α'((e^{−h} − 1 + h)/h² − 1/2):
//   first order   x' = (σ_t'/σ_t) x − E m_0 (x' = m_0 where σ' = 0)
//   second order  D1 = (m_0 − m_1)/r_0; x' = (σ_t'/σ_ta) x_a − E m_1 − E/2 D1 (midpoint)
//                 or + F D1 (heun)
//   third order   D1_0 = (m_1 − m_2)/r_1, D1_1 = (m_0 − m_2)/r_0,
//                 D1 = (r_0 D1_0 − r_1 D1_1)/(r_0 − r_1), D2 = 2 (D1_1 − D1_0)/(r_0 − r_1);
//                 x' = (σ_t'/σ_ta) x_a − E m_2 + F D1_1 (midpoint) or + F D1 − G D2 (heun)
// Each is a linear combination (LinearStep): its x_a restarts at the group's first step, its
// outputs are x0's. Sampling that starts at step `begin` (image to image) has no x0's before
// it: a step's order is lowered to the x0's there are (k − begin + 1 at step k), restarting
// where it becomes 1, as diffusers' step lowers it where model_outputs[−order] is None.
//
// A step that is a linear combination of an x and the model's outputs so far:
// x' = from_x · x_from + outputs[0] · o_0 + outputs[1] · o_1 + outputs[2] · o_2, o_0 this step's
// (guided) model output turned into x0 (DPM-Solver singlestep) or ε (DEIS, deis.h), o_1 and o_2
// the two steps' before it; x_from is this step's x where `restart` is set, else the x of the
// last step that set it.
struct LinearStep {
  int timestep = 0;
  double sigma = 0;
  int order = 1;
  bool restart = true;
  double from_x = 0;
  double outputs[3] = {0, 0, 0};
};

// The N steps in the order they run. Errors: a spacing other than linspace, N outside [1, T];
// solver_order 3 with N % 3 = 2 and a final σ of 0, whose last step (of second order to
// λ = ∞) diverges (diffusers' is inf).
Result<std::vector<LinearStep>> DpmSolverSinglestepSteps(const std::vector<double>& alphas_cumprod,
                                                         int N, const TimestepSpacing& spacing,
                                                         const DpmSolverOptions& options,
                                                         int begin = 0);

}  // namespace difftrain
