// The text encoders difftrain runs, under the config keys of the config.json Hugging Face's
// transformers writes beside their weights:
//   - BERT (model_type "bert"; sentence-transformers' all-MiniLM-L6-v2, the encoder of
//     scripts/text_encoder.py): post-norm layers, bidirectional attention over the real
//     tokens (padding masked out), token-type 0 everywhere;
//   - CLIP's text transformer (model_type "clip_text_model", or "clip" with a text_config;
//     Stable Diffusion's text_encoder/): pre-norm layers, causal attention, a final LayerNorm;
//     with a text projection (CLIPTextModelWithProjection, SDXL's text_encoder_2/), the pooled
//     output: the projected end-of-text state.
// Keys missing from the file take transformers' defaults, as from_pretrained does.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

enum class TextEncoderKind { kBert, kClip };

enum class TextActivation {
  kGelu,       // "gelu": x · Φ(x), the exact (erf) form
  kGeluTanh,   // "gelu_new", "gelu_pytorch_tanh": the tanh approximation
  kQuickGelu,  // "quick_gelu": x · σ(1.702 x) (OpenAI's CLIP)
};

struct TextEncoderConfig {
  TextEncoderKind kind = TextEncoderKind::kBert;
  int vocab_size = 30522;
  int hidden_size = 768;
  int intermediate_size = 3072;
  int num_layers = 12;
  int num_heads = 12;
  int max_positions = 512;
  int type_vocab_size = 2;  // BERT only
  double layer_norm_eps = 1e-12;
  TextActivation activation = TextActivation::kGelu;
  // CLIP only. The rows of text_projection.weight [P, D]: set where `architectures` names
  // CLIPTextModelWithProjection (its `projection_dim`, default 512) or the weights hold the
  // tensor (TextEncoder::Load); 0: no projection, no pooled output.
  int projection_dim = 0;
  // CLIP only: the id whose first position the pooled output takes; 2 (the value of configs
  // written before transformers' PR #24773, SDXL's among them) means the position of the
  // largest id instead, as transformers keeps it for them.
  int eos_token_id = 49407;

  int head_dim() const { return hidden_size / num_heads; }
  // "BERT, 6 layers, 384 features" and the like.
  std::string Describe() const;
  Status Validate() const;
  // Refuses, by name, a model type or a key value difftrain does not implement
  // (hidden_act, position_embedding_type, a decoder …).
  static Result<TextEncoderConfig> FromJson(const nlohmann::json& j);
};

}  // namespace difftrain
