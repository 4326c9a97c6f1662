#include "model/text/config.h"

#include <algorithm>
#include <type_traits>

#include <fmt/format.h>

#include "common/json_read.h"

namespace difftrain {
namespace {

using json = nlohmann::json;

Result<TextActivation> ParseActivation(const std::string& name) {
  if (name == "gelu") return TextActivation::kGelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return TextActivation::kGeluTanh;
  if (name == "quick_gelu") return TextActivation::kQuickGelu;
  return Errorf("hidden_act: '{}' is not supported (gelu, gelu_new, gelu_pytorch_tanh, quick_gelu)",
                name);
}

// `key` of `j` into `out` when present.
template <typename T>
void Read(const json& j, const char* key, T* out) {
  if (!j.contains(key) || j[key].is_null()) return;
  if constexpr (std::is_same_v<T, int>) {
    *out = JsonInt(j[key], key);  // range-checked
  } else {
    *out = j[key].get<T>();
  }
}

}  // namespace

std::string TextEncoderConfig::Describe() const {
  return fmt::format("{}, {} layers, {} features, {} heads{}",
                     kind == TextEncoderKind::kBert ? "BERT" : "CLIP text", num_layers, hidden_size,
                     num_heads,
                     projection_dim > 0 ? fmt::format(", projection to {}", projection_dim) : "");
}

Status TextEncoderConfig::Validate() const {
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0 ||
      num_heads <= 0 || max_positions <= 0) {
    return Errorf(
        "vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and "
        "max_position_embeddings must be positive");
  }
  if (hidden_size % num_heads != 0) {
    return Errorf("hidden_size {} is not a multiple of num_attention_heads {}", hidden_size,
                  num_heads);
  }
  if (kind == TextEncoderKind::kBert && type_vocab_size <= 0)
    return Errorf("type_vocab_size must be positive");
  if (!(layer_norm_eps > 0)) return Errorf("layer_norm_eps must be positive");
  if (projection_dim < 0) return Errorf("projection_dim must not be negative");
  return Status::Ok();
}

Result<TextEncoderConfig> TextEncoderConfig::FromJson(const json& file) {
  if (!file.is_object()) return Errorf("the text encoder's config is not a JSON object");
  TextEncoderConfig c;
  try {
    const json* j = &file;
    std::string type = file.value("model_type", "");
    if (type == "clip") {  // a whole CLIP model: its text half
      if (!file.contains("text_config") || !file["text_config"].is_object())
        return Errorf("model_type 'clip' without a text_config object");
      j = &file["text_config"];
      type = "clip_text_model";
    }
    std::string act;
    if (type == "bert") {
      act = "gelu";
      Read(*j, "type_vocab_size", &c.type_vocab_size);
      const std::string positions = j->value("position_embedding_type", "absolute");
      if (positions != "absolute") {
        return Errorf("position_embedding_type: '{}' is not supported (only absolute)", positions);
      }
      if (j->value("is_decoder", false) || j->value("add_cross_attention", false))
        return Errorf("is_decoder / add_cross_attention: a BERT decoder is not supported");
    } else if (type == "clip_text_model") {
      c.kind = TextEncoderKind::kClip;
      c.vocab_size = 49408;
      c.hidden_size = 512;
      c.intermediate_size = 2048;
      c.num_heads = 8;
      c.max_positions = 77;
      c.layer_norm_eps = 1e-5;
      act = "quick_gelu";
      Read(*j, "eos_token_id", &c.eos_token_id);
      const json architectures = file.value("architectures", json::array());
      if (architectures.is_array() &&
          std::find(architectures.begin(), architectures.end(), "CLIPTextModelWithProjection") !=
              architectures.end()) {
        c.projection_dim = 512;
        Read(*j, "projection_dim", &c.projection_dim);
        if (c.projection_dim <= 0)
          return Errorf("projection_dim: {} (CLIPTextModelWithProjection's must be positive)",
                        c.projection_dim);
      }
    } else {
      return Errorf(
          "model_type: '{}' is not a text encoder difftrain runs (bert, clip_text_model, clip)",
          type);
    }
    Read(*j, "vocab_size", &c.vocab_size);
    Read(*j, "hidden_size", &c.hidden_size);
    Read(*j, "intermediate_size", &c.intermediate_size);
    Read(*j, "num_hidden_layers", &c.num_layers);
    Read(*j, "num_attention_heads", &c.num_heads);
    Read(*j, "max_position_embeddings", &c.max_positions);
    Read(*j, "layer_norm_eps", &c.layer_norm_eps);
    Read(*j, "hidden_act", &act);
    Result<TextActivation> activation = ParseActivation(act);
    if (!activation.ok()) return activation.status();
    c.activation = *activation;
  } catch (const json::exception& e) {
    return Errorf("a key has the wrong type: {}", e.what());
  }
  if (Status s = c.Validate(); !s.ok()) return s;
  return c;
}

}  // namespace difftrain
