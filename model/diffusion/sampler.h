// Drawing samples from a trained diffusion model, as DiT's sample.py does: DDPM ancestral
// sampling or DDIM, over every step of the diffusion or a respaced subset of them, with
// classifier-free guidance. The model is a callback, so the samplers know nothing of DiT.
//
// Respacing (DiT's respace.py, spacing "N"): N timesteps of the T-step process are kept,
// evenly strided from 0 to T − 1; the respaced process has one step per kept timestep, its
// ᾱ being the kept ᾱ's, so β'_i = 1 − ᾱ_{k_i} / ᾱ_{k_{i−1}}. The model is called with the
// original timesteps k_i. N = T is the process itself. Or the timesteps and steps of a
// diffusers scheduler's spacing (leading, trailing, linspace: timestep_spacing.h), each step
// from ᾱ_t to its ᾱ_prev, as diffusers' DDPMScheduler and DDIMScheduler step.
//
// Guidance: with scale g ≠ 1 every model call runs the conditional and the unconditional
// model (labels = the null class) in one doubled batch and uses ε = ε_u + g · (ε_c − ε_u)
// for every ε channel (DiT guides its first 3 channels only, an artefact of its 4-channel
// latents; see docs/sampling.md); the variance channels are the conditional model's.
//
// Image to image (diffusers' StableDiffusionImg2ImgPipeline; SamplerOptions::strength): of the
// N steps the last ⌊N·strength⌋ run, from an image x0 noised to the first of them as the
// scheduler's add_noise does (AddNoise); the multistep solvers' orders warm up from there, as
// diffusers' do from set_begin_index.
//
// Inpainting with a model of the sampled channels alone (diffusers' StableDiffusionInpaintPipeline
// with a 4-channel UNet; KeptImage): before every model call but the first, x outside the mask
// becomes the image noised (with the sample's own x_T noise) to the level that call sees, as the
// scheduler's add_noise at the pipeline's next timestep; after the last step, the image itself.
//
// Randomness: sample n (its global index, whatever batch it is drawn in) takes x_T (or the
// noise added to its image) from Rng(seed, kSample, 2n) and its per-step noise from
// Rng(seed, kSample, 2n + 1), so a sample does not depend on the batch size or on the other
// samples of its batch.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/diffusion/deis.h"
#include "model/diffusion/dpm_solver.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/lcm.h"
#include "model/diffusion/sampler_kind.h"
#include "model/diffusion/timestep_spacing.h"
#include "model/diffusion/unipc.h"
#include "model/diffusion/vb_loss.h"

