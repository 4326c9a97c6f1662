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
  if (name == "pndm") return SamplerKind::kPndm;
  if (name == "euler") return SamplerKind::kEuler;
  if (name == "dpmsolver") return SamplerKind::kDpmSolver;
  return Errorf("unknown sampler '{}' (expected ddpm, ddim, pndm, euler or dpmsolver)", name);
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
  if (options.kind != SamplerKind::kDdim && options.eta != 0) {
    return Status::Error("eta is a DDIM parameter; DDPM, PNDM, Euler and DPM-Solver have none");
  }
  const bool multistep = options.kind == SamplerKind::kPndm ||
                         options.kind == SamplerKind::kEuler ||
                         options.kind == SamplerKind::kDpmSolver;
  const char* name = options.kind == SamplerKind::kPndm    ? "PNDM"
                     : options.kind == SamplerKind::kEuler ? "Euler"
                                                           : "DPM-Solver";
  const char* scheduler = options.kind == SamplerKind::kPndm    ? "PNDMScheduler"
                          : options.kind == SamplerKind::kEuler ? "EulerDiscreteScheduler"
                                                                : "DPMSolverMultistepScheduler";
  if (multistep && !options.spacing.diffusers()) {
    return Errorf(
        "{} follows diffusers' {}: it needs one of its timestep spacings (leading, trailing or "
        "linspace), not DiT's respacing",
        name, scheduler);
  }
  if (multistep && options.clip_denoised) {
    return Errorf("{} does not clip its x0 predictions: sample with clip_denoised false", name);
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
  DT_RETURN_IF_ERROR(options.spacing.Validate());
  std::vector<SamplingStep> diffusers_steps;
  std::vector<PlmsCall> plms_calls;
  // DPM-Solver keeps timesteps of its own (dpm_steps_); the others step on these.
  if (options.spacing.diffusers() && options.kind != SamplerKind::kDpmSolver) {
    DT_ASSIGN_OR_RETURN(diffusers_steps,
                        DiffusersSteps(diffusion.alphas_cumprod(), options.steps, options.spacing,
                                       options.kind == SamplerKind::kDdim));
  }
  if (options.kind == SamplerKind::kPndm) {
    DT_ASSIGN_OR_RETURN(plms_calls,
                        PlmsCalls(diffusion.alphas_cumprod(), options.steps, options.spacing));
  }
  Sampler sampler(diffusion, shape, options, std::move(diffusers_steps), std::move(plms_calls));
  if (options.kind == SamplerKind::kEuler) {
    DT_ASSIGN_OR_RETURN(sampler.euler_steps_,
                        EulerSteps(diffusion.alphas_cumprod(), options.steps, options.spacing));
  }
  if (options.kind == SamplerKind::kDpmSolver) {
    DT_ASSIGN_OR_RETURN(
        sampler.dpm_steps_,
        DpmSolverSteps(diffusion.alphas_cumprod(), options.steps, options.spacing, options.dpm));
  }
  return sampler;
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
                 const SamplerOptions& options, std::vector<SamplingStep> diffusers_steps,
                 std::vector<PlmsCall> plms_calls)
    : shape_(shape),
      options_(options),
      v_prediction_(!diffusion.predicts_noise()),
      noise_correlation_(diffusion.frame_noise_correlation()),
      plms_calls_(std::move(plms_calls)) {
  if (options.spacing.diffusers()) {
    for (const SamplingStep& step : diffusers_steps) {
      timesteps_.push_back(step.timestep);
      steps_.push_back(CoefficientsBetween(step.alpha_cumprod, step.alpha_cumprod_prev));
      betas_.push_back(steps_.back().beta);
    }
    return;
  }
  timesteps_ = SpaceTimesteps(diffusion.steps(), options.steps);
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

namespace {

// The model as a step sees it: called at one timestep on N samples, through guidance where it
// applies (the model then sees [x; x] with labels [y; null]), and read per element.
class GuidedModel {
 public:
  GuidedModel(const Denoiser& model, const DenoiserShape& shape, const SamplerOptions& options,
              const int32_t* y, int N)
      : model_(model),
        options_(options),
        N_(N),
        frame_(size_t(shape.channels) * shape.height * shape.width),
        n_(shape.frames * frame_),
        out_frame_((shape.learn_sigma ? 2 : 1) * frame_),
        out_n_(shape.frames * out_frame_),
        any_guidance_(options.cfg_scale != 1),
        doubled_(any_guidance_ ? 2 * N * n_ : 0),
        t_(any_guidance_ ? 2 * N : N),
        out_(t_.size() * out_n_),
        labels_(y, y + N) {
    if (any_guidance_) labels_.resize(2 * N, shape.null_class);
  }

  // Calls the model at `timestep` on x [N, n].
  void Run(const float* x, float timestep) {
    guided_ = any_guidance_ && timestep >= options_.cfg_from && timestep <= options_.cfg_to;
    std::fill(t_.begin(), t_.end(), timestep);
    if (guided_) {
      std::copy(x, x + N_ * n_, doubled_.begin());
      std::copy(x, x + N_ * n_, doubled_.begin() + N_ * n_);
    }
    model_(guided_ ? doubled_.data() : x, t_.data(), labels_.data(), guided_ ? 2 * N_ : N_,
           out_.data());
  }

  // Sample b's ε (or v) for its element j, guided: guidance is linear, so it combines v's as
  // it combines ε's.
  double Output(int b, size_t j) const {
    const size_t e = OutputIndex(j);
    const double cond = out_[b * out_n_ + e];
    if (!guided_) return cond;
    const double uncond = out_[(N_ + b) * out_n_ + e];
    return uncond + options_.cfg_scale * (cond - uncond);
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
};

}  // namespace

void Sampler::Denoise(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                      float* x) const {
  if (options_.kind == SamplerKind::kPndm) {
    DenoisePlms(model, y, N, x);
    return;
  }
  if (options_.kind == SamplerKind::kEuler) {
    DenoiseEuler(model, y, N, x);
    return;
  }
  if (options_.kind == SamplerKind::kDpmSolver) {
    DenoiseDpm(model, y, N, x);
    return;
  }
  const size_t frame = size_t(shape_.channels) * shape_.height * shape_.width;
  const size_t n = shape_.frames * frame;
  GuidedModel guided(model, shape_, options_, y, N);
  // Each sample's noise of a stochastic step (DDPM, or DDIM with η > 0), frames correlated as
  // in training.
  const bool stochastic = options_.kind == SamplerKind::kDdpm || options_.eta > 0;
  std::vector<double> step_noise(stochastic ? N * n : 0);
  std::vector<Rng> rngs;
  for (int b = 0; b < N; ++b)
    rngs.emplace_back(options_.seed, RngStream::kSample, StepNoiseCounter(first_index + b));

  for (int i = static_cast<int>(steps_.size()) - 1; i >= 0; --i) {
    const StepCoefficients& c = steps_[i];
    guided.Run(x, static_cast<float>(timesteps_[i]));
    // DDIM's noise scale σ_i (0 with η = 0) and the ᾱ of the step it goes to.
    const double abar = c.alpha_cumprod, abar_prev = c.alpha_cumprod_prev;
    const double sigma =
        options_.eta * std::sqrt((1 - abar_prev) / (1 - abar)) * std::sqrt(1 - abar / abar_prev);
    const double direction = std::sqrt(std::max(0.0, 1 - abar_prev - sigma * sigma));
    // DDPM adds noise at every step from a timestep above 0, DDIM wherever σ > 0 (both none
    // into x_0 when respaced: its last step is at timestep 0 and goes to ᾱ = 1).
    const bool noisy = options_.kind == SamplerKind::kDdpm ? timesteps_[i] > 0 : sigma > 0;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < N; ++b) {
      float* xb = x + b * n;
      double* z = step_noise.data() + b * n;
      if (noisy) DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, z);
      for (size_t j = 0; j < n; ++j) {
        const double out = guided.Output(b, j);
        const double eps =
            v_prediction_ ? std::sqrt(abar) * out + std::sqrt(1 - abar) * xb[j] : out;
        double x0 = c.PredictX0(xb[j], eps);
        if (options_.clip_denoised) x0 = std::clamp(x0, -1.0, 1.0);
        double next;
        if (options_.kind == SamplerKind::kDdpm) {
          // Ancestral step: the posterior mean at the predicted x0, plus noise of the model's
          // variance (none from timestep 0).
          next = c.PosteriorMean(x0, xb[j]);
          if (noisy) {
            const double log_variance = shape_.learn_sigma
                                            ? c.LearnedLogVariance(guided.Variance(b, j))
                                            : c.posterior_log_variance_clipped;
            next += std::exp(0.5 * log_variance) * z[j];
          }
        } else {
          // DDIM: the ε implied by the (clipped) x0, then x_prev = √ᾱ' x0 + √(1 − ᾱ' − σ²) ε.
          const double implied_eps =
              (c.sqrt_recip_alphas_cumprod * xb[j] - x0) / c.sqrt_recipm1_alphas_cumprod;
          next = std::sqrt(abar_prev) * x0 + direction * implied_eps;
          if (noisy) next += sigma * z[j];
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

void Sampler::DenoisePlms(const Denoiser& model, const int32_t* y, int N, float* x) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  // The model's (guided) outputs of the calls so far, the newest last, at most 4 kept; and x
  // where the first call started, which the second call's step starts from again.
  std::vector<std::vector<double>> history;
  std::vector<float> first_x(x, x + N * n);
  for (size_t k = 0; k < plms_calls_.size(); ++k) {
    const PlmsCall& call = plms_calls_[k];
    guided.Run(x, static_cast<float>(call.timestep));
    std::vector<double> out(N * n);
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j)
        out[b * n + j] = guided.Output(b, j);
    }
    if (k == 1) {
      // The second call corrects the first step: again from its x, with the mean of the two
      // outputs (a second-order step).
      for (size_t e = 0; e < out.size(); ++e)
        out[e] = (out[e] + history.back()[e]) / 2;
      std::copy(first_x.begin(), first_x.end(), x);
    } else {
      if (history.size() == 4) history.erase(history.begin());
      history.push_back(out);
      // Adams–Bashforth of the outputs so far, to fourth order.
      const auto& h = history;
      const size_t m = h.size();
      for (size_t e = 0; e < out.size(); ++e) {
        if (m == 2) {
          out[e] = (3 * h[1][e] - h[0][e]) / 2;
        } else if (m == 3) {
          out[e] = (23 * h[2][e] - 16 * h[1][e] + 5 * h[0][e]) / 12;
        } else if (m == 4) {
          out[e] = (55 * h[3][e] - 59 * h[2][e] + 37 * h[1][e] - 9 * h[0][e]) / 24;
        }
      }
    }
    // PNDM's transfer from ᾱ_t to ᾱ_prev with ε (v-prediction: ε of v at the step's x).
    const double a = call.alpha_cumprod, a_prev = call.alpha_cumprod_prev;
    const double sample_coeff = std::sqrt(a_prev / a);
    const double denominator = a * std::sqrt(1 - a_prev) + std::sqrt(a * (1 - a) * a_prev);
    for (size_t e = 0; e < out.size(); ++e) {
      const double eps = v_prediction_ ? std::sqrt(a) * out[e] + std::sqrt(1 - a) * x[e] : out[e];
      x[e] = static_cast<float>(sample_coeff * x[e] - (a_prev - a) * eps / denominator);
    }
  }
}

void Sampler::DenoiseEuler(const Denoiser& model, const int32_t* y, int N, float* x) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  const double initial = EulerInitialSigma(euler_steps_, options_.spacing);
  // x in Euler's scale, √(σ² + 1) times the model's input.
  std::vector<double> state(x, x + N * n);
  for (double& v : state)
    v *= initial;
  for (const EulerStep& step : euler_steps_) {
    const double sigma = step.sigma, scale = std::sqrt(sigma * sigma + 1);
    for (size_t e = 0; e < state.size(); ++e)
      x[e] = static_cast<float>(state[e] / scale);
    guided.Run(x, step.timestep);
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j) {
        double& v = state[b * n + j];
        const double out = guided.Output(b, j);
        const double x0 =
            v_prediction_ ? out * (-sigma / scale) + v / (scale * scale) : v - sigma * out;
        v += (v - x0) / sigma * (step.sigma_next - sigma);
      }
    }
  }
  for (size_t e = 0; e < state.size(); ++e)
    x[e] = static_cast<float>(state[e]);
}

