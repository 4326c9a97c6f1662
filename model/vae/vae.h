// diffusers' AutoencoderKL on the CPU, for inference: encoding images into the latents
// DiT, Latte and the UNet train on, and decoding sampled latents into images. Weights come
// from a diffusers folder (Stable Diffusion's VAE, sd-vae-ft-mse/ema, a pipeline's vae/);
// every result equals diffusers' own (tests/vae_reference_test.cc).
//
//   encoder: conv_in → per level: resnets, then (not the last) a stride-2 conv over the input
//            padded by one row and column at the bottom and right → mid block (resnet,
//            single-head attention over all pixels, resnet) → GroupNorm, SiLU, conv_out →
//            quant_conv: the posterior's mean and log-variance (clamped to [−30, 20]).
//   decoder: post_quant_conv → conv_in → mid block → per level, widest first: resnets
//            (layers_per_block + 1), then (not the last) nearest ×2 and a conv →
//            GroupNorm, SiLU, conv_out.
// Resnets and the mid block's attention normalise with eps 1e-6; every conv is 3×3, padding
// 1, but the 1×1 shortcut, quant_conv and post_quant_conv. Images are in [−1, 1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/io/safetensors.h"
#include "model/tensor/tensor_table.h"
#include "model/vae/config.h"

namespace difftrain {

// What Encode returns of the posterior N(mean, exp(logvar)).
enum class VaePosterior {
  kMode,    // its mean
  kSample,  // a draw: mean + exp(logvar / 2) · z, z from Rng(seed, kVae, image index)
};

class Vae {
 public:
  // The weights at `path`: a diffusers AutoencoderKL folder (config.json and
  // diffusion_pytorch_model.safetensors, else its .fp16 variant), a pipeline's folder holding
  // one in vae/, or the safetensors file itself with config.json beside it, or an original
  // Stable Diffusion checkpoint holding one (first_stage_model.*, its config read from its
  // tensors: model/io/ldm_checkpoint.h). The mid block's attention may use the names of
  // diffusers' older checkpoints (query, key, value, proj_attn). Errors name the file and what
  // is missing or misshapen.
  static Result<Vae> Load(const std::string& path);
  // The VAE of an original Stable Diffusion checkpoint already read (its first_stage_model).
  static Result<Vae> Load(const io::SafetensorsFile& file);
  // A model of `config` with `weights` read by name (tests; the tensors of Tensors()).
  Vae(VaeConfig config, std::vector<float> weights);

  const VaeConfig& config() const { return config_; }
  // The model's tensors under diffusers' state-dict names, laid out in one arena.
  const TensorTable& tensors() const { return table_; }
  // The file the weights came from ("" when built from memory).
  const std::string& source() const { return source_; }

  // Images [N, in_channels, H, W] → latents [N, latent_channels, H/f, W/f] × scaling_factor
  // (f = config().downscale(); H and W must be multiples of it). Image n draws its noise
  // from counter first_index + n.
  Status Encode(const float* images, int N, int H, int W, VaePosterior posterior, uint64_t seed,
                uint64_t first_index, float* latents) const;
  // The posterior itself, unscaled: mean and logvar [N, latent_channels, H/f, W/f].
  Status EncodeMoments(const float* images, int N, int H, int W, float* mean, float* logvar) const;
  // Latents [N, latent_channels, h, w] (scaled, as the models train on them) → images
  // [N, out_channels, h·f, w·f], in about [−1, 1] (not clamped).
  Status Decode(const float* latents, int N, int h, int w, float* images) const;

  // The tensors a model of `config` has, in the order the forward passes read them.
  static TensorTable Tensors(const VaeConfig& config);

 private:
  // The model `file` holds (read from `path`; `config_path`, its config.json, "" for an original
  // Stable Diffusion checkpoint's VAE).
  static Result<Vae> FromFile(const io::SafetensorsFile& file, const std::string& path,
                              const std::string& config_path);
  // `table` is Tensors(config), already made.
  Vae(TensorTable table, const VaeConfig& config, std::vector<float> weights);

  VaeConfig config_;
  TensorTable table_;
  std::vector<float> weights_;
  std::string source_;
};

}  // namespace difftrain
