// The image autoencoder latent diffusion trains in: diffusers' AutoencoderKL (Stable
// Diffusion's VAE; DiT's ImageNet latents come from the same sd-vae-ft-*), under its config
// keys as a diffusers folder's config.json holds them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

struct VaeConfig {
  int in_channels = 3;   // image channels
  int out_channels = 3;  // decoded image channels
  std::vector<int> block_out_channels = {64};
  int layers_per_block = 1;  // resnets per encoder level; the decoder has one more
  int latent_channels = 4;
  int norm_num_groups = 32;
  // Latents are trained on as mean · scaling_factor (0.18215 for SD's VAE).
  double scaling_factor = 0.18215;
  bool mid_block_add_attention = true;

  int levels() const { return static_cast<int>(block_out_channels.size()); }
  // Pixels per latent along each axis: one halving per level but the last.
  int downscale() const { return 1 << (levels() - 1); }

  Status Validate() const;
  // Refuses, by name, a key difftrain does not know and a known one at a value it does not
  // implement (another block type, act_fn other than silu, latents_mean …). Keys starting
  // with '_' (diffusers' _class_name, _diffusers_version) are not config.
  static Result<VaeConfig> FromJson(const nlohmann::json& j);
};

}  // namespace difftrain
