// The model-choosing flags shared by subcommands (info, debug-dump, bench, plan): a named
// config of any family (--model DiT-XL/2) at an image or latent size, config fields
// overridden by name for small test models (--depth 2 --hidden 64 …), or the model section
// of a job file (--config JOB.yaml) for a custom shape of any family.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/diffusion/gaussian_diffusion.h"
#include "model/family/family.h"

namespace difftrain::launch {

class ModelOptions {
 public:
  // Adds --model, --config, --image-size, --input-size and the field overrides to `app`.
  void AddTo(CLI::App& app);
  // Whether any of those flags was given (after parsing).
  bool given() const;
  // The model the flags describe, checked by its family.
  Result<ModelSpec> Build() const;
  // The latent side when --image-size or --input-size is the only model flag given (a
  // pretrained folder's own model at another size); nullopt otherwise.
  Result<std::optional<int>> SizeOnly() const;
  // The --model name as given ("SD1.5"), or empty with --config.
  std::string requested_name() const { return config_.empty() ? model_ : std::string(); }
  // The named configs of the family of the chosen model (`info --all`).
  Result<std::vector<ModelSpec>> BuildAllNamed() const;

 private:
  Result<ModelRequest> Request() const;

  std::string model_ = "DiT-S/2";
  std::string config_;
  std::optional<int> image_size_, input_size_, patch_, in_channels_, hidden_, depth_, heads_,
      num_classes_, frames_;
  std::optional<double> mlp_ratio_, class_dropout_;
  std::optional<bool> learn_sigma_;
  std::vector<CLI::Option*> options_;
};

// --schedule, --beta-start, --beta-end, --prediction and --zero-terminal-snr, into `diffusion`
// (debug-dump, sample --pretrained); the options, to tell whether any was given.
std::vector<CLI::Option*> AddDiffusionOptions(CLI::App& app, DiffusionConfig& diffusion);

// Images are encoded by the Stable Diffusion VAE into latents 8× smaller per side.
inline constexpr int kVaeDownsample = 8;

}  // namespace difftrain::launch
