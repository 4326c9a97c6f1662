// The samplers' shared parts: the noise streams of a sample, and the model as a sampler's step
// sees it (sampler.cc and multistep_samplers.cc): called at one
// timestep on N samples, through classifier-free guidance where it applies (the model then
// sees [x; x] with labels [y; null]), and read per element.
//
// Guidance rescale (Lin et al., "Common Diffusion Noise Schedules and Sample Steps are
// Flawed", §3.4; diffusers' guidance_rescale φ): a guided output g of sample b is scaled by
// φ · std(cond_b)/std(g_b) + 1 − φ, the standard deviations (unbiased) over the sample's ε
// (or v) channels, as StableDiffusionPipeline's rescale_noise_cfg.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/diffusion/sampler.h"
#include "model/tensor/rng.h"

namespace difftrain {

// The Rng counters (RngStream::kSample) of sample n: one stream for x_T, one for the noise of
// its steps.
inline uint64_t InitialNoiseCounter(int64_t n) {
  return 2 * static_cast<uint64_t>(n);
}
inline uint64_t StepNoiseCounter(int64_t n) {
  return 2 * static_cast<uint64_t>(n) + 1;
}
// The step noise streams of samples first_index … first_index + N − 1.
std::vector<Rng> StepNoiseStreams(uint64_t seed, int64_t first_index, int N);

// A noise level as add_noise makes it: x = signal·x0 + noise·z.
struct NoiseLevel {
  double signal = 1, noise = 0;
};
// At ᾱ (DDPM, DDIM, PNDM, LCM, TCD: at a timestep).
inline NoiseLevel AtAlphaCumprod(double alpha_cumprod) {
  return {std::sqrt(alpha_cumprod), std::sqrt(1 - alpha_cumprod)};
}
// At σ, in the VP scale of DPM-Solver, DEIS and UniPC: α = 1/√(σ² + 1), σ·α.
inline NoiseLevel AtSigma(double sigma) {
  const double alpha = 1 / std::sqrt(sigma * sigma + 1);
  return {alpha, sigma * alpha};
}
// At σ in Euler's scale (Euler, Heun, LMS, KDPM2, DPM-Solver SDE): x0 + σ·z.
inline NoiseLevel AtEulerSigma(double sigma) {
  return {1, sigma};
}

// A sampler's side of KeptImage (sampler.h): Keep before each model call (the first does
// nothing: the samples start from their x_T or their noised image) and Finish after the last
// step. Without an image, nothing.
class ImageKeeper {
 public:
  ImageKeeper(const KeptImage* keep, const DenoiserShape& shape, int N);

  // Whether x was blended (a loop with a second copy of x blends that too).
  template <typename T>
  bool Keep(T* x, NoiseLevel level) {
    const bool blend = keep_ && started_;
    started_ = true;
    if (blend) Blend(x, level);
    return blend;
  }
  template <typename T>
  void Finish(T* x) {
    if (keep_) Blend(x, NoiseLevel{1, 0});
  }
  // x outside the mask := the image at `level`.
  template <typename T>
  void Blend(T* x, NoiseLevel level) const {
    for (int b = 0; b < N_; ++b) {
      for (size_t j = 0; j < n_; ++j) {
        const size_t e = b * n_ + j;
        if (keep_->mask[b * plane_ + j % plane_] < 0.5f) {
          x[e] = static_cast<T>(level.signal * keep_->x0[e] + level.noise * keep_->noise[e]);
        }
      }
    }
  }

 private:
  const KeptImage* keep_;
  const int N_;
  const size_t plane_, n_;
  bool started_ = false;
};

class GuidedModel {
 public:
  GuidedModel(const Denoiser& model, const DenoiserShape& shape, const SamplerOptions& options,
              const int32_t* y, int N);

  // Calls the model at `timestep` on x [N, n].
  void Run(const float* x, float timestep);

  // Sample b's ε (or v) for its element j, guided: guidance is linear, so it combines v's as
  // it combines ε's.
  double Output(int b, size_t j) const {
    const size_t e = OutputIndex(j);
    const double cond = out_[b * out_n_ + e];
    if (!guided_) return cond;
    const double uncond = out_[(N_ + b) * out_n_ + e];
    return (uncond + options_.cfg_scale * (cond - uncond)) * rescale_[b];
  }
  // The conditional model's variance output v for sample b's element j (learn_sigma).
  double Variance(int b, size_t j) const { return out_[b * out_n_ + OutputIndex(j) + frame_]; }

 private:
  // One frame's model output: ε, then (learn_sigma) v; a sample's frames one after another.
  size_t OutputIndex(size_t j) const { return (j / frame_) * out_frame_ + j % frame_; }

  const Denoiser& model_;
  const SamplerOptions& options_;
  const int N_;
  const size_t frame_, n_, out_frame_, out_n_;
  const bool any_guidance_;
  bool guided_ = false;
  std::vector<float> doubled_, t_, out_;
  std::vector<int32_t> labels_;
  std::vector<double> rescale_;  // each sample's guidance rescale factor; 1 without
};

}  // namespace difftrain
