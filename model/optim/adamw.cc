#include "model/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace difftrain {
namespace {

// The lr_schedule values that name diffusers' schedules.
constexpr const char* kDiffusersSchedules[] = {
    "diffusers_constant", "diffusers_constant_with_warmup", "diffusers_linear",
    "diffusers_cosine",   "diffusers_cosine_with_restarts", "diffusers_polynomial"};

}  // namespace

Status OptimizerConfig::Validate() const {
  if (!(lr > 0)) return Errorf("optimizer.lr must be positive, got {}", lr);
  if (!(beta1 >= 0 && beta1 < 1)) return Errorf("optimizer.beta1 must be in [0, 1), got {}", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) return Errorf("optimizer.beta2 must be in [0, 1), got {}", beta2);
  if (!(eps > 0)) return Errorf("optimizer.eps must be positive, got {}", eps);
  if (weight_decay < 0) return Errorf("optimizer.weight_decay must be >= 0, got {}", weight_decay);
  if (warmup_steps < 0) return Errorf("optimizer.warmup_steps must be >= 0, got {}", warmup_steps);
  if (grad_clip < 0) return Errorf("optimizer.grad_clip must be >= 0, got {}", grad_clip);
  if (lr_schedule != "constant" && lr_schedule != "cosine" &&
      std::find(std::begin(kDiffusersSchedules), std::end(kDiffusersSchedules), lr_schedule) ==
          std::end(kDiffusersSchedules)) {
    return Errorf(
        "optimizer.lr_schedule: expected constant, cosine or one of diffusers' schedules ({}), "
        "found '{}'",
        fmt::join(std::begin(kDiffusersSchedules), std::end(kDiffusersSchedules), ", "),
        lr_schedule);
  }
  if (lr_num_cycles < 1)
    return Errorf("optimizer.lr_num_cycles must be >= 1, got {}", lr_num_cycles);
  if (!(lr_power > 0 && std::isfinite(lr_power)))
    return Errorf("optimizer.lr_power must be positive, got {}", lr_power);
  if (lr_schedule == "diffusers_polynomial" && !(lr > kDiffusersPolynomialLrEnd)) {
    return Errorf("optimizer.lr must exceed diffusers_polynomial's final rate {}, got {}",
                  kDiffusersPolynomialLrEnd, lr);
  }
  if (!(ema_decay >= 0 && ema_decay <= 1))
    return Errorf("optimizer.ema_decay must be in [0, 1], got {}", ema_decay);
  if (ema_schedule != "constant" && ema_schedule != "diffusers" &&
      ema_schedule != "diffusers_warmup") {
    return Errorf(
        "optimizer.ema_schedule: expected constant, diffusers or diffusers_warmup, found '{}'",
        ema_schedule);
  }
  if (!(ema_inv_gamma > 0 && std::isfinite(ema_inv_gamma)))
    return Errorf("optimizer.ema_inv_gamma must be positive, got {}", ema_inv_gamma);
  if (!(ema_power > 0 && std::isfinite(ema_power)))
    return Errorf("optimizer.ema_power must be positive, got {}", ema_power);
  return Status::Ok();
}

nlohmann::json OptimizerConfig::ToJson() const {
  nlohmann::json json = {{"lr", lr},
                         {"beta1", beta1},
                         {"beta2", beta2},
                         {"eps", eps},
                         {"weight_decay", weight_decay},
                         {"warmup_steps", warmup_steps},
                         {"lr_schedule", lr_schedule},
                         {"grad_clip", grad_clip},
                         {"ema_decay", ema_decay}};
  // Written only where they take effect, so that older runs' metadata is unchanged.
  if (lr_schedule == "diffusers_cosine_with_restarts") json["lr_num_cycles"] = lr_num_cycles;
  if (lr_schedule == "diffusers_polynomial") json["lr_power"] = lr_power;
  if (ema_schedule != "constant") json["ema_schedule"] = ema_schedule;
  if (ema_schedule == "diffusers_warmup") {
    json["ema_inv_gamma"] = ema_inv_gamma;
    json["ema_power"] = ema_power;
  }
  return json;
}

