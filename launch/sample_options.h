// The flags of `difftrain sample` (launch/sample_command.cc), which the parts of sampling
// (sample_prompts.h, sample_command.cc) read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launch/model_options.h"
#include "model/diffusion/gaussian_diffusion.h"

namespace difftrain::launch {

struct SampleOptions {
  std::string checkpoint;
  std::string pretrained;  // weights to sample from, with the model (and diffusion) flags
  ModelOptions model;
  DiffusionConfig diffusion;
  bool model_given = false, diffusion_given = false;
  // Class numbers, or names a DiTPipeline's id2label gives (SampleSource::class_names).
  std::vector<std::string> classes;
  std::vector<std::string> prompts;
  std::vector<int64_t> caption_ids;
  std::string text_table;    // "": the text table of the checkpoint's training data
  std::string text_encoder;  // "": the text table's, if it names one; "none": no encoder
  std::optional<std::string> negative_prompt;  // the text guidance steers away from
  std::optional<int> skip_layers;
  int per_class = 8;
  std::optional<int> steps;
  std::optional<std::string> sampler;
  std::optional<std::string> timestep_spacing;
  std::optional<int> steps_offset;
  std::optional<bool> set_alpha_to_one;
  std::optional<bool> karras_sigmas;
  // DPM-Solver++'s (multistep, singlestep), DEIS's and UniPC's solver_order, solver_type;
  // DPM-Solver++'s and DEIS's algorithm_type.
  std::optional<int> solver_order;
  std::optional<std::string> solver_type, algorithm_type;
  // DPM-Solver++'s (multistep, singlestep) final_sigmas_type; the four's lower_order_final.
  std::optional<std::string> final_sigmas_type;
  std::optional<bool> lower_order_final;
  std::optional<int> original_inference_steps;  // LCM's distillation schedule
  std::optional<double> guidance_rescale;
  std::optional<double> eta;
  std::optional<double> cfg;
  std::vector<int> cfg_interval;  // [from, to] in timesteps; empty: every step
  uint64_t seed = 0;
  int batch = 16;
  std::string out;
  std::string out_dir;  // one PNG per sample, and metadata.jsonl of a text model's prompts
  std::string gif;
  int gif_delay_cs = 12;
  std::string raw;
  std::string weights = "ema";
  std::optional<bool> clip_denoised;
  std::string initial_noise;  // x_T of every sample; "": drawn from the seed
  // Image to image: the images sampling starts from (launch/sample_image.h), and how far up
  // the schedule they are noised (default 0.8, as diffusers').
  std::vector<std::string> images;
  std::optional<double> strength;
  // SDXL's base and refiner as an ensemble of experts (SamplerOptions::denoising_end, _start).
  std::optional<double> denoising_end, denoising_start;
  // The samples' size in pixels (diffusers' height and width): the model resized to it.
  std::optional<int> height, width;
  // SDXL's micro-conditioning (pixels): the image size the model is told the picture had, the
  // crop's top-left corner, the size it is told to make; empty: the samples' size, no crop.
  std::vector<int> original_size, crop_top_left, target_size;
  // SDXL's refiner: the aesthetic score of its time ids, and that of the unconditional text's.
  std::optional<double> aesthetic_score, negative_aesthetic_score;
  // Inpainting: the masks of the images (white: painted).
  std::vector<std::string> masks;
  std::string vae;  // a diffusers AutoencoderKL decoding a latent model's samples
  // Textual inversion embeddings loaded into the text encoder, and their tokens (none, or one
  // per file; empty: the file's tensor's name).
  std::vector<std::string> textual_inversions, inversion_tokens;
  std::vector<std::string> loras;  // LoRA files fused into the model's weights (model/io/lora.h)
  // Their scales: none (1 each), one for all, or one per LoRA in order (LoraScale).
  std::vector<double> lora_scales;

  // The scale of LoRA `i` (lora_scales checked by RunSample).
  double LoraScale(size_t i) const {
    return lora_scales.empty() ? 1.0 : lora_scales[lora_scales.size() == 1 ? 0 : i];
  }
  std::string log_level = "info";
  // Sample every checkpoint of the run directory `checkpoint` as it appears
  // (launch/sample_watch.h), giving up after watch_timeout seconds without a new one.
  bool watch = false;
  double watch_timeout = 3600;
  std::string tensorboard;  // with watch: each step's grid (out) as a TensorBoard image
};

// Declares the flags on `app` (launch/sample_options.cc); the diffusion flags' options, which
// say whether any was given.
std::vector<CLI::Option*> AddSampleOptions(CLI::App& app, SampleOptions& o);

}  // namespace difftrain::launch
