#include "model/diffusion/dpm_solver.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "common/check.h"
#include "common/json_read.h"

namespace difftrain {

nlohmann::json DpmSolverOptions::ToJson() const {
  return {{"algorithm_type", sde ? "sde-dpmsolver++" : "dpmsolver++"},
          {"solver_order", order},
          {"solver_type", heun ? "heun" : "midpoint"},
          {"lower_order_final", lower_order_final},
          {"euler_at_final", euler_at_final},
          {"final_sigmas_type", final_sigma_min ? "sigma_min" : "zero"}};
}

Result<DpmSolverOptions> DpmSolverOptions::FromDiffusersScheduler(const nlohmann::json& json,
                                                                  bool singlestep) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  DpmSolverOptions o;
  try {
    std::string algorithm = json.value("algorithm_type", std::string("dpmsolver++"));
    if (algorithm == "deis") algorithm = "dpmsolver++";  // DEIS's, as the constructor reads it
    if (singlestep && algorithm == "sde-dpmsolver++") {
      return Errorf(
          "algorithm_type: 'sde-dpmsolver++' is DPMSolverMultistepScheduler's; the singlestep "
          "solver has dpmsolver++ only");
    }
    if (algorithm != "dpmsolver++" && algorithm != "sde-dpmsolver++") {
      return Errorf("algorithm_type: '{}' is not supported (dpmsolver++{})", algorithm,
                    singlestep ? "" : ", sde-dpmsolver++");
    }
    o.sde = algorithm == "sde-dpmsolver++";
    o.order = JsonIntOr(json, "solver_order", 2);
    if (o.order < 1 || o.order > 3)
      return Errorf("solver_order: {} is not supported (1, 2 or 3)", o.order);
    if (o.sde && o.order == 3) {
      return Errorf(
          "solver_order: 3 with sde-dpmsolver++ is not supported (diffusers' third-order step "
          "has no noise)");
    }
    std::string type = json.value("solver_type", std::string("midpoint"));
    // UniPC's and DEIS's solver types read as midpoint, as the class's constructor reads them.
    if (type == "bh1" || type == "bh2" || type == "logrho") type = "midpoint";
    if (type != "midpoint" && type != "heun")
      return Errorf("solver_type: '{}' is not supported (midpoint, heun)", type);
    o.heun = type == "heun";
    o.lower_order_final = json.value("lower_order_final", !singlestep);
    o.euler_at_final = json.value("euler_at_final", false);
    const std::string final_sigmas = json.value("final_sigmas_type", std::string("zero"));
    if (final_sigmas != "zero" && final_sigmas != "sigma_min")
      return Errorf("final_sigmas_type: '{}' is not supported (zero, sigma_min)", final_sigmas);
    o.final_sigma_min = final_sigmas == "sigma_min";
    if (json.value("use_lu_lambdas", false)) return Errorf("use_lu_lambdas: true is not supported");
    if (json.contains("lambda_min_clipped") && json["lambda_min_clipped"].is_number() &&
        std::isfinite(json["lambda_min_clipped"].get<double>()))
      return Errorf("lambda_min_clipped: a finite value is not supported");
    if (json.contains("variance_type") && !json["variance_type"].is_null())
      return Errorf("variance_type: only null is supported");
    if (json.value("thresholding", false))
      return Errorf("thresholding: true (dynamic thresholding) is not supported");
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  return o;
}

Result<MultistepSchedule> MultistepTimesteps(const std::vector<double>& alphas_cumprod, int N,
                                             const TimestepSpacing& spacing) {
  const int T = static_cast<int>(alphas_cumprod.size());
  DT_RETURN_IF_ERROR(spacing.Validate());
  if (N < 1 || N > T) {
    return Errorf("sampling steps must be between 1 and the diffusion's {} steps, got {}", T, N);
  }
  // Increasing timesteps: N + 1 points of which timestep 0's is dropped, or trailing's.
  std::vector<int> kept;
  if (spacing.kind == "linspace") {
    const double step = (T - 1.0) / N;
    for (int k = 1; k <= N; ++k)
      kept.push_back(k == N ? T - 1 : static_cast<int>(std::nearbyint(k * step)));
  } else if (spacing.kind == "leading") {
    if (N + 1 > T)
      return Errorf("a leading spacing of these schedulers needs at most {} steps", T - 1);
    for (int k = 1; k <= N; ++k)
      kept.push_back(k * (T / (N + 1)) + spacing.steps_offset);
  } else {
    DT_ASSIGN_OR_RETURN(kept, DiffusersTimesteps(T, N, spacing));
  }
  if (kept.back() > T - 1 || kept.front() < 0) {
    return Errorf("{} spacing puts the timesteps of {} steps in [{}, {}], outside [0, {}]",
                  spacing.kind, N, kept.front(), kept.back(), T - 1);
  }
  MultistepSchedule schedule;
  if (spacing.karras) {
    // Over the whole diffusion, whatever the spacing: from σ_{T−1} down to σ_0.
    schedule.sigmas =
        KarrasSigmas(DiffusionSigma(alphas_cumprod, 0), DiffusionSigma(alphas_cumprod, T - 1), N);
    for (double sigma : schedule.sigmas) {
      schedule.timesteps.push_back(
          static_cast<int>(std::nearbyint(SigmaToTimestep(sigma, alphas_cumprod))));
    }
    return schedule;
  }
  for (int k = N - 1; k >= 0; --k) {
    schedule.timesteps.push_back(kept[k]);
    schedule.sigmas.push_back(DiffusionSigma(alphas_cumprod, kept[k]));
  }
  return schedule;
}

Result<std::vector<DpmStep>> DpmSolverSteps(const std::vector<double>& alphas_cumprod, int N,
                                            const TimestepSpacing& spacing,
                                            const DpmSolverOptions& options, int begin) {
  DT_ASSIGN_OR_RETURN(const MultistepSchedule schedule,
                      MultistepTimesteps(alphas_cumprod, N, spacing));
  const double final_sigma = options.final_sigma_min ? DiffusionSigma(alphas_cumprod, 0) : 0.0;
  std::vector<DpmStep> steps;
  for (int k = 0; k < N; ++k)
    steps.push_back({schedule.timesteps[k], schedule.sigmas[k], 0, 0, 1});
  for (int k = 0; k < N; ++k) {
    DpmStep& s = steps[k];
    s.sigma_next = k + 1 < N ? steps[k + 1].sigma : final_sigma;
    s.sigma_prev = k > 0 ? steps[k - 1].sigma : 0;
    s.sigma_prev2 = k > 1 ? steps[k - 2].sigma : 0;
    const bool lower_final =
        k == N - 1 && (options.euler_at_final || (options.lower_order_final && N < 15) ||
                       !options.final_sigma_min);
    const bool lower_second = k == N - 2 && options.lower_order_final && N < 15;
    // The x0's there are before this step's: from `begin` on (all before it, for the steps
    // before it).
    const int earlier = k < begin ? k : k - begin;
    s.order = options.order == 1 || earlier < 1 || lower_final    ? 1
              : options.order == 2 || earlier < 2 || lower_second ? 2
                                                                  : 3;
  }
  return steps;
}

namespace {

// diffusers' get_order_list: the order of each of the N steps.
std::vector<int> SinglestepOrders(int N, int order, bool lower_order_final) {
  std::vector<int> group;
  for (int i = 1; i <= order; ++i)
    group.push_back(i);
  std::vector<int> orders;
  const auto repeat = [&](int groups) {
    for (int g = 0; g < groups; ++g)
      orders.insert(orders.end(), group.begin(), group.end());
  };
  const auto append = [&](std::initializer_list<int> tail) {
    orders.insert(orders.end(), tail.begin(), tail.end());
  };
  if (order == 1) return std::vector<int>(N, 1);
  if (!lower_order_final) {
    repeat(N / order);
  } else if (order == 2) {
    if (N % 2 == 0) {
      repeat(N / 2 - 1);
      append({1, 1});
    } else {
      repeat(N / 2);
      append({1});
    }
  } else if (N % 3 == 0) {
    repeat(N / 3 - 1);
    append({1, 2, 1});
  } else {
    repeat(N / 3);
    if (N % 3 == 1) append({1});
    if (N % 3 == 2) append({1, 2});
  }
  return orders;
}

}  // namespace

Result<std::vector<LinearStep>> DpmSolverSinglestepSteps(const std::vector<double>& alphas_cumprod,
                                                         int N, const TimestepSpacing& spacing,
                                                         const DpmSolverOptions& options,
                                                         int begin) {
  if (spacing.kind != "linspace") {
    return Errorf(
        "DPMSolverSinglestepScheduler spaces its steps by linspace only, not {} (it has no "
        "timestep_spacing)",
        spacing.kind);
  }
  DT_ASSIGN_OR_RETURN(const MultistepSchedule schedule,
                      MultistepTimesteps(alphas_cumprod, N, spacing));
  // As set_timesteps: lower_order_final where N is not a multiple of the order, or the last σ is
  // 0.
  const bool lower_order_final =
      options.lower_order_final || N % options.order != 0 || !options.final_sigma_min;
  std::vector<int> orders = SinglestepOrders(N, options.order, lower_order_final);
  DT_CHECK(orders.size() == size_t(N), "{} orders for {} steps", orders.size(), N);
  for (int k = begin; k < N; ++k)
    orders[k] = std::min(orders[k], k - begin + 1);
  std::vector<double> sigmas = schedule.sigmas;
  sigmas.push_back(options.final_sigma_min ? DiffusionSigma(alphas_cumprod, 0) : 0.0);
  if (sigmas.back() == 0 && orders.back() > 1) {
    return Errorf(
        "DPM-Solver singlestep of order {} with {} steps ends on a step of order {} to σ = 0, "
        "which diffusers computes as inf: take final_sigmas_type sigma_min, order 2, or a step "
        "count that is not 2 more than a multiple of 3",
        options.order, N, orders.back());
  }
  // α = 1/√(σ² + 1), σ_t = σ·α, λ = log α − log σ_t.
  const auto alpha = [](double sigma) { return 1 / std::sqrt(sigma * sigma + 1); };
  const auto lambda = [&](double sigma) {
    return std::log(alpha(sigma)) - std::log(sigma * alpha(sigma));
  };
  std::vector<LinearStep> steps;
  for (int k = 0; k < N; ++k) {
    LinearStep s;
    s.timestep = schedule.timesteps[k];
    s.sigma = sigmas[k];
    s.order = orders[k];
    s.restart = s.order == 1;
    const double anchor = sigmas[k - (s.order - 1)], next = sigmas[k + 1];
    if (next == 0) {
      // To the data: its x0 (first order only, above).
      s.outputs[0] = 1;
      steps.push_back(s);
      continue;
    }
    const double a = alpha(next), h = lambda(next) - lambda(anchor), expm = std::exp(-h) - 1;
    const double E = a * expm, F = a * (expm / h + 1), G = a * ((expm + h) / (h * h) - 0.5);
    s.from_x = next * a / (anchor * alpha(anchor));
    if (s.order == 1) {
      s.outputs[0] = -E;
    } else if (s.order == 2) {
      const double r0 = (lambda(sigmas[k]) - lambda(anchor)) / h;
      // −E m_1 + c (m_0 − m_1)/r_0, c = −E/2 (midpoint) or F (heun).
      const double c = (options.heun ? F : -E / 2) / r0;
      s.outputs[0] = c;
      s.outputs[1] = -E - c;
    } else {
      const double r0 = (lambda(sigmas[k]) - lambda(anchor)) / h;
      const double r1 = (lambda(sigmas[k - 1]) - lambda(anchor)) / h;
      // The differences as coefficients of (m_0, m_1, m_2).
      const double d1_0[3] = {0, 1 / r1, -1 / r1}, d1_1[3] = {1 / r0, 0, -1 / r0};
      for (int i = 0; i < 3; ++i) {
        const double d1 = (r0 * d1_0[i] - r1 * d1_1[i]) / (r0 - r1);
        const double d2 = 2 * (d1_1[i] - d1_0[i]) / (r0 - r1);
        s.outputs[i] = options.heun ? F * d1 - G * d2 : F * d1_1[i];
      }
      s.outputs[2] -= E;
    }
    steps.push_back(s);
  }
  return steps;
}

}  // namespace difftrain
