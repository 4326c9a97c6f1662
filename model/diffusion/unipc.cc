#include "model/diffusion/unipc.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/json_read.h"
#include "model/diffusion/dpm_solver.h"

namespace difftrain {
namespace {

// Solves A x = b for a small dense A (row-major, n × n) by Gaussian elimination with partial
// pivoting.
std::vector<double> Solve(std::vector<double> A, std::vector<double> b) {
  const int n = static_cast<int>(b.size());
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(A[r * n + c]) > std::abs(A[pivot * n + c])) pivot = r;
    }
    for (int k = 0; k < n; ++k)
      std::swap(A[c * n + k], A[pivot * n + k]);
    std::swap(b[c], b[pivot]);
    for (int r = c + 1; r < n; ++r) {
      const double f = A[r * n + c] / A[c * n + c];
      for (int k = c; k < n; ++k)
        A[r * n + k] -= f * A[c * n + k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (int r = n - 1; r >= 0; --r) {
    double v = b[r];
    for (int k = r + 1; k < n; ++k)
      v -= A[r * n + k] * x[k];
    x[r] = v / A[r * n + r];
  }
  return x;
}

}  // namespace

nlohmann::json UniPcOptions::ToJson() const {
  return {{"solver_order", order},
          {"solver_type", bh2 ? "bh2" : "bh1"},
          {"lower_order_final", lower_order_final},
          {"disable_corrector", disable_corrector}};
}

Result<UniPcOptions> UniPcOptions::FromDiffusersScheduler(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  UniPcOptions o;
  try {
    o.order = JsonIntOr(json, "solver_order", 2);
    if (o.order < 1 || o.order > 3)
      return Errorf("solver_order: {} is not supported (1, 2 or 3)", o.order);
    std::string type = json.value("solver_type", std::string("bh2"));
    // DPM-Solver's and DEIS's solver types read as bh2, as the class's constructor reads them.
    if (type == "midpoint" || type == "heun" || type == "logrho") type = "bh2";
    if (type != "bh1" && type != "bh2")
      return Errorf("solver_type: '{}' is not supported (bh1, bh2)", type);
    o.bh2 = type == "bh2";
    o.lower_order_final = json.value("lower_order_final", true);
    if (json.contains("disable_corrector"))
      o.disable_corrector = JsonInts(json["disable_corrector"], "disable_corrector");
    if (!json.value("predict_x0", true))
      return Errorf("predict_x0: false (UniPC on the noise prediction) is not supported");
    if (json.contains("solver_p") && !json["solver_p"].is_null())
      return Errorf("solver_p: another scheduler as the predictor is not supported");
    if (json.value("thresholding", false))
      return Errorf("thresholding: true (dynamic thresholding) is not supported");
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  return o;
}

Result<std::vector<UniPcStep>> UniPcSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing,
                                          const UniPcOptions& options, int begin) {
  DT_ASSIGN_OR_RETURN(const MultistepSchedule schedule,
                      MultistepTimesteps(alphas_cumprod, N, spacing));
  const double final_sigma =
      spacing.karras ? schedule.sigmas.back() : DiffusionSigma(alphas_cumprod, 0);
  std::vector<UniPcStep> steps;
  for (int k = 0; k < N; ++k) {
    UniPcStep s;
    s.timestep = schedule.timesteps[k];
    s.sigma = schedule.sigmas[k];
    s.sigma_next = k + 1 < N ? schedule.sigmas[k + 1] : final_sigma;
    // As step(): the configured order, lowered to the steps left (lower_order_final), and to
    // the x0's there are so far.
    const int order = options.lower_order_final ? std::min(options.order, N - k) : options.order;
    s.order = std::min(order, k < begin ? k + 1 : k - begin + 1);
    s.corrector = k > 0 && k != begin &&
                  std::find(options.disable_corrector.begin(), options.disable_corrector.end(),
                            k - 1) == options.disable_corrector.end();
    steps.push_back(s);
  }
  return steps;
}

std::vector<double> UniPcRhos(const std::vector<double>& r, double minus_h, bool bh2,
                              bool corrector) {
  const double hh = minus_h;
  const int p = static_cast<int>(r.size()) + (corrector ? 0 : 1);
  DT_CHECK(p >= 1, "a UniPC step of order {}", p);
  if (!corrector && p == 1) return {};
  if (corrector && p == 1) return {0.5};
  if (!corrector && p == 2) return {0.5};
  // The order conditions: R[i][k] = r_k^i, b_i = (i + 1)! φ_{i+2}(hh) · hh / B(h), built as
  // diffusers' recursion builds them.
  std::vector<double> rks = r;
  if (!corrector) rks.push_back(1.0);
  const int n = static_cast<int>(rks.size());
  const double h_phi_1 = std::expm1(hh);
  const double B = bh2 ? std::expm1(hh) : hh;
  double h_phi_k = h_phi_1 / hh - 1, factorial = 1;
  std::vector<double> R(n * n), b(n);
  for (int i = 1; i <= n; ++i) {
    for (int k = 0; k < n; ++k)
      R[(i - 1) * n + k] = std::pow(rks[k], i - 1);
    b[i - 1] = h_phi_k * factorial / B;
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1 / factorial;
  }
  if (corrector) return Solve(R, b);
  // The predictor solves the conditions without the last row and column.
  const int m = n - 1;
  std::vector<double> Rm(m * m), bm(b.begin(), b.begin() + m);
  for (int i = 0; i < m; ++i) {
    for (int k = 0; k < m; ++k)
      Rm[i * m + k] = R[i * n + k];
  }
  return Solve(Rm, bm);
}

}  // namespace difftrain
