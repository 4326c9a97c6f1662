#include "model/diffusion/deis.h"

#include <cmath>
#include <string>

#include "common/json_read.h"

namespace difftrain {
namespace {

// ∫ ℓ(log t) dt of the Lagrange basis polynomial in log t that is 1 at b and 0 at c (and d):
// an antiderivative, as diffusers' ind_fn.
double Basis2(double t, double b, double c) {
  return t * (-std::log(c) + std::log(t) - 1) / (std::log(b) - std::log(c));
}
double Basis3(double t, double b, double c, double d) {
  const double lt = std::log(t), lc = std::log(c), ld = std::log(d), lb = std::log(b);
  return t * (lc * (ld - lt + 1) - ld * lt + ld + lt * lt - 2 * lt + 2) / ((lb - lc) * (lb - ld));
}

}  // namespace

nlohmann::json DeisOptions::ToJson() const {
  return {{"algorithm_type", "deis"},
          {"solver_type", "logrho"},
          {"solver_order", order},
          {"lower_order_final", lower_order_final}};
}

Result<DeisOptions> DeisOptions::FromDiffusersScheduler(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  DeisOptions o;
  try {
    const std::string algorithm = json.value("algorithm_type", std::string("deis"));
    if (algorithm != "deis" && algorithm != "dpmsolver" && algorithm != "dpmsolver++") {
      return Errorf(
          "algorithm_type: '{}' is not supported by DEIS (deis; dpmsolver and "
          "dpmsolver++ read as deis)",
          algorithm);
    }
    const std::string type = json.value("solver_type", std::string("logrho"));
    if (type != "logrho" && type != "midpoint" && type != "heun" && type != "bh1" &&
        type != "bh2") {
      return Errorf(
          "solver_type: '{}' is not supported by DEIS (logrho; midpoint, heun, bh1 and "
          "bh2 read as logrho)",
          type);
    }
    o.order = JsonIntOr(json, "solver_order", 2);
    if (o.order < 1 || o.order > 3)
      return Errorf("solver_order: {} is not supported (1, 2 or 3)", o.order);
    o.lower_order_final = json.value("lower_order_final", true);
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  return o;
}

Result<std::vector<LinearStep>> DeisSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing,
                                          const DeisOptions& options, int begin) {
  // DPM-Solver's steps with σ_0 last give DEIS's timesteps, σ's and orders.
  DpmSolverOptions dpm;
  dpm.order = options.order;
  dpm.lower_order_final = options.lower_order_final;
  dpm.final_sigma_min = true;
  DT_ASSIGN_OR_RETURN(const std::vector<DpmStep> dpm_steps,
                      DpmSolverSteps(alphas_cumprod, N, spacing, dpm, begin));
  const auto alpha = [](double sigma) { return 1 / std::sqrt(sigma * sigma + 1); };
  std::vector<LinearStep> steps;
  for (const DpmStep& d : dpm_steps) {
    LinearStep s;
    s.timestep = d.timestep;
    s.sigma = d.sigma;
    s.order = d.order;
    // ρ = σ: t the step's end, s0 its start, s1 and s2 the steps' before.
    const double t = d.sigma_next, s0 = d.sigma, s1 = d.sigma_prev, s2 = d.sigma_prev2;
    const double a_t = alpha(t);
    s.from_x = a_t / alpha(s0);
    if (d.order == 1) {
      s.outputs[0] = a_t * (t - s0);
    } else if (d.order == 2) {
      s.outputs[0] = a_t * (Basis2(t, s0, s1) - Basis2(s0, s0, s1));
      s.outputs[1] = a_t * (Basis2(t, s1, s0) - Basis2(s0, s1, s0));
    } else {
      s.outputs[0] = a_t * (Basis3(t, s0, s1, s2) - Basis3(s0, s0, s1, s2));
      s.outputs[1] = a_t * (Basis3(t, s1, s2, s0) - Basis3(s0, s1, s2, s0));
      s.outputs[2] = a_t * (Basis3(t, s2, s0, s1) - Basis3(s0, s2, s0, s1));
    }
    steps.push_back(s);
  }
  return steps;
}

}  // namespace difftrain
