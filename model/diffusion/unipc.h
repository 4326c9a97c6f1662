// diffusers' UniPCMultistepScheduler (Zhao et al., "UniPC: A Unified Predictor-Corrector
// Framework for Fast Sampling of Diffusion Models"), with predict_x0 (its default): a
// multistep predictor on the model's x0 predictions, and after each model call a corrector
// that redoes the step just taken with the new x0 (which costs no model call).
//
// Its timesteps and σ's are DPM-Solver's (MultistepTimesteps, dpm_solver.h), its final σ
// timestep 0's, or with Karras σ's the last Karras σ again (the last step then leaves x as
// it is, as diffusers'). With α = 1/√(σ² + 1), σ_t = σ·α, λ = −log σ and, for a step from
// σ_s to σ_t of order p with the x0's m_0 (newest) … m_{p−1}:
//   h = λ_t − λ_s, r_i = (λ_{s_i} − λ_s)/h, D_i = (m_i − m_0)/r_i (i = 1 … p − 1),
//   x' = (σ_t'/σ_s') x − α_t (e^{−h} − 1) m_0 − α_t B(h) Σ ρ_i D_i
// with B(h) = e^{−h} − 1 (bh2) or −h (bh1). The predictor's ρ (UniPcRhos) is 1/2 at order 2
// and solves the order conditions at 3; the corrector, of the last predictor's order p, adds
// D_p = m_new − m_0 with r_p = 1 and solves them at all orders but 1 (ρ = 1/2).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/diffusion/timestep_spacing.h"

namespace difftrain {

struct UniPcOptions {
  int order = 2;    // solver_order: 1, 2 or 3
  bool bh2 = true;  // solver_type bh2; else bh1
  bool lower_order_final = true;
  std::vector<int> disable_corrector;  // steps after which no corrector runs

  nlohmann::json ToJson() const;
  // The keys of a UniPCMultistepScheduler config (its spacing and use_karras_sigmas are
  // TimestepSpacing's). Refused by name: predict_x0 false, solver_order above 3, a solver_p,
  // thresholding, a solver_type other than bh1 and bh2.
  static Result<UniPcOptions> FromDiffusersScheduler(const nlohmann::json& json);
};

struct UniPcStep {
  int timestep = 0;
  double sigma = 0, sigma_next = 0;
  int order = 1;           // the predictor's: the order warms up, and lowers at the end
  bool corrector = false;  // a corrector of the last step runs before this one's predictor
};

// The N steps in the order they run. Sampling that starts at step `begin` (image to image)
// warms the order up from there and runs no corrector at it, as diffusers' from
// set_begin_index. Errors: MultistepTimesteps'.
Result<std::vector<UniPcStep>> UniPcSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing,
                                          const UniPcOptions& options, int begin = 0);

// The ρ's of a predictor (corrector = false; r's: r_1 … r_{p−1}) or a corrector (r's: r_1 …
// r_{p−1}, then 1) of order p = r's size + 1 (predictor) or r's size (corrector), for the
// step's −h.
std::vector<double> UniPcRhos(const std::vector<double>& r, double minus_h, bool bh2,
                              bool corrector);

}  // namespace difftrain
