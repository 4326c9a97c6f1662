#include "model/diffusion/sampler.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "common/check.h"
#include "model/diffusion/guided_model.h"
#include "model/tensor/rng.h"

namespace difftrain {
Result<bool> ReadDiffusersClipping(SamplerKind kind, const nlohmann::json& config,
                                   SamplerOptions& options) {
  const bool clips =
      kind == SamplerKind::kDdpm || kind == SamplerKind::kDdim || kind == SamplerKind::kLcm;
  const bool class_default = kind != SamplerKind::kLcm;
  options.clip_as_diffusers = true;
  options.clip_denoised = false;
  options.clip_range = 1.0;
  if (!clips) return false;
  if (!config.is_object()) return Errorf("the scheduler config is not a JSON object");
  bool defaulted = false;
  if (config.contains("clip_sample")) {
    if (!config["clip_sample"].is_boolean())
      return Status::Error("clip_sample must be true or false");
    options.clip_denoised = config["clip_sample"].get<bool>();
  } else {
    options.clip_denoised = class_default;
    defaulted = class_default;
  }
  if (config.contains("clip_sample_range")) {
    if (!config["clip_sample_range"].is_number())
      return Status::Error("clip_sample_range must be a number");
    options.clip_range = config["clip_sample_range"].get<double>();
    if (options.clip_denoised && !(options.clip_range > 0 && std::isfinite(options.clip_range)))
      return Errorf("clip_sample_range must be positive, got {}", options.clip_range);
  }
  return defaulted;
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
  if (options.kind != SamplerKind::kDdim && options.kind != SamplerKind::kTcd && options.eta != 0) {
    return Status::Error("eta is a DDIM and TCD (gamma) parameter; the other samplers have none");
  }
  const SamplerKind kind = options.kind;
  const bool multistep = DefaultSpacing(kind) != "respace";
  const std::string name = SamplerName(kind);
  const std::string scheduler = SchedulerClassOf(kind);
  if (options.spacing.karras && !TakesKarrasSigmas(kind)) {
    return Errorf(
        "Karras sigmas are for the {} samplers, as diffusers' use_karras_sigmas; {} has none",
        KarrasSamplerNames(), scheduler);
  }
  if (!(options.guidance_rescale >= 0 && options.guidance_rescale <= 1)) {
    return Errorf("the guidance rescale must be in [0, 1], got {}", options.guidance_rescale);
  }
  if (multistep && !options.spacing.diffusers()) {
    return Errorf(
        "{} follows diffusers' {}: it needs one of its timestep spacings (leading, trailing or "
        "linspace), not DiT's respacing",
        name, scheduler);
  }
  // LCMScheduler clips as DDIM's does (clip_sample); diffusers' other schedulers do not.
  if (multistep && kind != SamplerKind::kLcm && options.clip_denoised) {
    return Errorf("{} does not clip its x0 predictions: sample with clip_denoised false", name);
  }
  if (options.clip_denoised && !(options.clip_range > 0 && std::isfinite(options.clip_range))) {
    return Errorf("the clip range must be positive and finite, got {}", options.clip_range);
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
  // Image to image: the steps from `begin` on run (get_timesteps' t_start).
  int begin = 0;
  if (options.strength) {
    const double strength = *options.strength;
    if (!(strength > 0 && strength <= 1))
      return Errorf("the strength must be in (0, 1], got {}", strength);
    const int kept = std::min(static_cast<int>(options.steps * strength), options.steps);
    if (kept < 1) {
      return Errorf(
          "strength {} runs ⌊{} × {}⌋ = 0 of the {} steps: raise the strength or the steps",
          strength, options.steps, strength, options.steps);
    }
    begin = options.steps - kept;
  }
  if (options.lcm.strength != 1 && !(kind == SamplerKind::kLcm && options.strength)) {
    return Status::Error(
        "the strength of LCM's schedule is for LCM sampling from an image (as "
        "LatentConsistencyModelImg2ImgPipeline)");
  }
  // DDPM and DDIM step from ᾱ = 0 (zero terminal SNR) as they are; the others divide by ᾱ_t
  // (PNDM) or step in σ = √((1 − ᾱ)/ᾱ), and take 2^−24 in its place, as diffusers' Euler and
  // DPM-Solver schedulers do with rescale_betas_zero_snr.
  std::vector<double> abar = diffusion.alphas_cumprod();
  if (abar.back() == 0) abar.back() = std::ldexp(1.0, -24);
  std::vector<SamplingStep> diffusers_steps;
  std::vector<PlmsCall> plms_calls;
  if (kind == SamplerKind::kDpmSolverSinglestep && options.dpm.sde) {
    return Status::Error(
        "DPM-Solver singlestep has no SDE (sde-dpmsolver++ is the multistep solver's)");
  }
  // The samplers that keep timesteps of their own do not step on these.
  if (options.spacing.diffusers() && !KeepsItsOwnTimesteps(kind)) {
    DT_ASSIGN_OR_RETURN(diffusers_steps,
                        DiffusersSteps(diffusion.alphas_cumprod(), options.steps, options.spacing,
                                       options.kind == SamplerKind::kDdim));
  }
  if (options.kind == SamplerKind::kPndm) {
    DT_ASSIGN_OR_RETURN(plms_calls, PlmsCalls(abar, options.steps, options.spacing, begin));
  }
  if (kind == SamplerKind::kLcm) {
    // Its x0 of ε divides by √ᾱ_t: at ᾱ = 0 (zero terminal SNR) a v-prediction model only, as
    // DDIM steps from there.
    DT_ASSIGN_OR_RETURN(diffusers_steps,
                        LcmSteps(diffusion.alphas_cumprod(), options.steps, options.lcm));
  }
  std::vector<double> tcd_alpha_cumprod_s;
  if (kind == SamplerKind::kTcd) {
    DT_ASSIGN_OR_RETURN(
        std::vector<TcdStep> tcd,
        TcdSteps(diffusion.alphas_cumprod(), options.steps, options.lcm, options.eta));
    for (const TcdStep& s : tcd) {
      diffusers_steps.push_back({s.timestep, s.alpha_cumprod, s.alpha_cumprod_prev});
      tcd_alpha_cumprod_s.push_back(s.alpha_cumprod_s);
    }
  }
  Sampler sampler(diffusion, shape, options, std::move(diffusers_steps), std::move(plms_calls));
  sampler.tcd_alpha_cumprod_s_ = std::move(tcd_alpha_cumprod_s);
  DT_RETURN_IF_ERROR(sampler.BuildSolverSteps(abar, begin));
  sampler.SetStart(diffusion.alphas_cumprod(), begin);
  DT_ASSIGN_OR_RETURN(const int first, sampler.CutAtDenoisingBounds(diffusion.steps()));
  if (first != begin) DT_RETURN_IF_ERROR(sampler.BuildSolverSteps(abar, first));
  return sampler;
}

Status Sampler::BuildSolverSteps(const std::vector<double>& abar, int begin) {
  const SamplerKind kind = options_.kind;
  const SamplerOptions& options = options_;
  if (kind == SamplerKind::kEuler || kind == SamplerKind::kHeun ||
      kind == SamplerKind::kEulerAncestral || kind == SamplerKind::kLms) {
    DT_ASSIGN_OR_RETURN(euler_steps_, EulerSteps(abar, options.steps, options.spacing));
  }
  if (kind == SamplerKind::kKdpm2 || kind == SamplerKind::kKdpm2Ancestral) {
    DT_ASSIGN_OR_RETURN(euler_steps_, Kdpm2Steps(abar, options.steps, options.spacing,
                                                 kind == SamplerKind::kKdpm2Ancestral));
  }
  if (options.kind == SamplerKind::kDpmSolver) {
    DT_ASSIGN_OR_RETURN(dpm_steps_,
                        DpmSolverSteps(abar, options.steps, options.spacing, options.dpm, begin));
  }
  if (kind == SamplerKind::kDpmSolverSde) {
    DT_ASSIGN_OR_RETURN(euler_steps_, DpmSdeSteps(abar, options.steps, options.spacing));
  }
  if (kind == SamplerKind::kDpmSolverSinglestep) {
    DT_ASSIGN_OR_RETURN(
        linear_steps_,
        DpmSolverSinglestepSteps(abar, options.steps, options.spacing, options.dpm, begin));
  }
  if (kind == SamplerKind::kDeis) {
    DT_ASSIGN_OR_RETURN(linear_steps_,
                        DeisSteps(abar, options.steps, options.spacing, options.deis, begin));
  }
  if (kind == SamplerKind::kUniPc) {
    DT_ASSIGN_OR_RETURN(unipc_steps_,
                        UniPcSteps(abar, options.steps, options.spacing, options.unipc, begin));
  }
  return Status::Ok();
}

Result<int> Sampler::CutAtDenoisingBounds(int T) {
  if (!options_.denoising_end && !options_.denoising_start) return begin_;
  const SamplerKind kind = options_.kind;
  // The samplers of one model call a step, each checked against SDXL's pipelines cut so: Euler
  // (SDXL's scheduler), DDIM, and the multistep solvers DPM-Solver++, DEIS and UniPC (their
  // orders warm up again from a start, as from set_begin_index). Not the pairs of Heun and
  // KDPM2, whose cuts diffusers moves by a call, nor the stochastic samplers.
  const std::vector<SamplerKind> cut = {SamplerKind::kEuler, SamplerKind::kDdim,
                                        SamplerKind::kDpmSolver, SamplerKind::kDeis,
                                        SamplerKind::kUniPc};
  if (std::find(cut.begin(), cut.end(), kind) == cut.end()) {
    return Errorf(
        "a denoising end or start (SDXL's base and refiner as experts) is for the euler, ddim, "
        "dpmsolver, deis and unipc samplers, not {}",
        SamplerName(kind));
  }
  if (options_.strength && options_.denoising_start) {
    return Status::Error(
        "a denoising start takes its image as it is, noisy; a strength noises an image: not "
        "both");
  }
  if (options_.strength) {
    return Status::Error(
        "a denoising end is for sampling from x_T here, not from an image at a strength (the "
        "image pipelines' denoising_end is not checked against diffusers)");
  }
  // The timesteps in the order the steps run.
  std::vector<double> run;
  for (const EulerStep& step : euler_steps_)
    run.push_back(step.timestep);
  for (const DpmStep& step : dpm_steps_)
    run.push_back(step.timestep);
  for (const LinearStep& step : linear_steps_)
    run.push_back(step.timestep);
  for (const UniPcStep& step : unipc_steps_)
    run.push_back(step.timestep);
  if (kind == SamplerKind::kDdim) run.assign(timesteps_.rbegin(), timesteps_.rend());
  const auto cutoff = [&](const char* what, double f) -> Result<double> {
    if (!(f > 0 && f < 1)) return Errorf("the denoising {} must be in (0, 1), got {}", what, f);
    return std::round(T - f * T);  // diffusers' discrete_timestep_cutoff
  };
  int begin = 0, end = static_cast<int>(run.size());
  if (options_.denoising_end) {
    DT_ASSIGN_OR_RETURN(const double at, cutoff("end", *options_.denoising_end));
    end =
        static_cast<int>(std::count_if(run.begin(), run.end(), [&](double t) { return t >= at; }));
  }
  if (options_.denoising_start) {
    DT_ASSIGN_OR_RETURN(const double at, cutoff("start", *options_.denoising_start));
    begin =
        static_cast<int>(run.size()) -
        static_cast<int>(std::count_if(run.begin(), run.end(), [&](double t) { return t < at; }));
  }
  if (begin >= end) {
    return Errorf(
        "a denoising {}{}{} leaves none of the {} steps (timesteps {} … {}): change it or the "
        "steps",
        options_.denoising_start ? fmt::format("start {}", *options_.denoising_start) : "",
        options_.denoising_start && options_.denoising_end ? " and " : "",
        options_.denoising_end ? fmt::format("end {}", *options_.denoising_end) : "", run.size(),
        run.front(), run.back());
  }
  begin_ = begin;
  end_ = end;
  steps_run_ = end - begin;
  start_timestep_ = static_cast<int>(run[begin]);
  return begin;
}

void Sampler::SetStart(const std::vector<double>& alphas_cumprod, int begin) {
  // PNDM's calls are made from `begin` on already.
  begin_ = plms_calls_.empty() ? begin : 0;
  steps_run_ = options_.steps - begin;
  // The σ samplers' add_noise reads the first step's σ (Karras's too), the others ᾱ at its
  // timestep.
  std::optional<double> sigma;
  bool euler_scale = false;
  if (!plms_calls_.empty()) {
    start_timestep_ = plms_calls_.front().timestep;
  } else if (!euler_steps_.empty()) {
    sigma = euler_steps_[begin].sigma;
    euler_scale = true;
    start_timestep_ = static_cast<int>(std::lround(euler_steps_[begin].timestep));
  } else if (!dpm_steps_.empty()) {
    sigma = dpm_steps_[begin].sigma;
    start_timestep_ = dpm_steps_[begin].timestep;
  } else if (!linear_steps_.empty()) {
    sigma = linear_steps_[begin].sigma;
    start_timestep_ = linear_steps_[begin].timestep;
  } else if (!unipc_steps_.empty()) {
    sigma = unipc_steps_[begin].sigma;
    start_timestep_ = unipc_steps_[begin].timestep;
  } else {
    start_timestep_ = timesteps_[timesteps_.size() - 1 - begin];
  }
  const NoiseLevel start = !sigma        ? AtAlphaCumprod(alphas_cumprod[start_timestep_])
                           : euler_scale ? AtEulerSigma(*sigma)
                                         : AtSigma(*sigma);
  start_signal_ = start.signal;
  start_noise_ = start.noise;
}

double Sampler::InitialScale() const {
  return options_.strength || options_.denoising_start
             ? 1.0
             : EulerInitialSigma(euler_steps_, options_.spacing);
}

void Sampler::AddNoise(const float* x0, const float* noise, size_t count, float* out) const {
  DT_CHECK(options_.strength.has_value(), "AddNoise is for sampling from an image (a strength)");
  for (size_t e = 0; e < count; ++e)
    out[e] = static_cast<float>(start_signal_ * x0[e] + start_noise_ * noise[e]);
}

void Sampler::SampleFrom(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                         const float* x0, float* out, const KeptImage* keep) const {
  const size_t count =
      size_t(N) * shape_.frames * shape_.channels * size_t(shape_.height) * shape_.width;
  DrawInitialNoise(N, first_index, out);  // the noise, in place: AddNoise reads it elementwise
  std::vector<float> noise;
  KeptImage kept;
  if (keep) keep = WithNoise(*keep, out, count, noise, kept);
  AddNoise(x0, out, count, out);
  Denoise(model, y, N, first_index, out, keep);
}

const KeptImage* Sampler::WithNoise(const KeptImage& keep, const float* drawn, size_t count,
                                    std::vector<float>& noise, KeptImage& kept) const {
  DT_CHECK(shape_.frames == 1, "inpainting is for images");
  kept = keep;
  if (!kept.noise) {
    noise.assign(drawn, drawn + count);
    kept.noise = noise.data();
  }
  return &kept;
}

void Sampler::DrawInitialNoise(int N, int64_t first_index, float* out) const {
  const size_t n =
      static_cast<size_t>(shape_.frames) * shape_.channels * shape_.height * shape_.width;
  for (int b = 0; b < N; ++b) {
    Rng rng(options_.seed, RngStream::kSample, InitialNoiseCounter(first_index + b));
    DrawFrameNoise(rng, noise_correlation_, shape_.frames, n / shape_.frames, out + b * n);
  }
}

Denoiser PromptDenoiser(TextDenoiser model, std::vector<float> prompts, size_t text_floats,
                        std::vector<float> null_text) {
  const size_t text = text_floats;
  DT_CHECK(text > 0 && !prompts.empty() && prompts.size() % text == 0,
           "{} prompt floats for texts of {}", prompts.size(), text);
  DT_CHECK(null_text.empty() || null_text.size() == text,
           "{} floats of the null text for texts of {}", null_text.size(), text);
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
                     float* out, const KeptImage* keep) const {
  DT_CHECK(!options_.strength, "a sampler of a strength samples from images (SampleFrom)");
  DrawInitialNoise(N, first_index, out);
  std::vector<float> noise;
  KeptImage kept;
  if (keep) {
    const size_t count = size_t(N) * shape_.channels * size_t(shape_.height) * shape_.width;
    keep = WithNoise(*keep, out, count, noise, kept);
  }
  Denoise(model, y, N, first_index, out, keep);
}

void Sampler::Denoise(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* x,
                      const KeptImage* keep) const {
  ImageKeeper keeper(keep, shape_, N);
  // The samplers of diffusers' other schedulers, each on the steps Create made for it.
  if (!plms_calls_.empty()) return DenoisePlms(model, y, N, x, keeper);
  if (options_.kind == SamplerKind::kDpmSolverSde)
    return DenoiseDpmSde(model, y, N, first_index, x, keeper);
  if (!euler_steps_.empty()) return DenoiseEuler(model, y, N, first_index, x, keeper);
  if (!dpm_steps_.empty()) return DenoiseDpm(model, y, N, first_index, x, keeper);
  if (!linear_steps_.empty()) return DenoiseLinear(model, y, N, x, keeper);
  if (!unipc_steps_.empty()) return DenoiseUniPc(model, y, N, x, keeper);
  const size_t frame = size_t(shape_.channels) * shape_.height * shape_.width;
  const size_t n = shape_.frames * frame;
  GuidedModel guided(model, shape_, options_, y, N);
  const bool lcm = options_.kind == SamplerKind::kLcm, tcd = options_.kind == SamplerKind::kTcd;
  const double clip = options_.clip_range;
  // DDIM steps along the model's own ε where diffusers clips (unclipped, it is the x0's).
  const bool ddim_own_eps = options_.clip_denoised && options_.clip_as_diffusers;
  // Each sample's noise of a stochastic step (DDPM, LCM, or DDIM and TCD with η > 0), frames
  // correlated as in training.
  const bool stochastic = options_.kind == SamplerKind::kDdpm || lcm || options_.eta > 0;
  std::vector<double> step_noise(stochastic ? N * n : 0);
  std::vector<Rng> rngs = StepNoiseStreams(options_.seed, first_index, N);

  const int last = static_cast<int>(steps_.size() - RunEnd(steps_.size()));  // in run order
  for (int i = static_cast<int>(steps_.size()) - 1 - begin_; i >= last; --i) {
    const StepCoefficients& c = steps_[i];
    keeper.Keep(x, AtAlphaCumprod(c.alpha_cumprod));
    guided.Run(x, static_cast<float>(timesteps_[i]));
    // DDIM's noise scale σ_i (0 with η = 0) and the ᾱ of the step it goes to.
    const double abar = c.alpha_cumprod, abar_prev = c.alpha_cumprod_prev;
    const double sqrt_abar = std::sqrt(abar), sqrt_one_minus_abar = std::sqrt(1 - abar);
    const double sigma = tcd ? 0
                             : options_.eta * std::sqrt((1 - abar_prev) / (1 - abar)) *
                                   std::sqrt(1 - abar / abar_prev);
    const double direction = std::sqrt(std::max(0.0, 1 - abar_prev - sigma * sigma));
    // DDPM adds noise at every step from a timestep above 0, DDIM wherever σ > 0 (both none
    // into x_0 when respaced: its last step is at timestep 0 and goes to ᾱ = 1), LCM at every
    // step but the last, TCD likewise with γ > 0.
    const bool noisy = options_.kind == SamplerKind::kDdpm ? timesteps_[i] > 0
                       : lcm                               ? i > 0
                       : tcd                               ? i > 0 && options_.eta > 0
                                                           : sigma > 0;
    const double abar_s = tcd ? tcd_alpha_cumprod_s_[i] : 0;  // TCD's intermediate ᾱ
    // LCM's boundary condition at t (unused by the others).
    const double c_out = lcm ? options_.lcm.OutCoefficient(timesteps_[i]) : 1;
    const double c_skip = lcm ? options_.lcm.SkipCoefficient(timesteps_[i]) : 0;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < N; ++b) {
      float* xb = x + b * n;
      double* z = step_noise.data() + b * n;
      if (noisy) DrawFrameNoise(rngs[b], noise_correlation_, shape_.frames, frame, z);
      for (size_t j = 0; j < n; ++j) {
        const double out = guided.Output(b, j);
        // x0 of v = √ᾱ·ε − √(1 − ᾱ)·x0 holds at ᾱ = 0 too (zero terminal SNR), x0 of ε does not.
        double x0 =
            v_prediction_ ? sqrt_abar * xb[j] - sqrt_one_minus_abar * out : c.PredictX0(xb[j], out);
        if (options_.clip_denoised) x0 = std::clamp(x0, -clip, clip);
        // The model's own ε (of v: the ε it implies).
        const auto own_eps = [&] {
          return v_prediction_ ? sqrt_abar * out + sqrt_one_minus_abar * xb[j] : out;
        };
        double next;
        if (lcm) {
          // The consistency model's x0, noised afresh to ᾱ' (the last step's ᾱ' is 1).
          const double denoised = c_out * x0 + c_skip * xb[j];
          next = std::sqrt(abar_prev) * denoised;
          if (noisy) next += std::sqrt(1 - abar_prev) * z[j];
        } else if (tcd) {
          // x0 and the model's ε to ᾱ_s, then noised back up to ᾱ'.
          next = std::sqrt(abar_s) * x0 + std::sqrt(1 - abar_s) * own_eps();
          if (noisy) {
            next = std::sqrt(abar_prev / abar_s) * next + std::sqrt(1 - abar_prev / abar_s) * z[j];
          }
        } else if (options_.kind == SamplerKind::kDdpm) {
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
          // DDIM: x_prev = √ᾱ' x0 + √(1 − ᾱ' − σ²) ε, ε the one the (clipped) x0 implies, or
          // the model's own where diffusers clips.
          const double step_eps = ddim_own_eps ? own_eps() : c.PredictEps(xb[j], x0);
          next = std::sqrt(abar_prev) * x0 + direction * step_eps;
          if (noisy) next += sigma * z[j];
        }
        xb[j] = static_cast<float>(next);
      }
    }
  }
  keeper.Finish(x);
  if (options_.clip_denoised && !options_.clip_as_diffusers) {
    const float bound = static_cast<float>(options_.clip_range);
    for (size_t j = 0; j < N * n; ++j)
      x[j] = std::clamp(x[j], -bound, bound);
  }
}

}  // namespace difftrain
