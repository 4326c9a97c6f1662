#include "model/diffusion/gaussian_diffusion.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/json_read.h"
#include "model/diffusion/sampler_kind.h"
#include "model/tensor/rng.h"

namespace difftrain {

namespace {

// Improved DDPM's ᾱ(t) for t in [0, 1] (offset s = 0.008), and its cap on β.
double CosineAlphaBar(double t) {
  const double angle = (t + 0.008) / 1.008 * M_PI / 2;
  return std::cos(angle) * std::cos(angle);
}
constexpr double kCosineMaxBeta = 0.999;

// Lin et al.'s Algorithm 1 (diffusers' rescale_zero_terminal_snr): √ᾱ_t − √ᾱ_{T−1}, scaled back
// to √ᾱ_0 at t = 0, and the β's of those ᾱ's. The last β is 1: ᾱ_{T−1} is exactly 0.
void RescaleToZeroTerminalSnr(std::vector<double>& betas) {
  const size_t n = betas.size();
  std::vector<double> root(n);
  double cumprod = 1;
  for (size_t i = 0; i < n; ++i) {
    cumprod *= 1 - betas[i];
    root[i] = std::sqrt(cumprod);
  }
  const double first = root[0], last = root[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const double rescaled = (root[i] - last) * (first / (first - last));
    root[i] = rescaled * rescaled;  // now ᾱ_i
  }
  for (size_t i = n; i-- > 0;)
    betas[i] = 1 - (i > 0 ? root[i] / root[i - 1] : root[0]);
}

}  // namespace

namespace {

// The schedule's β's, one per step (zero terminal SNR's rescale applied): config must be valid
// up to them (steps, schedule and betas).
std::vector<double> Betas(const DiffusionConfig& config) {
  const int n = config.steps;
  std::vector<double> betas(n);
  for (int i = 0; i < n; ++i) {
    if (config.schedule == "cosine") {
      betas[i] = std::min(1.0 - CosineAlphaBar(static_cast<double>(i + 1) / n) /
                                    CosineAlphaBar(static_cast<double>(i) / n),
                          kCosineMaxBeta);
    } else if (config.schedule == "scaled_linear") {
      // numpy.linspace(√beta_start, √beta_end, n)², as diffusers' "scaled_linear".
      const double lo = std::sqrt(config.beta_start), hi = std::sqrt(config.beta_end);
      const double root = n == 1 ? lo : lo + (hi - lo) * i / (n - 1);
      betas[i] = root * root;
    } else {
      // numpy.linspace(beta_start, beta_end, n): start + i·step, the last value exact.
      betas[i] = n == 1 ? config.beta_start
                        : config.beta_start + (config.beta_end - config.beta_start) * i / (n - 1);
    }
  }
  if (config.zero_terminal_snr) RescaleToZeroTerminalSnr(betas);
  return betas;
}

}  // namespace

Status DiffusionConfig::Validate() const {
  if (steps < 1) return Errorf("diffusion.steps must be positive, got {}", steps);
  // Each step is a row of the schedule's tables (and a scheduler_config.json's
  // num_train_timesteps is whatever its file says): DDPM trains on 1,000, Improved DDPM 4,000.
  if (steps > kMaxSteps) {
    return Errorf("diffusion.steps {} is more than the {} a schedule may have", steps, kMaxSteps);
  }
  if (schedule != "linear" && schedule != "cosine" && schedule != "scaled_linear") {
    return Errorf("diffusion.schedule: expected linear, scaled_linear or cosine, found '{}'",
                  schedule);
  }
  if (schedule != "cosine" && !(beta_start > 0 && beta_start <= beta_end && beta_end < 1)) {
    return Errorf("diffusion betas must satisfy 0 < beta_start <= beta_end < 1, got {} and {}",
                  beta_start, beta_end);
  }
  if (loss_weighting != "uniform" && loss_weighting != "min_snr") {
    return Errorf("diffusion.loss_weighting: expected uniform or min_snr, found '{}'",
                  loss_weighting);
  }
  if (prediction != "epsilon" && prediction != "v") {
    return Errorf("diffusion.prediction: expected epsilon or v, found '{}'", prediction);
  }
  if (!(frame_noise_correlation >= 0 && frame_noise_correlation < 1)) {
    return Errorf("diffusion.frame_noise_correlation: expected a number in [0, 1), found {}",
                  frame_noise_correlation);
  }
  if (zero_terminal_snr && steps < 2) {
    return Status::Error("diffusion.zero_terminal_snr needs at least 2 steps");
  }
  if (zero_terminal_snr && prediction != "v") {
    return Status::Error(
        "diffusion.zero_terminal_snr needs prediction v: at the last timestep x_t is pure noise, "
        "from which ε-prediction cannot tell x0 (Lin et al. 2024)");
  }
  if (!(noise_offset >= 0 && std::isfinite(noise_offset))) {
    return Errorf("diffusion.noise_offset: expected a number >= 0, found {}", noise_offset);
  }
  if (!(input_perturbation >= 0 && std::isfinite(input_perturbation))) {
    return Errorf("diffusion.input_perturbation: expected a number >= 0, found {}",
                  input_perturbation);
  }
  if (!(min_snr_gamma > 0)) {
    return Errorf("diffusion.min_snr_gamma: expected a positive number, found {}", min_snr_gamma);
  }
  // Every ᾱ_t must stay a normal float32 (at least 1.2e-38), as diffusers' tables hold it:
  // below, σ_t = √((1 − ᾱ_t)/ᾱ_t) is past 9e18 and the samplers' σ-space arithmetic (the
  // ancestral split's σ⁴) overflows. β's near 1 over many steps reach it. Zero terminal SNR's
  // last ᾱ is 0 by design (the samplers take 2^-24 for it).
  const std::vector<double> betas = Betas(*this);
  double cumprod = 1.0;
  for (int t = 0; t < steps - (zero_terminal_snr ? 1 : 0); ++t) {
    cumprod *= 1.0 - betas[t];
    if (!(cumprod >= std::numeric_limits<float>::min())) {
      return Errorf(
          "diffusion: the schedule's alpha_cumprod falls to {:.3g} at timestep {} of {} (betas "
          "from {} to {}), below float32's smallest normal number: lower beta_end or the steps",
          cumprod, t, steps, betas.front(), betas.back());
    }
  }
  return Status::Ok();
}

nlohmann::json DiffusionConfig::ToJson() const {
  nlohmann::json json = {{"schedule", schedule},
                         {"steps", steps},
                         {"beta_start", beta_start},
                         {"beta_end", beta_end},
                         {"loss_weighting", loss_weighting},
                         {"min_snr_gamma", min_snr_gamma},
                         {"prediction", prediction},
                         {"frame_noise_correlation", frame_noise_correlation},
                         {"zero_terminal_snr", zero_terminal_snr}};
  // Written only where set, so that the metadata of every run without them is as before.
  if (noise_offset > 0) json["noise_offset"] = noise_offset;
  if (input_perturbation > 0) json["input_perturbation"] = input_perturbation;
  return json;
}

Result<DiffusionConfig> DiffusionConfig::FromJson(const nlohmann::json& json) {
  DiffusionConfig c;
  try {
    c.schedule = json.value("schedule", c.schedule);
    c.steps = JsonInt(json.at("steps"), "steps");
    c.beta_start = json.at("beta_start").get<double>();
    c.beta_end = json.at("beta_end").get<double>();
    c.loss_weighting = json.value("loss_weighting", c.loss_weighting);
    c.min_snr_gamma = json.value("min_snr_gamma", c.min_snr_gamma);
    c.prediction = json.value("prediction", c.prediction);
    c.frame_noise_correlation = json.value("frame_noise_correlation", c.frame_noise_correlation);
    c.zero_terminal_snr = json.value("zero_terminal_snr", c.zero_terminal_snr);
    c.noise_offset = json.value("noise_offset", c.noise_offset);
    c.input_perturbation = json.value("input_perturbation", c.input_perturbation);
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed diffusion config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

nlohmann::json DiffusionConfig::ToDiffusersScheduler(bool clip_sample) const {
  return {{"_class_name", "DDIMScheduler"},
          {"_diffusers_version", "0.27.2"},
          {"num_train_timesteps", steps},
          {"beta_schedule", schedule == "cosine" ? "squaredcos_cap_v2" : schedule},
          {"beta_start", beta_start},
          {"beta_end", beta_end},
          {"prediction_type", prediction == "v" ? "v_prediction" : prediction},
          {"rescale_betas_zero_snr", zero_terminal_snr},
          {"clip_sample", clip_sample},
          {"set_alpha_to_one", false},
          {"steps_offset", zero_terminal_snr ? 0 : 1},
          {"timestep_spacing", zero_terminal_snr ? "trailing" : "leading"},
          {"trained_betas", nullptr}};
}

Result<DiffusionConfig> DiffusionConfig::FromDiffusersScheduler(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("the scheduler config is not a JSON object");
  DiffusionConfig c;
  try {
    c.steps = JsonIntOr(json, "num_train_timesteps", 1000);
    // The class's defaults (sampler_kind.h).
    const BetaDefaults defaults = DiffusersBetaDefaults(json.value("_class_name", std::string()));
    c.beta_start = json.value("beta_start", defaults.start);
    c.beta_end = json.value("beta_end", defaults.end);
    const std::string schedule = json.value("beta_schedule", defaults.schedule);
    if (schedule == "squaredcos_cap_v2") {
      c.schedule = "cosine";
    } else if (schedule == "linear" || schedule == "scaled_linear") {
      c.schedule = schedule;
    } else {
      return Errorf(
          "beta_schedule: '{}' is not supported (linear, scaled_linear, squaredcos_cap_v2)",
          schedule);
    }
    const std::string prediction = json.value("prediction_type", std::string("epsilon"));
    if (prediction == "v_prediction") {
      c.prediction = "v";
    } else if (prediction == "epsilon") {
      c.prediction = prediction;
    } else {
      return Errorf("prediction_type: '{}' is not supported (epsilon, v_prediction)", prediction);
    }
    if (json.contains("trained_betas") && !json["trained_betas"].is_null())
      return Errorf("trained_betas: a schedule given as a list is not supported");
    c.zero_terminal_snr = json.value("rescale_betas_zero_snr", false);
    if (c.zero_terminal_snr && c.prediction != "v") {
      return Errorf(
          "rescale_betas_zero_snr: true needs prediction_type v_prediction (at the last timestep "
          "x_t is pure noise, from which '{}' cannot tell x0)",
          prediction);
    }
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed scheduler config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

GaussianDiffusion::GaussianDiffusion(const DiffusionConfig& config) : config_(config) {
  Status valid = config.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  betas_ = Betas(config);
  alphas_cumprod_.resize(config.steps);
  double cumprod = 1.0;
  for (int i = 0; i < config.steps; ++i) {
    cumprod *= 1.0 - betas_[i];
    alphas_cumprod_[i] = cumprod;
  }
}

double GaussianDiffusion::LossWeight(int64_t t) const {
  DT_CHECK(t >= 0 && t < config_.steps, "timestep {} out of range", t);
  if (config_.loss_weighting == "uniform") return 1.0;
  // Both weight the x0-MSE by min(SNR, γ): the ε-MSE is SNR times the x0-MSE, the v-MSE
  // (SNR + 1) times it.
  const double snr = alphas_cumprod_[t] / (1.0 - alphas_cumprod_[t]);
  return std::min(snr, config_.min_snr_gamma) / (predicts_noise() ? snr : snr + 1);
}

std::vector<double> GaussianDiffusion::LossWeights(const int64_t* t, int B) const {
  if (config_.loss_weighting == "uniform") return {};
  std::vector<double> weights(B);
  for (int b = 0; b < B; ++b)
    weights[b] = LossWeight(t[b]);
  return weights;
}

void GaussianDiffusion::Mix(float* out, const float* first, const float* second, const int64_t* t,
                            int B, size_t n, float sign, const float* third) const {
  for (int b = 0; b < B; ++b) {
    DT_CHECK(t[b] >= 0 && t[b] < config_.steps, "timestep {} out of range", t[b]);
    const float a = static_cast<float>(std::sqrt(alphas_cumprod_[t[b]]));
    const float s = sign * static_cast<float>(std::sqrt(1.0 - alphas_cumprod_[t[b]]));
    const size_t base = static_cast<size_t>(b) * n;
    if (third == nullptr) {
      for (size_t i = 0; i < n; ++i)
        out[base + i] = a * first[base + i] + s * second[base + i];
      continue;
    }
    for (size_t i = 0; i < n; ++i)
      out[base + i] = a * first[base + i] + s * (second[base + i] + third[base + i]);
  }
}

void GaussianDiffusion::DrawNoiseExtras(Rng& rng, int frames, int channels, size_t plane,
                                        float* noise, float* perturbation) const {
  if (config_.noise_offset > 0) {
    const float offset = static_cast<float>(config_.noise_offset);
    for (int c = 0; c < channels; ++c) {
      const float shift = offset * static_cast<float>(rng.Normal());
      for (int f = 0; f < frames; ++f) {
        float* p = noise + (size_t(f) * channels + c) * plane;
        for (size_t i = 0; i < plane; ++i)
          p[i] += shift;
      }
    }
  }
  if (!perturbs_input()) return;
  DT_CHECK(perturbation != nullptr, "input_perturbation needs somewhere to write");
  const float scale = static_cast<float>(config_.input_perturbation);
  const size_t n = size_t(frames) * channels * plane;
  for (size_t i = 0; i < n; ++i)
    perturbation[i] = scale * static_cast<float>(rng.Normal());
}

void GaussianDiffusion::QSample(float* x_t, const float* x0, const float* noise, const int64_t* t,
                                int B, size_t n, const float* perturbation) const {
  Mix(x_t, x0, noise, t, B, n, 1.0f, perturbation);
}

void GaussianDiffusion::Target(float* target, const float* x0, const float* noise, const int64_t* t,
                               int B, size_t n) const {
  if (predicts_noise()) {
    std::memcpy(target, noise, static_cast<size_t>(B) * n * sizeof(float));
    return;
  }
  Mix(target, noise, x0, t, B, n, -1.0f);
}

template <typename T>
void DrawFrameNoise(Rng& rng, double rho, int frames, size_t frame, T* out) {
  const size_t n = static_cast<size_t>(frames) * frame;
  if (rho == 0) {
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(rng.Normal());
    return;
  }
  std::vector<double> shared(frame);
  for (double& s : shared)
    s = rng.Normal();
  const double a = std::sqrt(rho), b = std::sqrt(1 - rho);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(a * shared[i % frame] + b * rng.Normal());
}
template void DrawFrameNoise(Rng&, double, int, size_t, float*);
template void DrawFrameNoise(Rng&, double, int, size_t, double*);

double EpsilonMseLoss(const float* output, const float* noise, int B, int C, int out_channels,
                      int HW, float grad_scale, float* dout, const double* weights) {
  const size_t count = static_cast<size_t>(B) * C * HW;
  std::memset(dout, 0, static_cast<size_t>(B) * out_channels * HW * sizeof(float));
  double sum = 0;
  for (int b = 0; b < B; ++b) {
    const double weight = weights != nullptr ? weights[b] : 1.0;
    const float grad_coeff =
        static_cast<float>(2.0 * weight / static_cast<double>(count)) * grad_scale;
    double sample_sum = 0;
    for (size_t i = 0; i < static_cast<size_t>(C) * HW; ++i) {
      const size_t o = static_cast<size_t>(b) * out_channels * HW + i;
      const float diff = output[o] - noise[static_cast<size_t>(b) * C * HW + i];
      sample_sum += static_cast<double>(diff) * diff;
      dout[o] = grad_coeff * diff;
    }
    sum += weight * sample_sum;
  }
  return sum / static_cast<double>(count);
}

}  // namespace difftrain
