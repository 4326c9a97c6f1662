#include "model/unet/config.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_read.h"
#include "model/unet/plan.h"

namespace difftrain {
namespace {

using nlohmann::json;

// diffusers' UNet2DConditionModel keys difftrain reads only at the value it implements: a
// config at another value is refused by name. (Keys starting with "_", such as _class_name
// and _diffusers_version, are diffusers' bookkeeping and are ignored, as diffusers does.)
const std::map<std::string, json>& FixedKeys() {
  static const std::map<std::string, json> keys = {
      {"act_fn", "silu"},
      {"center_input_sample", false},
      {"flip_sin_to_cos", true},
      {"freq_shift", 0},
      {"downsample_padding", 1},
      {"mid_block_scale_factor", 1},
      {"mid_block_type", "UNetMidBlock2DCrossAttn"},
      {"norm_eps", 1e-5},
      {"dropout", 0},
      {"dual_cross_attention", false},
      {"only_cross_attention", false},
      {"resnet_time_scale_shift", "default"},
      {"time_embedding_type", "positional"},
      {"conv_in_kernel", 3},
      {"conv_out_kernel", 3},
      {"num_attention_heads", nullptr},
      {"num_class_embeds", nullptr},
      {"class_embed_type", nullptr},
      {"encoder_hid_dim", nullptr},
      {"class_embeddings_concat", false},
      {"cross_attention_norm", nullptr},
      {"attention_type", "default"},
      {"reverse_transformer_layers_per_block", nullptr},
      // The rest of UNet2DConditionModel's signature, as save_pretrained (0.27.2) writes it.
      {"addition_embed_type_num_heads", 64},
      {"encoder_hid_dim_type", nullptr},
      {"mid_block_only_cross_attention", nullptr},
      {"resnet_out_scale_factor", 1.0},
      {"resnet_skip_time_act", false},
      {"time_embedding_act_fn", nullptr},
      {"time_embedding_dim", nullptr},
      {"timestep_post_act", nullptr},
  };
  return keys;
}

bool SameValue(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

UNetConfig SD15() {
  UNetConfig c;
  c.name = "SD1.5";
  return c;
}

UNetConfig SD2Base() {
  UNetConfig c;
  c.name = "SD2-base";
  c.attention_head_dim = {5, 10, 20, 20};
  c.cross_attention_dim = 1024;
  c.use_linear_projection = true;
  return c;
}

// SD 2's 768 px UNet, trained with v-prediction (diffusion.prediction: v, docs/unet.md).
UNetConfig SD2V() {
  UNetConfig c = SD2Base();
  c.name = "SD2-v";
  c.sample_size = 96;
  c.upcast_attention = true;
  return c;
}

// stabilityai/stable-diffusion-xl-base-1.0's unet/config.json.
UNetConfig SDXL() {
  UNetConfig c;
  c.name = "SDXL";
  c.sample_size = 128;
  c.block_out_channels = {320, 640, 1280};
  c.down_block_types = {kDown, kCrossAttnDown, kCrossAttnDown};
  c.up_block_types = {kCrossAttnUp, kCrossAttnUp, kUp};
  c.attention_head_dim = {5, 10, 20};
  c.cross_attention_dim = 2048;
  c.use_linear_projection = true;
  c.transformer_layers_per_block = {1, 2, 10};
  c.addition_time_embed_dim = 256;
  c.projection_class_embeddings_input_dim = 2816;
  return c;
}

}  // namespace

Status UNetConfig::Validate() const {
  for (auto [field, v] : {std::pair{"sample_size", sample_size},
                          {"in_channels", in_channels},
                          {"out_channels", out_channels},
                          {"layers_per_block", layers_per_block},
                          {"cross_attention_dim", cross_attention_dim},
                          {"norm_num_groups", norm_num_groups},
                          {"text_length", text_length}}) {
    if (v <= 0) return Errorf("model.{} must be positive, got {}", field, v);
  }
  // Far beyond any trained UNet (SD's: 2 resnets a level, 4 levels): the plan's per-layer
  // loops stay bounded for whatever a job file says.
  constexpr int kMaxLayersPerBlock = 64, kMaxLevels = 16;
  if (layers_per_block > kMaxLayersPerBlock) {
    return Errorf("model.layers_per_block {} exceeds {}", layers_per_block, kMaxLayersPerBlock);
  }
  if (block_out_channels.size() > kMaxLevels) {
    return Errorf("model.block_out_channels has {} levels, more than {}", block_out_channels.size(),
                  kMaxLevels);
  }
  if (block_out_channels.empty()) return Status::Error("model.block_out_channels is empty");
  if (down_block_types.size() != block_out_channels.size() ||
      up_block_types.size() != block_out_channels.size()) {
    return Errorf(
        "model: down_block_types ({}) and up_block_types ({}) must have one entry per "
        "block_out_channels entry ({})",
        down_block_types.size(), up_block_types.size(), block_out_channels.size());
  }
  if (attention_head_dim.size() != 1 && attention_head_dim.size() != block_out_channels.size()) {
    return Errorf("model.attention_head_dim: expected one number or one per block ({}), found {}",
                  block_out_channels.size(), attention_head_dim.size());
  }
  for (int i = 0; i < levels(); ++i) {
    const int C = block_out_channels[i];
    if (C <= 0 || C % norm_num_groups != 0) {
      return Errorf(
          "model.block_out_channels[{}] = {}: expected a positive multiple of "
          "norm_num_groups = {}",
          i, C, norm_num_groups);
    }
    if (heads(i) <= 0 || C % heads(i) != 0) {
      return Errorf("model.attention_head_dim: {} heads do not divide the {} channels of block {}",
                    heads(i), C, i);
    }
    if (down_block_types[i] != kCrossAttnDown && down_block_types[i] != kDown) {
      return Errorf("model.down_block_types[{}]: '{}' is not supported (only {} and {})", i,
                    down_block_types[i], kCrossAttnDown, kDown);
    }
    if (up_block_types[i] != kCrossAttnUp && up_block_types[i] != kUp) {
      return Errorf("model.up_block_types[{}]: '{}' is not supported (only {} and {})", i,
                    up_block_types[i], kCrossAttnUp, kUp);
    }
  }
  if (transformer_layers_per_block.size() != 1 &&
      transformer_layers_per_block.size() != block_out_channels.size()) {
    return Errorf(
        "model.transformer_layers_per_block: expected one number or one per block ({}), found {}",
        block_out_channels.size(), transformer_layers_per_block.size());
  }
  constexpr int kMaxTransformerDepth = 64;  // SDXL's deepest is 10
  for (int depth : transformer_layers_per_block) {
    if (depth < 1 || depth > kMaxTransformerDepth) {
      return Errorf("model.transformer_layers_per_block: {} is not in [1, {}]", depth,
                    kMaxTransformerDepth);
    }
  }
  if (text_time() && pooled_text_dim() <= 0) {
    return Errorf(
        "model.projection_class_embeddings_input_dim {} must exceed the {} time ids' "
        "{}·addition_time_embed_dim = {} (the rest is the pooled text embedding)",
        projection_class_embeddings_input_dim, time_ids(), time_ids(),
        time_ids() * addition_time_embed_dim);
  }
  if (requires_aesthetics_score && !text_time()) {
    return Errorf(
        "model.requires_aesthetics_score: an aesthetic score is a time id of SDXL's "
        "micro-conditioning (addition_embed_type text_time), which this UNet has not");
  }
  if (text_time() && addition_time_embed_dim % 2 != 0) {
    return Errorf("model.addition_time_embed_dim must be even (cos and sin halves), got {}",
                  addition_time_embed_dim);
  }
  if (heads(levels() - 1) <= 0 || block_out_channels.back() % heads(levels() - 1) != 0)
    return Errorf("model.attention_head_dim: the mid block's heads must divide its channels");
  if (sample_width < 0)
    return Errorf("model.sample_size: the width must be positive, got {}", sample_width);
  for (const int side : {sample_size, width()}) {
    if (side % (1 << (levels() - 1)) != 0) {
      return Errorf(
          "model.sample_size {} must be divisible by 2^{} (one halving per down block "
          "but the last)",
          side, levels() - 1);
    }
  }
  if (text_dropout < 0 || text_dropout >= 1)
    return Errorf("model.text_dropout must be in [0, 1), got {}", text_dropout);
  if (time_cond_proj_dim < 0 || (time_cond_proj_dim > 0 && time_cond_proj_dim < 4)) {
    return Errorf(
        "model.time_cond_proj_dim must be at least 4 (the guidance embedding's sin and cos "
        "halves of 2 or more frequencies) or null, got {}",
        time_cond_proj_dim);
  }
  return Status::Ok();
}

nlohmann::json UNetConfig::ToJson() const {
  json j = {{"name", name},
            {"sample_size", width() == sample_size ? json(sample_size)
                                                   : json(std::vector<int>{sample_size, width()})},
            {"in_channels", in_channels},
            {"out_channels", out_channels},
            {"block_out_channels", block_out_channels},
            {"down_block_types", down_block_types},
            {"up_block_types", up_block_types},
            {"layers_per_block", layers_per_block},
            {"cross_attention_dim", cross_attention_dim},
            {"norm_num_groups", norm_num_groups},
            {"use_linear_projection", use_linear_projection},
            {"upcast_attention", upcast_attention},
            {"text_length", text_length},
            {"text_dropout", text_dropout}};
  if (time_cond_proj_dim > 0) j["time_cond_proj_dim"] = time_cond_proj_dim;
  if (transformer_layers_per_block.size() == 1) {
    j["transformer_layers_per_block"] = transformer_layers_per_block[0];
  } else {
    j["transformer_layers_per_block"] = transformer_layers_per_block;
  }
  if (text_time()) {
    j["addition_embed_type"] = "text_time";
    j["addition_time_embed_dim"] = addition_time_embed_dim;
    j["projection_class_embeddings_input_dim"] = projection_class_embeddings_input_dim;
    if (requires_aesthetics_score) j["requires_aesthetics_score"] = true;
  }
  if (attention_head_dim.size() == 1) {
    j["attention_head_dim"] = attention_head_dim[0];
  } else {
    j["attention_head_dim"] = attention_head_dim;
  }
  return j;
}

Result<UNetConfig> UNetConfig::FromJson(const json& j) {
  if (!j.is_object()) return Status::Error("model: the UNet config is not an object");
  UNetConfig c;
  bool text_time = false;
  try {
    for (const auto& [key, value] : j.items()) {
      if (key.starts_with("_")) continue;
      if (key == "name")
        c.name = value.get<std::string>();
      else if (key == "sample_size" && value.is_array()) {
        // diffusers' [height, width]
        const std::vector<int> size = JsonInts(value, key);
        if (size.size() != 2)
          return Errorf("model.sample_size: expected a side or [height, width], found {}",
                        value.dump());
        c.sample_size = size[0];
        c.sample_width = size[0] == size[1] ? 0 : size[1];
      } else if (key == "sample_size")
        c.sample_size = JsonInt(value, key);
      else if (key == "in_channels")
        c.in_channels = JsonInt(value, key);
      else if (key == "out_channels")
        c.out_channels = JsonInt(value, key);
      else if (key == "block_out_channels")
        c.block_out_channels = JsonInts(value, key);
      else if (key == "down_block_types")
        c.down_block_types = value.get<std::vector<std::string>>();
      else if (key == "up_block_types")
        c.up_block_types = value.get<std::vector<std::string>>();
      else if (key == "layers_per_block")
        c.layers_per_block = JsonInt(value, key);
      else if (key == "attention_head_dim")
        c.attention_head_dim =
            value.is_array() ? JsonInts(value, key) : std::vector<int>{JsonInt(value, key)};
      else if (key == "cross_attention_dim")
        c.cross_attention_dim = JsonInt(value, key);
      else if (key == "norm_num_groups")
        c.norm_num_groups = JsonInt(value, key);
      else if (key == "use_linear_projection")
        c.use_linear_projection = value.get<bool>();
      else if (key == "upcast_attention")
        c.upcast_attention = !value.is_null() && value.get<bool>();  // SDXL's is null
      else if (key == "text_length")
        c.text_length = JsonInt(value, key);
      else if (key == "text_dropout")
        c.text_dropout = value.get<double>();
      else if (key == "time_cond_proj_dim")
        c.time_cond_proj_dim = value.is_null() ? 0 : JsonInt(value, key);
      else if (key == "transformer_layers_per_block") {
        if (value.is_array() && !value.empty() && value[0].is_array()) {
          return Errorf(
              "model.transformer_layers_per_block: a list per resnet ({}) is not supported; "
              "one number or one per block",
              value.dump());
        }
        c.transformer_layers_per_block =
            value.is_array() ? JsonInts(value, key) : std::vector<int>{JsonInt(value, key)};
      } else if (key == "addition_embed_type") {
        if (!value.is_null() && value != "text_time") {
          return Errorf("model.addition_embed_type: only null and \"text_time\" (SDXL's), found {}",
                        value.dump());
        }
        text_time = !value.is_null();
      } else if (key == "addition_time_embed_dim")
        c.addition_time_embed_dim = value.is_null() ? 0 : JsonInt(value, key);
      else if (key == "projection_class_embeddings_input_dim")
        c.projection_class_embeddings_input_dim = value.is_null() ? 0 : JsonInt(value, key);
      else if (key == "requires_aesthetics_score")
        c.requires_aesthetics_score = value.get<bool>();
      else {
        auto fixed = FixedKeys().find(key);
        if (fixed == FixedKeys().end())
          return Errorf("model.{}: not a UNet2DConditionModel key difftrain supports", key);
        if (!SameValue(value, fixed->second)) {
          return Errorf("model.{}: only {} is supported, found {}", key, fixed->second.dump(),
                        value.dump());
        }
      }
    }
  } catch (const json::exception& e) {
    return Errorf("model: malformed UNet config: {}", e.what());
  }
  // text_time needs both of its sizes; its sizes mean nothing without it.
  if (text_time != (c.addition_time_embed_dim > 0) ||
      text_time != (c.projection_class_embeddings_input_dim > 0)) {
    return Errorf(
        "model: addition_embed_type \"text_time\" goes with addition_time_embed_dim and "
        "projection_class_embeddings_input_dim (SDXL: 256 and 2816), found {}, {} and {}",
        text_time ? "text_time" : "null", c.addition_time_embed_dim,
        c.projection_class_embeddings_input_dim);
  }
  return c;
}

Result<UNetConfig> UNetConfigByName(const std::string& name) {
  for (const UNetConfig& c : {SD15(), SD2Base(), SD2V(), SDXL()}) {
    if (c.name == name) return c;
  }
  return Errorf("unknown UNet config '{}' (known: {})", name, fmt::join(UNetConfigNames(), ", "));
}

std::vector<std::string> UNetConfigNames() {
  return {"SD1.5", "SD2-base", "SD2-v", "SDXL"};
}

int64_t ParameterCount(const UNetConfig& c) {
  return static_cast<int64_t>(UNetPlan(c).table.total());
}

UNetMacs ForwardMacs(const UNetConfig& c) {
  const UNetPlan plan(c);
  const double E = c.time_embed_dim();
  UNetMacs m;
  m.linear += c.block_out_channels[0] * E + E * E;  // the time embedding
  if (c.text_time()) m.linear += c.projection_class_embeddings_input_dim * E + E * E;
  for (const UNetNode& n : plan.nodes) {
    const UNetMacs node = NodeMacs(c, plan, n).forward;
    m.conv += node.conv;
    m.linear += node.linear;
    m.attention += node.attention;
  }
  return m;
}

}  // namespace difftrain
