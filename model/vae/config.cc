#include "model/vae/config.h"

#include <map>

#include <fmt/format.h>

#include "common/json_read.h"

namespace difftrain {
namespace {

using json = nlohmann::json;

constexpr char kDownBlock[] = "DownEncoderBlock2D";
constexpr char kUpBlock[] = "UpDecoderBlock2D";

// Keys difftrain implements at one value only (newer diffusers versions add the last three).
const std::map<std::string, json>& FixedKeys() {
  static const std::map<std::string, json> keys = {
      {"act_fn", "silu"},        {"latents_mean", nullptr}, {"latents_std", nullptr},
      {"shift_factor", nullptr}, {"use_quant_conv", true},  {"use_post_quant_conv", true},
      {"norm_type", "group"},
  };
  return keys;
}

}  // namespace

Status VaeConfig::Validate() const {
  if (block_out_channels.empty()) return Errorf("block_out_channels is empty");
  for (size_t i = 0; i < block_out_channels.size(); ++i) {
    if (block_out_channels[i] <= 0 || norm_num_groups <= 0 ||
        block_out_channels[i] % norm_num_groups != 0) {
      return Errorf("block_out_channels[{}] = {} is not a positive multiple of norm_num_groups {}",
                    i, block_out_channels[i], norm_num_groups);
    }
  }
  if (in_channels <= 0 || out_channels <= 0 || latent_channels <= 0)
    return Errorf("in_channels, out_channels and latent_channels must be positive");
  if (layers_per_block < 1) return Errorf("layers_per_block must be at least 1");
  if (!(scaling_factor > 0)) return Errorf("scaling_factor must be positive");
  return Status::Ok();
}

Result<VaeConfig> VaeConfig::FromJson(const json& j) {
  if (!j.is_object()) return Errorf("the VAE config is not a JSON object");
  VaeConfig c;
  const auto blocks = [&](const json& value, const char* key, const char* type) -> Status {
    const auto types = value.get<std::vector<std::string>>();
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != type)
        return Errorf("{}[{}]: '{}' is not supported (only {})", key, i, types[i], type);
    }
    if (types.size() != c.block_out_channels.size()) {
      return Errorf("{} has {} blocks but block_out_channels {}", key, types.size(),
                    c.block_out_channels.size());
    }
    return Status::Ok();
  };
  try {
    if (j.contains("_class_name") && j["_class_name"] != "AutoencoderKL")
      return Errorf("_class_name: {} is not AutoencoderKL", j["_class_name"].dump());
    if (j.contains("block_out_channels"))
      c.block_out_channels = JsonInts(j["block_out_channels"], "block_out_channels");
    for (const auto& [key, value] : j.items()) {
      if (key.starts_with("_") || key == "block_out_channels") continue;
      if (key == "in_channels") {
        c.in_channels = JsonInt(value, key);
      } else if (key == "out_channels") {
        c.out_channels = JsonInt(value, key);
      } else if (key == "layers_per_block") {
        c.layers_per_block = JsonInt(value, key);
      } else if (key == "latent_channels") {
        c.latent_channels = JsonInt(value, key);
      } else if (key == "norm_num_groups") {
        c.norm_num_groups = JsonInt(value, key);
      } else if (key == "scaling_factor") {
        c.scaling_factor = value.get<double>();
      } else if (key == "mid_block_add_attention") {
        c.mid_block_add_attention = value.get<bool>();
      } else if (key == "down_block_types") {
        DT_RETURN_IF_ERROR(blocks(value, "down_block_types", kDownBlock));
      } else if (key == "up_block_types") {
        DT_RETURN_IF_ERROR(blocks(value, "up_block_types", kUpBlock));
      } else if (key == "sample_size" || key == "force_upcast") {
        // Tiling's tile size and fp16 upcasting: difftrain decodes whole images in fp32.
      } else {
        auto fixed = FixedKeys().find(key);
        if (fixed == FixedKeys().end())
          return Errorf("{}: not an AutoencoderKL key difftrain supports", key);
        if (value != fixed->second) {
          return Errorf("{}: only {} is supported, found {}", key, fixed->second.dump(),
                        value.dump());
        }
      }
    }
  } catch (const json::exception& e) {
    return Errorf("malformed AutoencoderKL config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace difftrain
