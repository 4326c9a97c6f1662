// Stable Diffusion UNet hyper-parameters under diffusers' UNet2DConditionModel config keys:
// the named configs SD1.5, SD2-base and SD2-v (SD 2's 768 px v-prediction UNet) and custom
// shapes, with parameter and multiply-accumulate accounting (../shared facts: MODELS.md).
//
// The config JSON (checkpoints, debug dumps) holds diffusers' keys, so that
// UNet2DConditionModel(**config) builds the same model, plus difftrain's own: `name`, and the
// text conditioning the model trains on (`text_length` tokens per caption, `text_dropout`, the
// probability that a caption's embedding becomes the unconditional one, all zeros).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

inline constexpr const char* kCrossAttnDown = "CrossAttnDownBlock2D";
inline constexpr const char* kDown = "DownBlock2D";
inline constexpr const char* kCrossAttnUp = "CrossAttnUpBlock2D";
inline constexpr const char* kUp = "UpBlock2D";

struct UNetConfig {
  std::string name = "unet";
  int sample_size = 64;  // latent height (and width, unless sample_width is set)
  // A non-square latent's width: diffusers' sample_size [height, width]; 0: square.
  int sample_width = 0;
  int in_channels = 4;
  int out_channels = 4;
  std::vector<int> block_out_channels = {320, 640, 1280, 1280};
  std::vector<std::string> down_block_types = {kCrossAttnDown, kCrossAttnDown, kCrossAttnDown,
                                               kDown};
  std::vector<std::string> up_block_types = {kUp, kCrossAttnUp, kCrossAttnUp, kCrossAttnUp};
  int layers_per_block = 2;
  // diffusers' attention_head_dim is the number of heads (per down block when a list).
  std::vector<int> attention_head_dim = {8};
  int cross_attention_dim = 768;
  int norm_num_groups = 32;
  bool use_linear_projection = false;
  bool upcast_attention = false;  // fp16 only: no effect in fp32
  int text_length = 77;
  double text_dropout = 0.1;
  // A guidance-distilled model's (LCM's) guidance-scale embedding width: time_embedding's
  // cond_proj, Linear(time_cond_proj_dim → block_out_channels[0], no bias), adds the embedding's
  // projection to the timestep features (diffusers' timestep_cond); 0: none (null in JSON).
  int time_cond_proj_dim = 0;
  // BasicTransformerBlocks per transformer of each down level (diffusers'
  // transformer_layers_per_block: one number or one per level); an up block's transformers have
  // the depth of the level it mirrors, the mid block's that of the last level (SDXL: 1, 2, 10).
  std::vector<int> transformer_layers_per_block = {1};
  // SDXL's micro-conditioning (diffusers' addition_embed_type "text_time"): each of the
  // time_ids() numbers (original height, width, crop top, left, target height, width) becomes
  // addition_time_embed_dim sinusoidal features, the pooled text embedding goes before them,
  // and add_embedding (Linear(projection_class_embeddings_input_dim → time_embed_dim), SiLU,
  // Linear) of the whole is added to the time embedding. 0: none (SD 1.x/2.x).
  int addition_time_embed_dim = 0;
  int projection_class_embeddings_input_dim = 0;
  // SDXL's refiner (difftrain's key, from its pipeline's model_index.json): five time ids, the
  // aesthetic score in place of the target size.
  bool requires_aesthetics_score = false;
  static constexpr int kTimeIds = 6;  // the base's
  // The aesthetic score a refiner trains with (StableDiffusionXLImg2ImgPipeline's default).
  static constexpr float kAestheticScore = 6.0f;
  int time_ids() const { return requires_aesthetics_score ? kTimeIds - 1 : kTimeIds; }

  int levels() const { return static_cast<int>(block_out_channels.size()); }
  int width() const { return sample_width > 0 ? sample_width : sample_size; }
  int time_embed_dim() const { return 4 * block_out_channels[0]; }
  // Heads of the transformers of down block i (and of the up block that mirrors it).
  int heads(int level) const {
    return attention_head_dim.size() == 1 ? attention_head_dim[0] : attention_head_dim[level];
  }
  // Transformer blocks of the transformers of down level `level` (and of its mirror up block).
  int transformer_depth(int level) const {
    return transformer_layers_per_block.size() == 1 ? transformer_layers_per_block[0]
                                                    : transformer_layers_per_block[level];
  }
  bool text_time() const { return addition_time_embed_dim > 0; }
  // The pooled text embedding's width under text_time (SDXL: 2816 − 6·256 = 1280; its refiner
  // 2560 − 5·256); 0 without.
  int pooled_text_dim() const {
    return text_time()
               ? projection_class_embeddings_input_dim - time_ids() * addition_time_embed_dim
               : 0;
  }

  Status Validate() const;
  nlohmann::json ToJson() const;
  // Refuses a key difftrain does not know by name, and a known one at a value it does not
  // implement (act_fn: gelu …).
  static Result<UNetConfig> FromJson(const nlohmann::json& j);
};

Result<UNetConfig> UNetConfigByName(const std::string& name);
std::vector<std::string> UNetConfigNames();

int64_t ParameterCount(const UNetConfig& c);

// Forward multiply-accumulates per sample, split as MODELS.md counts them: convolutions,
// linear layers (proj_in/out as 1×1 convolutions count as linear, as do the time embedding
// and the text keys and values), and attention (QKᵀ and PV).
struct UNetMacs {
  double conv = 0, linear = 0, attention = 0;
  double total() const { return conv + linear + attention; }
};
UNetMacs ForwardMacs(const UNetConfig& c);

}  // namespace difftrain