void Sampler::DenoiseDpm(const Denoiser& model, const int32_t* y, int N, float* x) const {
  const size_t n = size_t(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  GuidedModel guided(model, shape_, options_, y, N);
  std::vector<double> state(x, x + N * n), previous(N * n);  // x, and the last step's x0
  // α = 1/√(σ² + 1), σ_t = σ·α and λ = log α − log σ_t of a step's σ.
  struct Scale {
    double alpha, sigma_t, lambda;
  };
  const auto scale = [](double sigma) {
    const double alpha = 1 / std::sqrt(sigma * sigma + 1);
    return Scale{alpha, sigma * alpha, std::log(alpha) - std::log(sigma * alpha)};
  };
  for (const DpmStep& step : dpm_steps_) {
    guided.Run(x, static_cast<float>(step.timestep));
    const Scale s = scale(step.sigma);
    const bool to_data = step.sigma_next == 0;
    const Scale t = to_data ? Scale{1, 0, 0} : scale(step.sigma_next);
    const double h = t.lambda - s.lambda, expm = std::exp(-h) - 1;
    const double r = step.order == 2 ? (s.lambda - scale(step.sigma_prev).lambda) / h : 1;
    for (int b = 0; b < N; ++b) {
      for (size_t j = 0; j < n; ++j) {
        const size_t e = b * n + j;
        const double out = guided.Output(b, j), v = state[e];
        const double m =
            v_prediction_ ? s.alpha * v - s.sigma_t * out : (v - s.sigma_t * out) / s.alpha;
        if (to_data) {
          state[e] = m;
        } else {
          double next = t.sigma_t / s.sigma_t * v - t.alpha * expm * m;
          if (step.order == 2) {
            const double d1 = (m - previous[e]) / r;
            next += options_.dpm.heun ? t.alpha * (expm / h + 1) * d1 : -0.5 * t.alpha * expm * d1;
          }
          state[e] = next;
        }
        previous[e] = m;
      }
    }
    for (size_t e = 0; e < state.size(); ++e)
      x[e] = static_cast<float>(state[e]);
  }
}

}  // namespace difftrain
