#include "model/diffusion/lcm.h"

#include <cmath>
#include <string>

namespace difftrain {
namespace {

constexpr double kSigmaData = 0.5;  // the consistency model's σ_data

}  // namespace

Status LcmOptions::Validate() const {
  if (original_steps < 1)
    return Errorf("original_inference_steps must be positive, got {}", original_steps);
  if (!(timestep_scaling > 0 && std::isfinite(timestep_scaling)))
    return Errorf("timestep_scaling must be positive, got {}", timestep_scaling);
  if (!(strength > 0 && strength <= 1))
    return Errorf("the strength must be in (0, 1], got {}", strength);
  return Status::Ok();
}

nlohmann::json LcmOptions::ToJson() const {
  nlohmann::json json = {{"original_inference_steps", original_steps},
                         {"timestep_scaling", timestep_scaling}};
  if (strength != 1) json["strength"] = strength;
  return json;
}

Result<LcmOptions> LcmOptions::FromDiffusersScheduler(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  LcmOptions o;
  try {
    o.original_steps = json.value("original_inference_steps", o.original_steps);
    o.timestep_scaling = json.value("timestep_scaling", o.timestep_scaling);
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(o.Validate());
  return o;
}

double LcmOptions::SkipCoefficient(int t) const {
  const double s = t * timestep_scaling;
  return kSigmaData * kSigmaData / (s * s + kSigmaData * kSigmaData);
}

double LcmOptions::OutCoefficient(int t) const {
  const double s = t * timestep_scaling;
  return s / std::sqrt(s * s + kSigmaData * kSigmaData);
}

Result<std::vector<SamplingStep>> LcmSteps(const std::vector<double>& alphas_cumprod, int N,
                                           const LcmOptions& options) {
  DT_RETURN_IF_ERROR(options.Validate());
  const int T = static_cast<int>(alphas_cumprod.size());
  const int original = options.original_steps;
  if (original > T) {
    return Errorf("original_inference_steps {} exceeds the diffusion's {} timesteps", original, T);
  }
  // The schedule's timesteps (all the distillation's, or its strength's part of them).
  const int schedule = static_cast<int>(original * options.strength);
  if (options.strength < 1 && (N < 1 || N > schedule)) {
    return Errorf(
        "LCM at strength {} takes its steps from the first {} of the distillation's {} timesteps: "
        "1 to {} steps, got {} (lower --steps or raise --strength)",
        options.strength, schedule, original, schedule, N);
  }
  if (N < 1 || N > original) {
    return Errorf(
        "LCM takes 1 to original_inference_steps = {} steps (its timesteps are a subset of "
        "the distillation's {}), got {}",
        original, original, N);
  }
  const int stride = T / original;
  const double index_step = static_cast<double>(schedule) / N;  // numpy.linspace's step
  std::vector<int> kept(N);  // decreasing, as diffusers lists them
  for (int j = 0; j < N; ++j) {
    const int index = static_cast<int>(std::floor(j * index_step));
    kept[j] = (schedule - index) * stride - 1;
  }
  std::vector<SamplingStep> steps;
  for (int j = N - 1; j >= 0; --j) {
    const int t = kept[j];
    steps.push_back({t, alphas_cumprod[t], j + 1 < N ? alphas_cumprod[kept[j + 1]] : 1.0});
  }
  return steps;
}

Result<std::vector<TcdStep>> TcdSteps(const std::vector<double>& alphas_cumprod, int N,
                                      const LcmOptions& options, double gamma) {
  if (!(gamma >= 0 && gamma <= 1))
    return Errorf("TCD's gamma (eta) must be in [0, 1], got {}", gamma);
  DT_ASSIGN_OR_RETURN(std::vector<SamplingStep> lcm, LcmSteps(alphas_cumprod, N, options));
  std::vector<TcdStep> steps;
  for (size_t i = 0; i < lcm.size(); ++i) {
    const int next = i == 0 ? 0 : lcm[i - 1].timestep;
    // torch: (1 − γ) · t' in float32, floored.
    const int s =
        static_cast<int>(std::floor(static_cast<float>(1 - gamma) * static_cast<float>(next)));
    steps.push_back(
        {lcm[i].timestep, lcm[i].alpha_cumprod, alphas_cumprod[next], alphas_cumprod[s]});
  }
  return steps;
}

}  // namespace difftrain
