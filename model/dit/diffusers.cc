#include "model/dit/diffusers.h"

#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "common/json_read.h"

namespace difftrain {
namespace {

// diffusers' DiT: the class names (Transformer2DModel until 0.29, DiTTransformer2DModel since).
bool IsDitClass(const std::string& name) {
  return name == "Transformer2DModel" || name == "DiTTransformer2DModel";
}

}  // namespace

Result<nlohmann::json> DiffusersDitConfig(const DiTConfig& c) {
  if (c.video) return Errorf("a video model has no diffusers DiT form");
  if (c.mlp_ratio != 4) {
    return Errorf("model.mlp_ratio {}: diffusers' DiT blocks have MLPs 4× as wide", c.mlp_ratio);
  }
  if (!c.has_labels() || !c.has_null_class()) {
    return Errorf(
        "diffusers' DiT is class-conditional with a null class: the model needs num_classes > 0 "
        "and class_dropout_prob > 0 (it has {} and {})",
        c.num_classes, c.class_dropout_prob);
  }
  return nlohmann::json{
      {"_class_name", "Transformer2DModel"},
      {"_diffusers_version", "0.27.2"},
      {"activation_fn", "gelu-approximate"},
      {"attention_bias", true},
      {"attention_head_dim", c.head_dim()},
      {"cross_attention_dim", nullptr},
      {"dropout", 0.0},
      {"in_channels", c.in_channels},
      // The position embedding at the model's own grid, as DiT's (diffusers would scale it
      // from sample_size 128 on).
      {"interpolation_scale", 1},
      {"norm_elementwise_affine", false},
      // DiT's LayerNorms' (diffusers' default 1e-5 would reach the MLP's norm).
      {"norm_eps", 1e-6},
      {"norm_type", "ada_norm_zero"},
      {"num_attention_heads", c.num_heads},
      {"num_embeds_ada_norm", c.num_classes},
      {"num_layers", c.depth},
      {"out_channels", c.out_channels()},
      {"patch_size", c.patch_size},
      {"sample_size", c.input_size},
  };
}

Result<std::optional<DiTConfig>> DiTConfigFromDiffusers(const nlohmann::json& config) {
  if (!config.is_object() || !IsDitClass(JsonStringOr(config, "_class_name", "")) ||
      JsonStringOr(config, "norm_type", "") != "ada_norm_zero" ||
      !config.value("patch_size", nlohmann::json()).is_number_integer() ||
      !config.value("in_channels", nlohmann::json()).is_number_integer()) {
    return std::optional<DiTConfig>();
  }
  auto integer = [&](const char* key) -> Result<int> {
    const nlohmann::json v = config.value(key, nlohmann::json());
    if (!v.is_number_integer()) return Errorf("diffusers DiT config: '{}' is no integer", key);
    try {
      return JsonInt(v, key);
    } catch (const nlohmann::json::exception& e) {
      return Errorf("diffusers DiT config: {}", e.what());
    }
  };
  // What difftrain's DiT is, where diffusers' may be otherwise.
  auto expect = [&](const char* key, const nlohmann::json& want) -> Status {
    if (config.contains(key) && config[key] != want) {
      return Errorf("diffusers DiT config: '{}' is {}, difftrain's DiT has {}", key,
                    config[key].dump(), want.dump());
    }
    return Status::Ok();
  };
  DT_RETURN_IF_ERROR(expect("activation_fn", "gelu-approximate"));
  DT_RETURN_IF_ERROR(expect("attention_bias", true));
  DT_RETURN_IF_ERROR(expect("cross_attention_dim", nullptr));
  DT_RETURN_IF_ERROR(expect("norm_elementwise_affine", false));
  DT_RETURN_IF_ERROR(expect("num_vector_embeds", nullptr));
  DiTConfig c;
  DT_ASSIGN_OR_RETURN(c.input_size, integer("sample_size"));
  DT_ASSIGN_OR_RETURN(c.patch_size, integer("patch_size"));
  DT_ASSIGN_OR_RETURN(c.in_channels, integer("in_channels"));
  DT_ASSIGN_OR_RETURN(c.num_heads, integer("num_attention_heads"));
  DT_ASSIGN_OR_RETURN(const int head_dim, integer("attention_head_dim"));
  DT_ASSIGN_OR_RETURN(c.depth, integer("num_layers"));
  DT_ASSIGN_OR_RETURN(c.num_classes, integer("num_embeds_ada_norm"));
  const int64_t hidden = int64_t{c.num_heads} * head_dim;
  if (hidden <= 0 || hidden > std::numeric_limits<int>::max()) {
    return Errorf(
        "diffusers DiT config: num_attention_heads {} × attention_head_dim {} is no width",
        c.num_heads, head_dim);
  }
  c.hidden_size = static_cast<int>(hidden);
  c.mlp_ratio = 4;
  c.class_dropout_prob = 0.1;  // diffusers' class embedder has the null class
  const nlohmann::json out = config.value("out_channels", nlohmann::json());
  DT_ASSIGN_OR_RETURN(const int out_channels, out.is_number_integer() ? integer("out_channels")
                                                                      : Result<int>(c.in_channels));
  if (out_channels != c.in_channels && out_channels != 2 * c.in_channels) {
    return Errorf(
        "diffusers DiT config: out_channels {} is neither in_channels {} nor twice them (a "
        "learned σ)",
        out_channels, c.in_channels);
  }
  c.learn_sigma = out_channels == 2 * c.in_channels;
  for (const std::string& name : DiTConfigNames()) {
    Result<DiTConfig> named = DiTConfigByName(name, c.input_size);
    if (!named.ok()) continue;
    DiTConfig as_named = c;
    as_named.name = named->name;
    if (as_named.ToJson() == named->ToJson()) {
      c.name = named->name;
      break;
    }
  }
  if (Status valid = c.Validate(); !valid.ok()) return valid.WithContext("diffusers DiT config");
  return std::optional<DiTConfig>(c);
}

}  // namespace difftrain
