// DiT hyper-parameters: the named configs of the paper (DiT-S/B/L/XL × patch 2/4/8) and any
// custom shape for small test models, with parameter and FLOP accounting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

// The width of the sinusoidal timestep features the timestep embedder reads (DiT's
// frequency_embedding_size).
inline constexpr int kFrequencyDim = 256;

struct DiTConfig {
  std::string name = "custom";
  int input_size = 32;  // latent height = width
  int patch_size = 2;
  int in_channels = 4;
  int hidden_size = 1152;
  int depth = 28;
  int num_heads = 16;
  double mlp_ratio = 4.0;
  int num_classes = 1000;
  double class_dropout_prob = 0.1;
  bool learn_sigma = true;
  // Latte (model/latte/): the same transformer over videos of num_frames frames, its blocks
  // alternating spatial (even: within a frame) and temporal (odd: across frames, per token),
  // with a fixed temporal embedding before the first temporal block; num_classes 0 is
  // unconditional (no label embedder). DiT's own config (ToJson) never carries these.
  bool video = false;
  int num_frames = 1;

  int out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  int grid() const { return input_size / patch_size; }
  int tokens() const { return grid() * grid(); }
  int mlp_hidden() const { return static_cast<int>(hidden_size * mlp_ratio); }
  int head_dim() const { return hidden_size / num_heads; }
  int patch_features() const { return in_channels * patch_size * patch_size; }
  // DiT adds the null-class row (classifier-free guidance) only when labels can be dropped.
  bool has_null_class() const { return class_dropout_prob > 0; }
  bool has_labels() const { return num_classes > 0; }
  int label_rows() const { return has_labels() ? num_classes + (has_null_class() ? 1 : 0) : 0; }
  // Frames of a sample: 1 for an image.
  int frames() const { return video ? num_frames : 1; }
  // Whether global block i attends across frames (Latte's odd blocks).
  bool temporal_block(int i) const { return video && i % 2 == 1; }

  // Every constraint the model relies on; the message names the field and its value.
  Status Validate() const;

  // The `config` object of debug dumps and checkpoints (docs/formats.md); a video model's
  // has num_frames, and FromJson reads a config with num_frames as one.
  nlohmann::json ToJson() const;
  static Result<DiTConfig> FromJson(const nlohmann::json& j);
};

// "<prefix>-XL/2" etc. (S/B/L/XL × patch 2/4/8): the DiT paper's sizes, which Latte shares,
// at latent size `input_size`, not yet validated.
Result<DiTConfig> SizedConfigByName(const std::string& prefix, const std::string& name,
                                    int input_size);
std::vector<std::string> SizedConfigNames(const std::string& prefix);
// "DiT-XL/2" etc. with the paper's defaults, at latent size `input_size`.
Result<DiTConfig> DiTConfigByName(const std::string& name, int input_size = 32);
std::vector<std::string> DiTConfigNames();

// Trainable parameters (everything but the fixed position and temporal embeddings).
int64_t TrainableParameterCount(const DiTConfig& c);
// All parameters as PyTorch's model.parameters() counts them (includes pos_embed, and
// Latte's temp_embed).
int64_t ParameterCount(const DiTConfig& c);

// Forward multiply-accumulates per sample (a video for Latte) of every matmul: patch embed,
// timestep MLP, per block adaLN (6D²), qkv (3D²T), QKᵀ and AV (2T²D; a temporal block 2F²TD
// over its F frames), proj (D²T), MLP (2·r·D²T), final layer; T counts every frame's tokens.
double ForwardMacsPerSample(const DiTConfig& c);
// Training FLOPs per sample = 3 × forward FLOPs = 6 × forward MACs (recompute not counted).
double TrainingFlopsPerSample(const DiTConfig& c);

}  // namespace difftrain
