// Gaussian diffusion as DiT trains it: a linear β schedule over 1000 steps (β from 1e-4 to
// 0.02, in double precision), Improved DDPM's cosine schedule or Stable Diffusion's scaled
// linear one, q_sample, and the MSE objective of ε-prediction (uniform over timesteps as in
// DiT, or min-SNR weighted) or of v-prediction (SD 2's 768 px UNet).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

class Rng;

struct DiffusionConfig {
  int steps = 1000;  // T, at most kMaxSteps
  static constexpr int kMaxSteps = 1'000'000;
  // linear: β from beta_start to beta_end (DiT). cosine: ᾱ(t) = cos²((t/T + s)/(1 + s) · π/2)
  // with s = 0.008 and β capped at 0.999 (Nichol & Dhariwal, DiT's "squaredcos_cap_v2").
  // scaled_linear: √β linear from √beta_start to √beta_end (Stable Diffusion: 0.00085, 0.012).
  std::string schedule = "linear";
  double beta_start = 1e-4;
  double beta_end = 0.02;
  // uniform: every timestep's MSE counts alike (DiT). min_snr: sample b's ε-MSE is weighted
  // by min(SNR_t, γ) / SNR_t with SNR_t = ᾱ_t / (1 − ᾱ_t), its v-MSE by min(SNR_t, γ) /
  // (SNR_t + 1): both weigh the x0 error by min(SNR_t, γ) (Hang et al., "Efficient Diffusion
  // Training via Min-SNR Weighting Strategy").
  std::string loss_weighting = "uniform";
  double min_snr_gamma = 5;
  // What the model predicts: epsilon (the noise), or v = √ᾱ_t · ε − √(1 − ᾱ_t) · x0
  // (Salimans & Ho, "Progressive Distillation"), with the same MSE.
  std::string prediction = "epsilon";
  // Videos only: the correlation ρ in [0, 1) between the noise of a sample's frames at the
  // same position, in training (q_sample) and sampling alike; 0: independent noise.
  double frame_noise_correlation = 0;
  // The schedule rescaled to zero terminal SNR (Lin et al., "Common Diffusion Noise Schedules
  // and Sample Steps are Flawed"; diffusers' rescale_betas_zero_snr): √ᾱ_t shifted so that
  // √ᾱ_{T−1} is 0 and scaled so that √ᾱ_0 is kept, the β's recomputed from it. The last
  // timestep is then pure noise, from which only v can be predicted: needs prediction v.
  bool zero_terminal_snr = false;
  // Offset noise (Guttenberg 2023; diffusers' --noise_offset): each sample's training noise
  // plus noise_offset · o_c on every value of its channel c, o_c ~ N(0, 1), one per channel
  // (a video's frames share it), so that the model learns to move an image's mean. The
  // offset noise is q_sample's and the target's. 0: off.
  double noise_offset = 0;
  // Input perturbation (Ning et al. 2023, "Elucidating the Exposure Bias in Diffusion
  // Models"; diffusers' --input_perturbation): x_t is q_sample of the noise plus
  // input_perturbation · z, z ~ N(0, 1) per value, while the target stays the noise's.
  // 0: off.
  double input_perturbation = 0;

  Status Validate() const;
  nlohmann::json ToJson() const;
  // The inverse of ToJson (a checkpoint's metadata); fields it lacks keep their defaults.
  static Result<DiffusionConfig> FromJson(const nlohmann::json& json);
  // The training process a diffusers scheduler config describes (scheduler_config.json of a
  // pipeline; DDPM, DDIM, PNDM, Euler … share these keys): num_train_timesteps, beta_schedule
  // (linear, scaled_linear, squaredcos_cap_v2 → cosine), beta_start, beta_end and
  // prediction_type (epsilon, v_prediction → v) and rescale_betas_zero_snr, with the class's
  // (_class_name) defaults (DiffusersBetaDefaults, sampler_kind.h: LCMScheduler's are
  // scaled_linear, the Heun, KDPM2 (ancestral) and DPM-Solver SDE schedulers' 0.00085 to 0.012,
  // the others' 1e-4 to 0.02). Refused by name: trained_betas, another schedule or prediction
  // type. The sampling-time keys (timestep_spacing, steps_offset …) are TimestepSpacing's
  // (timestep_spacing.h) and the solvers'.
  static Result<DiffusionConfig> FromDiffusersScheduler(const nlohmann::json& json);
  // The inverse, as a pipeline that samples this process ships it: a DDIMScheduler's config
  // (diffusers 0.27.2) with these keys, as Stable Diffusion's configure the rest (no clipping
  // but for a model of pixels, `clip_sample`; set_alpha_to_one false, leading spacing with
  // steps_offset 1; with zero terminal SNR trailing spacing, steps_offset 0, as Lin et al.
  // sample). FromDiffusersScheduler reads it back as this.
  nlohmann::json ToDiffusersScheduler(bool clip_sample = false) const;
};

