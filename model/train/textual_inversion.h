// Textual inversion (Gal et al. 2022, "An Image is Worth One Word"; diffusers'
// textual_inversion.py): a new token of the text encoder, whose embedding alone is trained so
// that the frozen model draws the pictures of the data when a prompt names it. As the script:
//   - the tokens `token`, token_1, …, token_{vectors−1} are added to the CLIP tokenizer, and
//     each of their embedding rows starts as the embedding of `initializer_token` (a word the
//     tokenizer makes one token of);
//   - each sample's text is its caption (the data's text table) or, with `templates`, one of
//     them drawn at random with "{}" replaced by the tokens (the script's "a photo of a {}");
//   - the text is encoded by the text encoder (TextEncoder::Encode, its weights frozen) into
//     the context the UNet cross-attends to; the loss's gradient flows back through the UNet
//     (its weights frozen: Model::SetContextGradient) and the encoder (ClipPass) to the input
//     embeddings, of which the new tokens' positions give the trained rows' gradients;
//   - the optimizer, clipping, the EMA and the data-parallel average work on those rows (the
//     trainer's "trained arena", as a LoRA run's adapters).
// The run's result is the rows, [vectors, D]: `difftrain export --format textual_inversion`
// writes them as the script's learned_embeds.safetensors, which diffusers'
// load_textual_inversion and `difftrain sample --textual-inversion` take.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/text/embedder.h"
#include "model/train/text_training.h"
#include "model/train/textual_inversion_config.h"

namespace difftrain {

class TextualInversion : public TextTraining {
 public:
  // The encoder at `encoder_path` with the new tokens; contexts of `length` tokens after all
  // but `skip_layers` layers (the data's table's clip skip). Errors name what does not fit: not one
  // CLIP encoder (SDXL's pair trains both; not here), the initializer not one token, the token
  // already a word.
  static Result<std::unique_ptr<TextualInversion>> Create(const TextualInversionConfig& config,
                                                          const std::string& encoder_path,
                                                          int length, int skip_layers);
  void SetSlots(int slots) override;

  // The trained arena, [vectors, D], and its gradient.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  size_t size() const { return params_.size(); }
  int vectors() const { return config_.vectors; }
  int dim() const { return dim_; }
  const TextEmbedder& embedder() const { return *embedder_; }
  const EncoderPasses& passes() const { return passes_; }
  const TextualInversionConfig& config() const { return config_; }

  // The text of a sample: `caption`, or with templates template `pick` % count.
  std::string Text(const std::string& caption, uint64_t pick) const override;
  // `text` as the encoder's tokens (the multi-vector token spelled out).
  text::Tokens Tokenize(const std::string& text) const override;

  Status Encode(int slot, const std::vector<text::Tokens>& texts, float* context) override;
  // The gradient of slot's context → added into grads() (the rows of the new tokens, wherever
  // the texts hold them).
  void Backward(int slot, const float* dcontext) override;
  // The encoder's new rows set to `vectors` (params(), or their EMA), [vectors, D].
  void Apply(const float* vectors);

 private:
  TextualInversion(TextualInversionConfig config, std::unique_ptr<TextEmbedder> embedder,
                   int32_t first_id, int length, int skip_layers);

  TextualInversionConfig config_;
  std::unique_ptr<TextEmbedder> embedder_;
  int32_t first_id_;  // the new tokens' ids are [first_id_, first_id_ + vectors)
  int dim_;
  std::vector<float> params_, grads_;
  EncoderPasses passes_;
};

}  // namespace difftrain
