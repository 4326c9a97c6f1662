#include "model/diffusion/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

// The Rng counters of sample n: one stream for x_T, one for the noise of its steps.
uint64_t InitialNoiseCounter(int64_t n) {
  return 2 * static_cast<uint64_t>(n);
}
uint64_t StepNoiseCounter(int64_t n) {
  return 2 * static_cast<uint64_t>(n) + 1;
}

}  // namespace

Result<SamplerKind> ParseSamplerKind(const std::string& name) {
  if (name == "ddpm") return SamplerKind::kDdpm;
  if (name == "ddim") return SamplerKind::kDdim;
  return Errorf("unknown sampler '{}' (expected ddpm or ddim)", name);
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

Result<Sampler> Sampler::Create(const GaussianDiffusion& diffusion, const DenoiserShape& shape,
                                const SamplerOptions& options) {
  DT_CHECK(shape.channels > 0 && shape.height > 0 && shape.width > 0, "bad shape {}x{}x{}",
           shape.channels, shape.height, shape.width);
  if (options.steps < 1 || options.steps > diffusion.steps()) {
    return Errorf("sampling steps must be between 1 and the diffusion's {} steps, got {}",
                  diffusion.steps(), options.steps);
  }
  if (!(options.eta >= 0 && options.eta <= 1)) {
    return Errorf("eta must be in [0, 1], got {}", options.eta);
  }
  if (options.kind == SamplerKind::kDdpm && options.eta != 0) {
    return Status::Error("eta is a DDIM parameter; DDPM has none");
  }
  if (!(options.cfg_scale >= 0 && std::isfinite(options.cfg_scale))) {
    return Errorf("the guidance scale must be finite and non-negative, got {}", options.cfg_scale);
  }
  if (options.cfg_scale != 1 && shape.null_class < 0) {
    return Errorf(
        "guidance scale {} needs an unconditional model, and this one has no null class "
        "(it was trained without label dropout); use scale 1",
        options.cfg_scale);
  }
  if (options.cfg_from < 0 || options.cfg_from > options.cfg_to) {
    return Errorf("the guidance interval [{}, {}] must be a non-empty range of timesteps from 0",
                  options.cfg_from, options.cfg_to);
  }
  return Sampler(diffusion, shape, options);
}

Denoiser PromptDenoiser(TextDenoiser model, std::vector<float> prompts, int length, int dim,
                        std::vector<float> null_text) {
  const size_t text = size_t(length) * dim;
  DT_CHECK(text > 0 && !prompts.empty() && prompts.size() % text == 0,
           "{} prompt floats for texts of {}x{}", prompts.size(), length, dim);
  DT_CHECK(null_text.empty() || null_text.size() == text,
           "{} floats of the null text for texts of {}x{}", null_text.size(), length, dim);
  const auto P = static_cast<int32_t>(prompts.size() / text);
  // The null text after the prompts: label P.
  if (null_text.empty()) null_text.assign(text, 0.0f);
  prompts.insert(prompts.end(), null_text.begin(), null_text.end());
  return [model = std::move(model), prompts = std::move(prompts), text, P](
             const float* x_t, const float* t, const int32_t* y, int B, float* out) {
    std::vector<float> context(B * text);
    for (int b = 0; b < B; ++b) {
      DT_CHECK(y[b] >= 0 && y[b] <= P, "prompt {} of {} (the null class is {})", y[b], P, P);
      std::copy_n(prompts.data() + y[b] * text, text, context.data() + b * text);
    }
    model(x_t, t, context.data(), B, out);
  };
}

Sampler::Sampler(const GaussianDiffusion& diffusion, const DenoiserShape& shape,
                 const SamplerOptions& options)
    : shape_(shape),
      options_(options),
      v_prediction_(!diffusion.predicts_noise()),
      noise_correlation_(diffusion.frame_noise_correlation()),
      timesteps_(SpaceTimesteps(diffusion.steps(), options.steps)) {
  // The respaced process (respace.py's SpacedDiffusion): its steps are the kept ᾱ's, and its
  // ᾱ's are recomputed from its β's as a cumulative product, as DiT does.
  const std::vector<double>& base = diffusion.alphas_cumprod();
  std::vector<double> alphas_cumprod;
  double last = 1.0, cumprod = 1.0;
  for (int k : timesteps_) {
    betas_.push_back(1.0 - base[k] / last);
    last = base[k];
    cumprod *= 1.0 - betas_.back();
    alphas_cumprod.push_back(cumprod);
  }
  for (size_t i = 0; i < timesteps_.size(); ++i) {
    steps_.push_back(CoefficientsAt(betas_, alphas_cumprod, static_cast<int>(i)));
  }
}

void Sampler::Sample(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                     float* out) const {
  const size_t n =
      static_cast<size_t>(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  for (int b = 0; b < N; ++b) {
    Rng rng(options_.seed, RngStream::kSample, InitialNoiseCounter(first_index + b));
    DrawFrameNoise(rng, noise_correlation_, shape_.frames, n / shape_.frames, out + b * n);
  }
  Denoise(model, y, N, first_index, out);
}

void Sampler::Denoise(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                      float* x) const {
  const int C = shape_.channels;
  const size_t HW = static_cast<size_t>(shape_.height) * shape_.width;
  const size_t frame = C * HW, n = shape_.frames * frame;
  // One frame's model output: ε, then (learn_sigma) v; a sample's frames one after another.
  const size_t out_frame = (shape_.learn_sigma ? 2 : 1) * frame, out_n = shape_.frames * out_frame;
  const bool any_guidance = options_.cfg_scale != 1;
  const double g = options_.cfg_scale;

  // At a guided step the model sees [x; x] with labels [y; null].
  const int max_batch = any_guidance ? 2 * N : N;
  std::vector<float> doubled(any_guidance ? max_batch * n : 0), t(max_batch),
      out(max_batch * out_n);
  std::vector<int32_t> labels(y, y + N);
  if (any_guidance) labels.resize(max_batch, shape_.null_class);
  // Each sample's noise of a stochastic step (DDPM, or DDIM with η > 0), frames correlated as
  // in training.
  const bool stochastic = options_.kind == SamplerKind::kDdpm || options_.eta > 0;
  std::vector<double> step_noise(stochastic ? N * n : 0);
  std::vector<Rng> rngs;
  for (int b = 0; b < N; ++b)
    rngs.emplace_back(options_.seed, RngStream::kSample, StepNoiseCounter(first_index + b));

  for (int i = static_cast<int>(steps_.size()) - 1; i >= 0; --i) {
    const StepCoefficients& c = steps_[i];
    const bool guided =
        any_guidance && timesteps_[i] >= options_.cfg_from && timesteps_[i] <= options_.cfg_to;
    const int batch = guided ? 2 * N : N;
    std::fill(t.begin(), t.end(), static_cast<float>(timesteps_[i]));
    if (guided) {
      std::copy(x, x + N * n, doubled.begin());
      std::copy(x, x + N * n, doubled.begin() + N * n);
    }
    model(guided ? doubled.data() : x, t.data(), labels.data(), batch, out.data());

    // DDIM's noise scale σ_i (0 with η = 0) and the ᾱ of the step it goes to.
    const double abar = c.alpha_cumprod, abar_prev = c.alpha_cumprod_prev;
    const double sigma =
        options_.eta * std::sqrt((1 - abar_prev) / (1 - abar)) * std::sqrt(1 - abar / abar_prev);
    const double direction = std::sqrt(std::max(0.0, 1 - abar_prev - sigma * sigma));
#pragma omp parallel for schedule(static)
    for (int b = 0; b < N; ++b) {
      float* xb = x + b * n;
      const float* cond = out.data() + b * out_n;
      const float* uncond = out.data() + (N + b) * out_n;
      double* z = step_noise.data() + b * n;
      if (i > 0 && (options_.kind == SamplerKind::kDdpm || sigma > 0))
        DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, z);
      for (size_t j = 0; j < n; ++j) {
        const size_t e = (j / frame) * out_frame + j % frame;  // ε of element j
        // Guidance is linear, so it combines v's as it combines ε's.
        const double guided_out = guided
                                      ? uncond[e] + g * (static_cast<double>(cond[e]) - uncond[e])
                                      : static_cast<double>(cond[e]);
        const double eps = v_prediction_ ? std::sqrt(abar) * guided_out +
                                               std::sqrt(1 - abar) * static_cast<double>(xb[j])
                                         : guided_out;
        double x0 = c.PredictX0(xb[j], eps);
        if (options_.clip_denoised) x0 = std::clamp(x0, -1.0, 1.0);
        double next;
        if (options_.kind == SamplerKind::kDdpm) {
          // Ancestral step: the posterior mean at the predicted x0, plus noise of the model's
          // variance (none into x_0).
          next = c.PosteriorMean(x0, xb[j]);
          if (i > 0) {
            const double log_variance = shape_.learn_sigma ? c.LearnedLogVariance(cond[e + frame])
                                                           : c.posterior_log_variance_clipped;
            next += std::exp(0.5 * log_variance) * z[j];
          }
        } else {
          // DDIM: the ε implied by the (clipped) x0, then x_prev = √ᾱ' x0 + √(1 − ᾱ' − σ²) ε.
          const double implied_eps =
              (c.sqrt_recip_alphas_cumprod * xb[j] - x0) / c.sqrt_recipm1_alphas_cumprod;
          next = std::sqrt(abar_prev) * x0 + direction * implied_eps;
          if (i > 0 && sigma > 0) next += sigma * z[j];
        }
        xb[j] = static_cast<float>(next);
      }
    }
  }
  if (options_.clip_denoised) {
    for (size_t j = 0; j < N * n; ++j)
      x[j] = std::clamp(x[j], -1.0f, 1.0f);
  }
}

}  // namespace difftrain