namespace difftrain {

class ImageKeeper;  // guided_model.h

// The model as the samplers call it: x_t [B, C, H, W] (a video model's [B, F, C, H, W]),
// timesteps t [B] (the original timesteps of the diffusion, as floats), labels y [B]; writes
// out [B, out_channels, H, W] ([B, F, out_channels, H, W]): ε in the first C channels (of
// each frame) and, with learn_sigma, the variance interpolation v in the last C.
using Denoiser =
    std::function<void(const float* x_t, const float* t, const int32_t* y, int B, float* out)>;

// A text-conditional model as the samplers call it: as Denoiser, with text embeddings
// context [B, L, D] in place of labels.
using TextDenoiser =
    std::function<void(const float* x_t, const float* t, const float* context, int B, float* out)>;

// Sampling from prompts: a text model as a Denoiser whose label k < P (the number of
// prompts) stands for prompt k's embedding, prompts[k] (`text_floats` floats each: [L, D], and
// for SDXL's UNet its pooled embedding after them), and whose label P, the null class to give
// DenoiserShape, for the unconditional embedding: `null_text` (Stable Diffusion's pretrained
// models take the empty prompt's), or where it is empty all zeros, the embedding that
// training's text dropout feeds (docs/unet.md). So guidance with text is the samplers'
// guidance with labels: ε = ε(x, ∅) + g · (ε(x, prompt) − ε(x, ∅)).
Denoiser PromptDenoiser(TextDenoiser model, std::vector<float> prompts, size_t text_floats,
                        std::vector<float> null_text = {});

// What the samplers must know of the model.
struct DenoiserShape {
  int channels = 4;
  int height = 32;
  int width = 32;
  // The output has 2 × channels channels, the last ones v (DiT's LEARNED_RANGE); otherwise
  // DDPM uses the fixed small variance, the posterior's.
  bool learn_sigma = true;
  // The label of the unconditional model (DiT: num_classes); −1 when there is none.
  int null_class = -1;
  int frames = 1;  // frames of a video sample; 1 for an image
};

struct SamplerOptions {
  SamplerKind kind = SamplerKind::kDdpm;
  int steps = 250;          // respaced steps N, 1 ≤ N ≤ T
  TimestepSpacing spacing;  // where the N steps fall (default: DiT's respacing)
  DpmSolverOptions dpm;     // DPM-Solver++'s (multistep, singlestep) order and final steps
  DeisOptions deis;         // DEIS's order and final steps
  UniPcOptions unipc;       // UniPC's order, B(h) and correctors
  LcmOptions lcm;           // LCM's distillation schedule and boundary condition
  double eta = 0.0;         // DDIM's η: 0 is deterministic given x_T, 1 is DDPM-like; TCD's γ
  double cfg_scale = 1.0;   // guidance scale g; 1 runs the conditional model alone
  // Guidance applies only at steps whose (original) timestep lies in [cfg_from, cfg_to];
  // elsewhere the conditional model runs alone (Kynkäänniemi et al. 2024, "Applying
  // guidance in a limited interval"). The default covers every step.
  int cfg_from = 0;
  int cfg_to = std::numeric_limits<int>::max();
  // φ of guidance rescale, in [0, 1]: 0 leaves the guided output as it is (guided_model.h).
  double guidance_rescale = 0;
  // Clipping every x0 prediction to [−clip_range, clip_range], as DiT's sampler does (DDIM then
  // steps along the ε the clipped x0 implies, and the final sample is clipped too) or as
  // diffusers' clip_sample does (DDPM, DDIM and LCM; DDIM steps along the model's own ε, as
  // use_clipped_model_output false, and the last step's sample stays as it comes).
  bool clip_denoised = true;
  double clip_range = 1.0;
  bool clip_as_diffusers = false;
  uint64_t seed = 0;
  // Image to image: sampling starts from an image (AddNoise) and runs the last ⌊N·strength⌋
  // of the N steps, strength in (0, 1]; nullopt: from x_T, every step. (A guidance-distilled
  // LCM's image pipeline spends its strength on the schedule instead: LcmOptions::strength,
  // with strength 1 here.)
  std::optional<double> strength;
  // SDXL's ensemble of expert denoisers, diffusers' denoising_end and denoising_start in (0, 1),
  // each with its cutoff timestep T − round(f·T): the base runs the steps at or above the
  // cutoff of its end and stops there, x still noisy; the refiner takes that x as it is
  // (Denoise, no noise added) and runs the steps below the cutoff of its start. Euler (SDXL's
  // scheduler), not with a strength.
  std::optional<double> denoising_end, denoising_start;
};

// diffusers' clip_sample and clip_sample_range as the scheduler class of `kind` takes them from a
// config (from_config): DDPMScheduler's and DDIMScheduler's clip_sample defaults to true,
// LCMScheduler's to false; the other classes do not clip. Into `options` (clip_denoised,
// clip_range, clip_as_diffusers). Returns whether clip_sample fell to a class default of true
// (the config does not say it); errors name the key.
Result<bool> ReadDiffusersClipping(SamplerKind kind, const nlohmann::json& config,
                                   SamplerOptions& options);

// The image an inpainting sampler keeps outside its mask (images only, N samples).
struct KeptImage {
  const float* x0 = nullptr;     // [N, C, H, W]: the image, as the model samples it
  const float* mask = nullptr;   // [N, H, W]: 1 where the sampler paints, 0 where x0 stays
  const float* noise = nullptr;  // [N, C, H, W]: its noise; null: the samples' x_T draws
};

class Sampler {
 public:
  // Errors (for the user to fix): steps outside [1, T], η outside [0, 1] or given to another
  // sampler than DDIM and TCD,
  // a negative guidance scale, guidance without a null class, an empty guidance interval, a
  // spacing whose timesteps leave [0, T − 1], PNDM, Euler, Heun, DPM-Solver or UniPC with
  // DiT's respacing, η or clipping, Karras σ's for DDPM, DDIM or PNDM, a guidance rescale
  // outside [0, 1], a strength outside (0, 1] or one that leaves no step, a denoising end or
  // start outside (0, 1), with another sampler or a strength, or leaving no step.
  static Result<Sampler> Create(const GaussianDiffusion& diffusion, const DenoiserShape& shape,
                                const SamplerOptions& options);