double EmaDecayAt(const OptimizerConfig& config, int64_t step) {
  if (config.ema_schedule == "constant") return config.ema_decay;
  const int64_t s = step - 1;
  if (s <= 0) return 0.0;
  const double decay =
      config.ema_schedule == "diffusers_warmup"
          ? 1.0 - std::pow(1.0 + double(s) / config.ema_inv_gamma, -config.ema_power)
          : (1.0 + double(s)) / (10.0 + double(s));
  return std::min(config.ema_decay, decay);
}

double ScheduledLearningRate(double lr, double warmup_steps, bool cosine, int64_t step,
                             int64_t total_steps) {
  const double warmup =
      warmup_steps > 0 ? std::min(1.0, static_cast<double>(step + 1) / warmup_steps) : 1.0;
  const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
  return lr * warmup * (cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0);
}

double DiffusersLrFactor(const OptimizerConfig& config, const std::string& name, int64_t step,
                         int64_t total_steps) {
  // Each line is diffusers' lr_lambda, in its order of operations (so the rates are the same
  // doubles as LambdaLR's base_lr · lambda).
  const double current = static_cast<double>(step);
  const int64_t warmup = config.warmup_steps;
  if (name == "constant") return 1.0;
  if (current < static_cast<double>(warmup))
    return current / static_cast<double>(std::max<int64_t>(1, warmup));
  if (name == "constant_with_warmup") return 1.0;
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  const double progress = (current - static_cast<double>(warmup)) / decay_steps;
  if (name == "linear") return std::max(0.0, static_cast<double>(total_steps - step) / decay_steps);
  if (name == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)));
  if (name == "cosine_with_restarts") {
    if (progress >= 1.0) return 0.0;
    const double phase = std::fmod(static_cast<double>(config.lr_num_cycles) * progress, 1.0);
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * phase)));
  }
  // polynomial
  const double lr_init = config.lr, lr_end = kDiffusersPolynomialLrEnd;
  if (step > total_steps) return lr_end / lr_init;
  const double pct_remaining =
      1.0 - (current - static_cast<double>(warmup)) / static_cast<double>(total_steps - warmup);
  // Stored apart so that the compiler cannot fuse the product and the sum into one fma, which
  // Python does not.
  const volatile double scaled = (lr_init - lr_end) * std::pow(pct_remaining, config.lr_power);
  return (scaled + lr_end) / lr_init;
}

double LearningRate(const OptimizerConfig& config, int64_t step, int64_t total_steps) {
  const std::string_view prefix = "diffusers_";
  if (config.lr_schedule.starts_with(prefix)) {
    return config.lr *
           DiffusersLrFactor(config, config.lr_schedule.substr(prefix.size()), step, total_steps);
  }
  return ScheduledLearningRate(config.lr, static_cast<double>(config.warmup_steps),
                               config.lr_schedule == "cosine", step, total_steps);
}

double SumOfSquares(const float* g, size_t n) {
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (size_t i = 0; i < n; ++i)
    sum += static_cast<double>(g[i]) * g[i];
  return sum;
}

double ClipScale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

AdamWScalars AdamWScalarsAt(double lr, int64_t step, const OptimizerConfig& config) {
  return {.beta1 = static_cast<float>(config.beta1),
          .beta2 = static_cast<float>(config.beta2),
          .eps = static_cast<float>(config.eps),
          .decay = static_cast<float>(1.0 - lr * config.weight_decay),
          .step_size = static_cast<float>(lr / (1.0 - std::pow(config.beta1, step))),
          .bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, step)))};
}

void AdamWUpdate(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t n,
                 double lr, double grad_scale, int64_t step, const OptimizerConfig& config) {
  const AdamWScalars k = AdamWScalarsAt(lr, step, config);
  const float scale = static_cast<float>(grad_scale);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * scale;
    params[i] *= k.decay;
    exp_avg[i] = k.beta1 * exp_avg[i] + (1 - k.beta1) * g;
    exp_avg_sq[i] = k.beta2 * exp_avg_sq[i] + (1 - k.beta2) * g * g;
    params[i] -= k.step_size * exp_avg[i] / (std::sqrt(exp_avg_sq[i]) / k.bias2_sqrt + k.eps);
  }
}

void EmaUpdate(float* ema, const float* params, size_t n, double decay) {
  const float d = static_cast<float>(decay), keep = static_cast<float>(1.0 - decay);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i)
    ema[i] = d * ema[i] + keep * params[i];
}

}  // namespace difftrain