class GaussianDiffusion {
 public:
  explicit GaussianDiffusion(const DiffusionConfig& config);

  int steps() const { return config_.steps; }
  const std::vector<double>& betas() const { return betas_; }
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }
  // The weight of timestep t's ε-MSE under config.loss_weighting (1 when uniform).
  double LossWeight(int64_t t) const;
  // LossWeight of each of the B timesteps t; empty when the weighting is uniform.
  std::vector<double> LossWeights(const int64_t* t, int B) const;

  // x_t = √ᾱ_t · x0 + √(1 − ᾱ_t) · noise for each of B samples of n values. The coefficients
  // are rounded to fp32 before the product, as DiT's _extract_into_tensor does. With
  // `perturbation` (DrawNoiseExtras'), x_t is that of noise + perturbation, the sum in fp32.
  // x_t may be noise or x0.
  void QSample(float* x_t, const float* x0, const float* noise, const int64_t* t, int B, size_t n,
               const float* perturbation = nullptr) const;
  // The regression target of each of B samples of n values: the noise for ε-prediction, v for
  // v-prediction (coefficients rounded to fp32, as QSample's).
  void Target(float* target, const float* x0, const float* noise, const int64_t* t, int B,
              size_t n) const;
  bool predicts_noise() const { return config_.prediction == "epsilon"; }
  // Whether DrawNoiseExtras has anything to draw; whether it writes a perturbation.
  bool has_noise_extras() const { return config_.noise_offset > 0 || perturbs_input(); }
  bool perturbs_input() const { return config_.input_perturbation > 0; }
  // One sample's offset noise and input perturbation, drawn from `rng` after its noise
  // (`frames` frames of `channels` planes of `plane` values): noise_offset · o_c added to every
  // value of channel c's planes (o_c drawn for c = 0 … C−1), then, with input_perturbation,
  // perturbation[i] = input_perturbation · z_i (z drawn in order; `perturbation` may be null
  // otherwise). Products and sums in fp32, as diffusers' train_text_to_image.py adds them.
  void DrawNoiseExtras(Rng& rng, int frames, int channels, size_t plane, float* noise,
                       float* perturbation) const;
  double frame_noise_correlation() const { return config_.frame_noise_correlation; }

 private:
  // out = √ᾱ_t · first + sign · √(1 − ᾱ_t) · (second + third) per sample (third optional),
  // the coefficients rounded to fp32.
  void Mix(float* out, const float* first, const float* second, const int64_t* t, int B, size_t n,
           float sign, const float* third = nullptr) const;

  DiffusionConfig config_;
  std::vector<double> betas_, alphas_cumprod_;
};

// The ε-prediction loss: mean over every element of the first C channels of the output
// ([B, out_channels, HW]) of w_b · (output − noise)², with w_b = weights[b] (1 when weights
// is null); the variance channels (learn_sigma) get no gradient from it. Writes
// dout = grad_scale · ∂loss/∂output (zero in the variance channels) and returns the loss.
// One sample's noise, `frames` frames of `frame` values from `rng`: N(0, 1) values whose
// frames correlate by `rho` at each position, √ρ · shared + √(1 − ρ) · own with one shared
// frame drawn first (the "mixed" noise prior of Ge et al., "Preserve Your Own Correlation",
// which keeps a video's frames alike). With ρ = 0 the values are drawn one after another.
// For float (training's noise) and double (a sampler's).
template <typename T>
void DrawFrameNoise(Rng& rng, double rho, int frames, size_t frame, T* out);

double EpsilonMseLoss(const float* output, const float* noise, int B, int C, int out_channels,
                      int HW, float grad_scale, float* dout, const double* weights = nullptr);

}  // namespace difftrain
