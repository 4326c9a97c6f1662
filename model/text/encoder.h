// Text encoders on the CPU, for inference: token ids → the hidden states a text-conditional
// model's cross-attention reads (Stable Diffusion takes CLIP's last hidden state at all 77
// positions; difftrain's captioned Fashion-MNIST, MiniLM's at all L). Weights come from a
// transformers folder; every result equals transformers' own
// (tests/text_encoder_reference_test.cc).
//
//   BERT:  x = LayerNorm(word[id] + position[l] + token_type[0]);
//          per layer: x = LayerNorm(x + out(attention(x)));  x = LayerNorm(x + fc2(act(fc1(x))))
//          where attention sees the real tokens only (the tokenizer's mask; padding rows are
//          computed too, as transformers computes them).
//   CLIP:  x = token[id] + position[l];
//          per layer: x += out(causal attention(LayerNorm1(x)));  x += fc2(act(fc1(LayerNorm2(x))))
//          then the final LayerNorm. Padding is attended (causally), as Stable Diffusion's
//          pipelines call it, without a mask. With a projection (CLIPTextModelWithProjection,
//          SDXL's text_encoder_2) the pooled output is text_projection(final LayerNorm(x[eos])),
//          transformers' text_embeds.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/io/safetensors.h"
#include "model/tensor/tensor_table.h"
#include "model/text/config.h"
#include "model/text/tokenizer.h"

namespace difftrain {

class TextEncoder {
 public:
  // The weights at `path`: a transformers folder (config.json and model.safetensors, else
  // model.fp16.safetensors), a diffusers pipeline's folder holding one in text_encoder/, or the
  // safetensors file itself with config.json beside it. BERT's names may carry the "bert."
  // prefix of its task models. With `weights`, the model of `path`'s config takes its weights
  // from that safetensors file (already read) instead: an original Stable Diffusion checkpoint's
  // text model number `part` (io::LdmTextModels: SD 1.x's CLIP, SD 2.x's OpenCLIP, SDXL's CLIP
  // and OpenCLIP), with a projection only where it is OpenCLIP's with its text_projection and the
  // config asks for one (SDXL's text_encoder_2). A CLIP text model has a projection
  // (projection_dim() > 0) where its config's architectures name CLIPTextModelWithProjection or
  // its weights hold text_projection.weight [P, D]. Errors name the file and what is missing or
  // misshapen.
  static Result<TextEncoder> Load(const std::string& path,
                                  const io::SafetensorsFile* weights = nullptr, size_t part = 0);
  // The config of the encoder at `path` (as Load finds it), without its weights.
  static Result<TextEncoderConfig> ReadConfig(const std::string& path);
  // A model of `config` with `weights` laid out as Tensors(config) (tests).
  TextEncoder(TextEncoderConfig config, std::vector<float> weights);

  const TextEncoderConfig& config() const { return config_; }
  const TensorTable& tensors() const { return table_; }
  // The weights, laid out by tensors() (a LoRA fuses into them).
  float* weights() { return weights_.data(); }
  // The file the weights came from ("" when built from memory).
  const std::string& source() const { return source_; }
  // The config.json it was built from ("" when built from memory): its folder is the encoder's.
  const std::string& config_source() const { return config_source_; }

  // N texts of L tokens each (L <= max_positions, ids in [0, vocab_size)) → out [N, L, D]: the
  // hidden state after all layers but the last `skip_layers` (CLIP: then its final LayerNorm,
  // as Stable Diffusion 1.x/2.x's clip_skip takes it, unless !final_norm: SDXL takes
  // hidden_states[-(clip_skip + 2)] without it). skip_layers 0 is the last hidden state.
  // With `pooled`, the same forward pass also writes Pool's output there.
  Status Encode(const std::vector<text::Tokens>& texts, int skip_layers, float* out,
                bool final_norm = true, float* pooled = nullptr) const;

  // The pooled output of N texts → out [N, projection_dim()], as transformers'
  // CLIPTextModelWithProjection computes text_embeds: the last hidden state after the final
  // LayerNorm at the end-of-text position (the first eos_token_id; with a legacy config's id 2,
  // the largest id's), through text_projection. Errors: an encoder without a projection, and
  // Encode's.
  Status Pool(const std::vector<text::Tokens>& texts, float* out) const;
  // P, the pooled output's width; 0 when the encoder has no projection.
  int projection_dim() const { return config_.projection_dim; }

  // CLIP's token embedding table resized to `vocab_size` rows, as transformers'
  // resize_token_embeddings (rows kept up to the smaller size; new ones zero), then rows `ids`
  // set to `rows` [ids.size(), hidden_size] (textual inversion). Errors: not CLIP, an id outside
  // the new table.
  Status SetTokenEmbeddings(int vocab_size, const std::vector<int32_t>& ids, const float* rows);

  // Training through the encoder (textual inversion; model/text/clip_pass.h): a CLIP model's
  // input embeddings of N texts of L tokens, x [N, L, D], each position's token embedding plus
  // its position embedding, as Encode starts from them. Errors: not CLIP, and Encode's for
  // the texts' lengths and ids.
  Status InputEmbeddings(const std::vector<text::Tokens>& texts, float* x) const;
  // The token embedding table [vocab_size, D] (the rows textual inversion trains).
  float* token_embeddings();

  // The tensors a model of `config` has, under transformers' state-dict names.
  static TensorTable Tensors(const TextEncoderConfig& config);

 private:
  TextEncoder(TensorTable table, const TextEncoderConfig& config, std::vector<float> weights);
  const float* W(const std::string& name) const;
  // The texts' lengths (all the same, 1 to max_positions) and ids (in the vocabulary).
  Status CheckTexts(const std::vector<text::Tokens>& texts) const;
  // Encode and Pool: `hidden` and `pooled` each optional.
  Status Forward(const std::vector<text::Tokens>& texts, int skip_layers, bool final_norm,
                 float* hidden, float* pooled) const;

  TextEncoderConfig config_;
  TensorTable table_;
  std::vector<float> weights_;
  std::string source_;
  std::string config_source_;
};

}  // namespace difftrain
