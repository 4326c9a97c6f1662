#include "model/diffusion/timestep_spacing.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/check.h"
#include "common/json_read.h"
#include "model/diffusion/sampler_kind.h"

namespace difftrain {

Status TimestepSpacing::Validate() const {
  if (kind != "respace" && kind != "leading" && kind != "trailing" && kind != "linspace") {
    return Errorf("timestep spacing: expected respace, leading, trailing or linspace, found '{}'",
                  kind);
  }
  if (steps_offset < 0) return Errorf("steps_offset must be >= 0, got {}", steps_offset);
  if (!diffusers() && (steps_offset != 0 || !set_alpha_to_one)) {
    return Status::Error(
        "steps_offset and set_alpha_to_one are for diffusers' spacings (leading, trailing, "
        "linspace); respace ends every sample at alpha-bar 1");
  }
  if (!diffusers() && karras) {
    return Status::Error(
        "Karras sigmas are for diffusers' spacings (leading, trailing, linspace), not respace");
  }
  if (!(sigma_min >= 0) || !(sigma_max >= 0))
    return Errorf("sigma_min {} and sigma_max {} must be >= 0", sigma_min, sigma_max);
  if (!karras && (sigma_min != 0 || sigma_max != 0))
    return Status::Error("sigma_min and sigma_max bound Karras sigmas: give them with karras");
  if (sigma_min != 0 && sigma_max != 0 && sigma_min >= sigma_max)
    return Errorf("sigma_min {} must be below sigma_max {}", sigma_min, sigma_max);
  return Status::Ok();
}

nlohmann::json TimestepSpacing::ToJson() const {
  nlohmann::json j = {{"kind", kind}};
  if (diffusers()) {
    j["steps_offset"] = steps_offset;
    j["set_alpha_to_one"] = set_alpha_to_one;
  }
  if (karras) j["karras_sigmas"] = true;
  if (sigma_min != 0) j["sigma_min"] = sigma_min;
  if (sigma_max != 0) j["sigma_max"] = sigma_max;
  return j;
}

Result<TimestepSpacing> TimestepSpacing::FromDiffusersScheduler(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  TimestepSpacing s;
  try {
    const std::string class_name = json.contains("_class_name") && json["_class_name"].is_string()
                                       ? json["_class_name"].get<std::string>()
                                       : std::string();
    const bool euler = class_name == "EulerDiscreteScheduler";
    const bool heun = class_name == "HeunDiscreteScheduler";
    // The class's defaults (sampler_kind.h): DDPM's and DDIM's is leading (difftrain's
    // default for them is DiT's respacing), as an unknown class's.
    const std::optional<SamplerKind> sampler = SamplerOfScheduler(class_name);
    const bool karras_class = sampler && TakesKarrasSigmas(*sampler);
    const std::string class_spacing =
        sampler && DefaultSpacing(*sampler) != "respace" ? DefaultSpacing(*sampler) : "leading";
    // A class with one spacing has no timestep_spacing key: from_config ignores one given.
    s.kind = sampler && HasOneSpacing(*sampler) ? class_spacing
                                                : json.value("timestep_spacing", class_spacing);
    if (s.kind == "respace")
      return Errorf("timestep_spacing: 'respace' is not a diffusers spacing");
    s.steps_offset = JsonIntOr(json, "steps_offset", 0);
    // Its default is the class's: PNDMScheduler's false, DDIMScheduler's true.
    s.set_alpha_to_one = json.value("set_alpha_to_one", class_name != "PNDMScheduler");
    if (json.value("thresholding", false))
      return Errorf("thresholding: true (dynamic thresholding) is not supported");
    // null is the signature's default of use_karras_sigmas, sigma_min and sigma_max.
    const auto number_or_null = [&](const char* key) {
      return json.contains(key) && !json[key].is_null() ? json[key].get<double>() : 0.0;
    };
    s.karras = karras_class && json.contains("use_karras_sigmas") &&
               !json["use_karras_sigmas"].is_null() && json["use_karras_sigmas"].get<bool>();
    if (euler && s.karras) {
      s.sigma_min = number_or_null("sigma_min");
      s.sigma_max = number_or_null("sigma_max");
    }
    if (heun && json.value("clip_sample", false))
      return Errorf("clip_sample: true is not supported (Heun's x0 predictions are not clipped)");
    if (euler && json.value("interpolation_type", std::string("linear")) != "linear")
      return Errorf("interpolation_type: only linear is supported");
    if (euler && json.value("timestep_type", std::string("discrete")) != "discrete")
      return Errorf("timestep_type: only discrete is supported");
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(s.Validate());
  return s;
}

std::vector<int> SpaceTimesteps(int T, int N) {
  DT_CHECK(N >= 1 && N <= T, "cannot keep {} of {} timesteps", N, T);
  // As respace.py: the position advances by a float stride and each is rounded on its own,
  // half to even (std::nearbyint in the default rounding mode, like Python's round).
  const double stride = N == 1 ? 1.0 : static_cast<double>(T - 1) / (N - 1);
  std::vector<int> kept;
  double position = 0;
  for (int i = 0; i < N; ++i) {
    kept.push_back(static_cast<int>(std::nearbyint(position)));
    position += stride;
  }
  return kept;
}

Result<std::vector<int>> DiffusersTimesteps(int T, int N, const TimestepSpacing& spacing) {
  DT_RETURN_IF_ERROR(spacing.Validate());
  DT_CHECK(spacing.diffusers(), "respace is not a diffusers spacing");
  if (N < 1 || N > T) {
    return Errorf("sampling steps must be between 1 and the diffusion's {} steps, got {}", T, N);
  }
  std::vector<int> kept;
  if (spacing.kind == "leading") {
    for (int k = 0; k < N; ++k)
      kept.push_back(k * (T / N) + spacing.steps_offset);
  } else if (spacing.kind == "trailing") {
    // numpy.arange(T, 0, −T/N) fills T + k·δ with δ = (T − T/N) − T. Where rounding makes
    // it one element longer (N = 61 of 1000, …), diffusers runs a step at timestep −1; the
    // N timesteps before it are kept here.
    const double delta = (T - static_cast<double>(T) / N) - T;
    for (int k = N - 1; k >= 0; --k)
      kept.push_back(static_cast<int>(std::nearbyint(T + k * delta)) - 1);
  } else {
    // numpy.linspace(0, T − 1, N): k · step, the last value exactly T − 1.
    const double step = N > 1 ? static_cast<double>(T - 1) / (N - 1) : 0;
    for (int k = 0; k < N; ++k)
      kept.push_back(k == N - 1 && N > 1 ? T - 1 : static_cast<int>(std::nearbyint(k * step)));
  }
  if (kept.back() > T - 1 || kept.front() < 0) {
    return Errorf(
        "{} spacing with steps_offset {} puts the timesteps of {} steps in [{}, {}], outside "
        "the diffusion's [0, {}]",
        spacing.kind, spacing.steps_offset, N, kept.front(), kept.back(), T - 1);
  }
  return kept;
}

Result<std::vector<SamplingStep>> DiffusersSteps(const std::vector<double>& alphas_cumprod, int N,
                                                 const TimestepSpacing& spacing, bool ddim) {
  const int T = static_cast<int>(alphas_cumprod.size());
  DT_ASSIGN_OR_RETURN(const std::vector<int> kept, DiffusersTimesteps(T, N, spacing));
  const double final_alpha = ddim && !spacing.set_alpha_to_one ? alphas_cumprod[0] : 1.0;
  std::vector<SamplingStep> steps;
  for (int t : kept) {
    const int prev = t - T / N;
    steps.push_back({t, alphas_cumprod[t], prev >= 0 ? alphas_cumprod[prev] : final_alpha});
  }
  return steps;
}

Result<std::vector<PlmsCall>> PlmsCalls(const std::vector<double>& alphas_cumprod, int N,
                                        const TimestepSpacing& spacing, int begin) {
  const int T = static_cast<int>(alphas_cumprod.size());
  DT_ASSIGN_OR_RETURN(const std::vector<int> kept, DiffusersTimesteps(T, N, spacing));
  const int stride = T / N;
  auto abar = [&](int t) {
    return t >= 0 ? alphas_cumprod[t] : spacing.set_alpha_to_one ? 1.0 : alphas_cumprod[0];
  };
  std::vector<int> order = {kept[N - 1]};
  for (int k = N - 2; k >= 0; --k) {
    order.push_back(kept[k]);
    if (k == N - 2) order.push_back(kept[k]);
  }
  DT_CHECK(begin >= 0 && size_t(begin) < order.size(), "PNDM from call {} of {}", begin,
           order.size());
  order.erase(order.begin(), order.begin() + begin);
  std::vector<PlmsCall> calls;
  for (size_t c = 0; c < order.size(); ++c) {
    const int t = order[c];
    if (c == 1 && t + stride > T - 1) {
      return Errorf("PNDM's second call redoes a step from timestep {}, past the diffusion's {}",
                    t + stride, T - 1);
    }
    calls.push_back(c == 1 ? PlmsCall{t, abar(t + stride), abar(t)}
                           : PlmsCall{t, abar(t), abar(t - stride)});
  }
  return calls;
}

Result<std::vector<EulerStep>> EulerSteps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing) {
  const int T = static_cast<int>(alphas_cumprod.size());
  DT_ASSIGN_OR_RETURN(const std::vector<int> kept, DiffusersTimesteps(T, N, spacing));
  // numpy.interp of σ over the integer timesteps.
  auto sigma_at = [&](double t) {
    const int lo = std::clamp(static_cast<int>(std::floor(t)), 0, T - 1);
    const int hi = std::min(lo + 1, T - 1);
    return DiffusionSigma(alphas_cumprod, lo) +
           (t - lo) * (DiffusionSigma(alphas_cumprod, hi) - DiffusionSigma(alphas_cumprod, lo));
  };
  std::vector<EulerStep> steps;
  for (int k = N - 1; k >= 0; --k) {
    // linspace keeps its fractional timesteps here (numpy.linspace's k · step, the last
    // exactly T − 1), rounded to float32 as diffusers' are.
    const double step = N > 1 ? (T - 1.0) / (N - 1) : 0.0;
    const float t = spacing.kind != "linspace" ? static_cast<float>(kept[k])
                    : k == N - 1 && N > 1      ? static_cast<float>(T - 1)
                                               : static_cast<float>(k * step);
    steps.push_back({t, sigma_at(t), 0.0});
  }
  if (spacing.karras) {
    const std::vector<double> sigmas =
        KarrasSigmas(spacing.sigma_min > 0 ? spacing.sigma_min : steps.back().sigma,
                     spacing.sigma_max > 0 ? spacing.sigma_max : steps.front().sigma, N);
    for (int k = 0; k < N; ++k)
      steps[k] = {static_cast<float>(SigmaToTimestep(sigmas[k], alphas_cumprod)), sigmas[k], 0.0};
  }
  for (size_t i = 0; i + 1 < steps.size(); ++i)
    steps[i].sigma_next = steps[i + 1].sigma;
  return steps;
}

namespace {

// Each step but the last gets its midpoint: the geometric mean of σ and σ' (of σ and σ_down
// where `to_down`), exp of the mean of the logs as diffusers' log-space lerp, at its
// SigmaToTimestep (unrounded).
void AddMidpoints(const std::vector<double>& alphas_cumprod, bool to_down,
                  std::vector<EulerStep>& steps) {
  for (EulerStep& s : steps) {
    if (s.sigma_next == 0) continue;  // the last step: Euler's, to x0
    const double to = to_down ? SplitAncestralStep(s.sigma, s.sigma_next).down : s.sigma_next;
    s.sigma_mid = std::exp(0.5 * (std::log(s.sigma) + std::log(to)));
    s.timestep_mid = static_cast<float>(SigmaToTimestep(s.sigma_mid, alphas_cumprod));
  }
}

}  // namespace

Result<std::vector<EulerStep>> Kdpm2Steps(const std::vector<double>& alphas_cumprod, int N,
                                          const TimestepSpacing& spacing, bool ancestral) {
  DT_ASSIGN_OR_RETURN(std::vector<EulerStep> steps, EulerSteps(alphas_cumprod, N, spacing));
  // KDPM2's Karras timesteps are rounded (numpy's round, half to even), Euler's are not.
  for (EulerStep& s : steps) {
    if (spacing.karras) s.timestep = std::nearbyint(s.timestep);
  }
  AddMidpoints(alphas_cumprod, ancestral, steps);
  return steps;
}

Result<std::vector<EulerStep>> DpmSdeSteps(const std::vector<double>& alphas_cumprod, int N,
                                           const TimestepSpacing& spacing) {
  DT_ASSIGN_OR_RETURN(std::vector<EulerStep> steps, EulerSteps(alphas_cumprod, N, spacing));
  AddMidpoints(alphas_cumprod, /*to_down=*/false, steps);
  return steps;
}

std::vector<double> KarrasSigmas(double sigma_min, double sigma_max, int N) {
  constexpr double kRho = 7.0;
  const double min_inv_rho = std::pow(sigma_min, 1 / kRho);
  const double max_inv_rho = std::pow(sigma_max, 1 / kRho);
  std::vector<double> sigmas;
  for (int k = 0; k < N; ++k) {
    // numpy.linspace(0, 1, N): k · (1/(N − 1)), the last exactly 1.
    const double ramp = N == 1 ? 0.0 : k == N - 1 ? 1.0 : k * (1.0 / (N - 1));
    sigmas.push_back(std::pow(max_inv_rho + ramp * (min_inv_rho - max_inv_rho), kRho));
  }
  return sigmas;
}

double SigmaToTimestep(double sigma, const std::vector<double>& alphas_cumprod) {
  const int T = static_cast<int>(alphas_cumprod.size());
  DT_CHECK(T >= 2, "a diffusion of {} steps", T);
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  // The last timestep whose log σ is at most log_sigma (σ grows with t), at most T − 2.
  int lo = 0;
  for (int k = 0; k < T; ++k) {
    if (log_sigma >= std::log(DiffusionSigma(alphas_cumprod, k))) lo = k;
  }
  lo = std::min(lo, T - 2);
  const double low = std::log(DiffusionSigma(alphas_cumprod, lo));
  const double high = std::log(DiffusionSigma(alphas_cumprod, lo + 1));
  const double w = std::clamp((low - log_sigma) / (low - high), 0.0, 1.0);
  return (1 - w) * lo + w * (lo + 1);
}

double LmsCoefficient(const std::vector<EulerStep>& steps, int k, int order, int j) {
  DT_CHECK(k >= 0 && k < static_cast<int>(steps.size()) && order >= 1 && order <= k + 1 && j >= 0 &&
               j < order,
           "LMS coefficient of step {} (order {}, slope {})", k, order, j);
  const auto basis = [&](double tau) {
    double product = 1;
    for (int m = 0; m < order; ++m) {
      if (m == j) continue;
      product *= (tau - steps[k - m].sigma) / (steps[k - j].sigma - steps[k - m].sigma);
    }
    return product;
  };
  // The basis polynomial has degree order − 1 ≤ 3 (diffusers' order is 4): 3-point
  // Gauss–Legendre, exact to degree 5, integrates it exactly.
  const double a = steps[k].sigma, b = steps[k].sigma_next;
  const double mid = (a + b) / 2, half = (b - a) / 2, node = half * std::sqrt(0.6);
  return half * (5 * basis(mid - node) + 8 * basis(mid) + 5 * basis(mid + node)) / 9;
}

double EulerInitialSigma(const std::vector<EulerStep>& steps, const TimestepSpacing& spacing) {
  const double top = steps.front().sigma;
  return spacing.kind == "leading" ? std::sqrt(top * top + 1) : top;
}

}  // namespace difftrain