  // The original timesteps kept, increasing; the respaced step i runs at timesteps()[i]
  // (DPM-Solver's are in dpm_steps(); LCM's are here, each step going to the ᾱ of the one
  // below).
  const std::vector<int>& timesteps() const { return timesteps_; }
  // PNDM's model calls, in the order they run (empty for the others).
  const std::vector<PlmsCall>& plms_calls() const { return plms_calls_; }
  // Euler's (ancestral's), Heun's, LMS's, KDPM2's (ancestral's) and DPM-Solver SDE's steps, in
  // the order they run (empty for the others).
  const std::vector<EulerStep>& euler_steps() const { return euler_steps_; }
  // DPM-Solver++'s steps, in the order they run (empty for the others).
  const std::vector<DpmStep>& dpm_steps() const { return dpm_steps_; }
  // DPM-Solver++ singlestep's and DEIS's steps, in the order they run (empty for the others).
  const std::vector<LinearStep>& linear_steps() const { return linear_steps_; }
  // UniPC's steps, in the order they run (empty for the others).
  const std::vector<UniPcStep>& unipc_steps() const { return unipc_steps_; }
  // The β's of the respaced process, one per kept timestep (1 − ᾱ_t / ᾱ_prev of each step).
  const std::vector<double>& betas() const { return betas_; }
  // Each step's coefficients, one per kept timestep: ᾱ_t, ᾱ_prev, the posterior's.
  const std::vector<StepCoefficients>& coefficients() const { return steps_; }
  const DenoiserShape& shape() const { return shape_; }
  const SamplerOptions& options() const { return options_; }
  // The steps that run: all N, or with a strength the last ⌊N·strength⌋ (first_step() is the
  // index, in the order the steps run, of the first of them); a denoising end or start cuts
  // them at its timestep.
  int steps_run() const { return steps_run_; }
  int first_step() const { return begin_; }
  // The timestep the first step that runs sees (an image is noised to it).
  int start_timestep() const { return start_timestep_; }

  // Draws samples first_index, ..., first_index + N − 1 with labels y [N] into out
  // [N, C, H, W]. The model is called with batches of N (2N at guided steps). A model of
  // v-prediction has its (guided) output read as x0 = √ᾱ_t·x_t − √(1 − ᾱ_t)·v (DDPM, DDIM) or
  // as ε = √ᾱ_t·v + √(1 − ᾱ_t)·x_t (the others) at each step. A diffusion with zero terminal
  // SNR (ᾱ_{T−1} = 0) is sampled from ᾱ = 0 by DDPM and DDIM, by the others from 2^−24 in its
  // place, as diffusers' Euler and DPM-Solver schedulers with rescale_betas_zero_snr.
  // With `keep`, the samples are painted into its image outside its mask.
  void Sample(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* out,
              const KeptImage* keep = nullptr) const;
  // The same from a given x_T: x [N, C, H, W] holds x_T and is overwritten by the samples.
  // x_T is N(0, 1) noise, as diffusers pipelines' `latents`: Euler and Heun scale it by their
  // initial σ.
  // With a strength, x holds AddNoise's output (an image noised to the first step) instead.
  void Denoise(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* x,
               const KeptImage* keep = nullptr) const;

  // Image to image (with a strength): `count` floats of images x0 (as the model samples them:
  // scaled latents, or pixels in [−1, 1]) noised to the first step that runs, as its diffusers
  // scheduler's add_noise: out = a·x0 + s·noise with a = √ᾱ_t, s = √(1 − ᾱ_t) at the step's
  // timestep (DDPM, DDIM, PNDM, LCM, TCD), or at its σ: a = 1/√(σ² + 1), s = σ·a (DPM-Solver,
  // DEIS, UniPC) or, in Euler's scale, a = 1, s = σ (Euler, Heun, LMS, KDPM2, DPM-Solver SDE).
  void AddNoise(const float* x0, const float* noise, size_t count, float* out) const;
  // Image to image from the samples' own noise: x0 [N, C, H, W] of samples first_index, …
  // noised by AddNoise with noise from their x_T streams, then denoised into out.
  void SampleFrom(const Denoiser& model, const int32_t* y, int N, int64_t first_index,
                  const float* x0, float* out, const KeptImage* keep = nullptr) const;

