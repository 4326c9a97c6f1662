// The model-choosing flags shared by subcommands (info, debug-dump, bench): a named config
// (--model DiT-XL/2) at an image or latent size, with any shape field overridable for
// small test models (--depth 2 --hidden 64 ...).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "model/dit/config.h"

namespace difftrain::launch {

class ModelOptions {
 public:
  // Adds --model, --image-size, --input-size and the shape overrides to `app`.
  void AddTo(CLI::App& app);
  // The config the flags describe, validated.
  Result<DiTConfig> Build() const;

 private:
  std::string model_ = "DiT-S/2";
  std::optional<int> image_size_, input_size_, patch_, in_channels_, hidden_, depth_, heads_,
      num_classes_;
  std::optional<double> mlp_ratio_, class_dropout_;
  std::optional<bool> learn_sigma_;
};

// Images are encoded by the Stable Diffusion VAE into latents 8× smaller per side.
inline constexpr int kVaeDownsample = 8;

}  // namespace difftrain::launch
