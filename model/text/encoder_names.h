// The transformers state-dict names of a text encoder's tensors (model/text/encoder.h), which
// its inference pass (encoder.cc) and its training pass (clip_pass.cc) both read.
#pragma once

#include <string>

#include <fmt/format.h>

#include "model/text/config.h"

namespace difftrain::text {

// The names of one layer's tensors, in the order a layer reads them.
struct LayerNames {
  std::string q, k, v, out, norm1, fc1, fc2, norm2;
};

inline LayerNames EncoderLayer(const TextEncoderConfig& c, int i) {
  if (c.kind == TextEncoderKind::kBert) {
    const std::string p = fmt::format("encoder.layer.{}.", i);
    return {p + "attention.self.query",
            p + "attention.self.key",
            p + "attention.self.value",
            p + "attention.output.dense",
            p + "attention.output.LayerNorm",
            p + "intermediate.dense",
            p + "output.dense",
            p + "output.LayerNorm"};
  }
  const std::string p = fmt::format("text_model.encoder.layers.{}.", i);
  return {p + "self_attn.q_proj", p + "self_attn.k_proj",
          p + "self_attn.v_proj", p + "self_attn.out_proj",
          p + "layer_norm1",      p + "mlp.fc1",
          p + "mlp.fc2",          p + "layer_norm2"};
}

// The embedding tables: tokens, positions (and BERT's token types and its LayerNorm).
struct EmbeddingNames {
  std::string tokens, positions, types, norm;
};

inline EmbeddingNames EncoderEmbeddings(const TextEncoderConfig& c) {
  if (c.kind == TextEncoderKind::kBert) {
    return {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm"};
  }
  return {"text_model.embeddings.token_embedding.weight",
          "text_model.embeddings.position_embedding.weight", "", ""};
}

inline constexpr char kClipFinalNorm[] = "text_model.final_layer_norm";
inline constexpr char kClipProjection[] = "text_projection.weight";  // [P, D], no bias

}  // namespace difftrain::text