 private:
  Sampler(const GaussianDiffusion& diffusion, const DenoiserShape& shape,
          const SamplerOptions& options, std::vector<SamplingStep> diffusers_steps,
          std::vector<PlmsCall> plms_calls);
  // `keep` with its noise: where it has none, `count` floats of `drawn` (the x_T draws) copied
  // into `noise`; `kept` holds the result.
  const KeptImage* WithNoise(const KeptImage& keep, const float* drawn, size_t count,
                             std::vector<float>& noise, KeptImage& kept) const;
  // x_T (or the noise an image takes) of samples first_index, … into out: their x_T streams.
  void DrawInitialNoise(int N, int64_t first_index, float* out) const;
  // What Euler's samplers scale x by: x_T by the initial σ, an image noised by AddNoise (in
  // Euler's scale already) by 1.
  double InitialScale() const;
  // begin_, steps_run_ and the start: the first step's timestep and add_noise's a and s.
  void SetStart(const std::vector<double>& alphas_cumprod, int begin);
  // The steps of a denoising start and end (SamplerOptions): begin_ and end_ at their cutoffs;
  // the first step that runs.
  Result<int> CutAtDenoisingBounds(int T);
  // The solvers' steps (Euler's, KDPM2's, DPM-Solver's, DEIS's, UniPC's), the multistep
  // solvers' orders warming up from step `begin`, as diffusers' do from set_begin_index.
  Status BuildSolverSteps(const std::vector<double>& abar, int begin);
  // Where the run of `count` steps stops: a denoising end's, else after the last.
  size_t RunEnd(size_t count) const { return end_ < 0 ? count : size_t(end_); }
  // Denoise for PNDM: the calls of plms_calls_, each from the linear multistep combination of
  // the last (up to 4) guided outputs.
  void DenoisePlms(const Denoiser& model, const int32_t* y, int N, float* x,
                   ImageKeeper& keeper) const;
  // Denoise for Euler, Euler ancestral, Heun, LMS and KDPM2 (ancestral): the steps of
  // euler_steps_ from x_T scaled by its initial σ; the ancestral samplers' noise from the
  // samples' step noise streams.
  void DenoiseEuler(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* x,
                    ImageKeeper& keeper) const;
  // Denoise for DPM-Solver SDE: the steps of euler_steps_, each two ancestral half steps on
  // Brownian noise from the samples' step noise streams.
  void DenoiseDpmSde(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* x,
                     ImageKeeper& keeper) const;
  // Denoise for DPM-Solver++: the steps of dpm_steps_; the SDE's noise from the samples' step
  // noise streams.
  void DenoiseDpm(const Denoiser& model, const int32_t* y, int N, int64_t first_index, float* x,
                  ImageKeeper& keeper) const;
  // Denoise for DPM-Solver++ singlestep and DEIS: the steps of linear_steps_, on x0's and on
  // ε's.
  void DenoiseLinear(const Denoiser& model, const int32_t* y, int N, float* x,
                     ImageKeeper& keeper) const;
  // Denoise for UniPC: the steps of unipc_steps_.
  void DenoiseUniPc(const Denoiser& model, const int32_t* y, int N, float* x,
                    ImageKeeper& keeper) const;

  DenoiserShape shape_;
  SamplerOptions options_;
  // The model predicts v = √ᾱ·ε − √(1 − ᾱ)·x0 (diffusion.prediction v), not ε.
  bool v_prediction_ = false;
  double noise_correlation_ = 0;  // between frames, as the model was trained
  std::vector<int> timesteps_;
  std::vector<double> betas_;
  std::vector<StepCoefficients> steps_;  // the respaced process's coefficients, per step
  std::vector<PlmsCall> plms_calls_;
  std::vector<EulerStep> euler_steps_;
  std::vector<DpmStep> dpm_steps_;
  std::vector<LinearStep> linear_steps_;
  std::vector<UniPcStep> unipc_steps_;
  std::vector<double> tcd_alpha_cumprod_s_;  // TCD's ᾱ_s, one per kept timestep
  // The steps that run (image to image: from begin_, in run order; with a denoising end to
  // end_, before it; −1: to the last), and AddNoise's a and s.
  int begin_ = 0, end_ = -1, steps_run_ = 0, start_timestep_ = 0;
  double start_signal_ = 0, start_noise_ = 1;
};

}  // namespace difftrain
