#include "model/train/textual_inversion.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "model/text/clip_bpe.h"

namespace difftrain {

Result<std::unique_ptr<TextualInversion>> TextualInversion::Create(
    const TextualInversionConfig& config, const std::string& encoder_path, int length,
    int skip_layers) {
  DT_RETURN_IF_ERROR(config.Validate());
  Result<TextEmbedder> loaded = TextEmbedder::Load(encoder_path);
  if (!loaded.ok()) return loaded.status().WithContext("textual_inversion.text_encoder");
  auto embedder = std::make_unique<TextEmbedder>(std::move(loaded).value());
  DT_RETURN_IF_ERROR(CheckTrainedEncoder(
      *embedder, encoder_path, length, skip_layers, "textual_inversion.text_encoder",
      "textual inversion trains one CLIP text encoder's tokens"));
  const TextEncoder& encoder = embedder->encoder();
  const auto* clip = dynamic_cast<const text::ClipBpeTokenizer*>(&embedder->tokenizer());
  if (clip == nullptr) {
    return Errorf("textual_inversion.text_encoder '{}': no CLIP tokenizer", encoder_path);
  }
  // The initializer: one token, whose embedding every new vector starts as.
  const std::vector<int32_t> pieces = clip->PieceIds(config.initializer_token);
  if (pieces.size() != 1) {
    return Errorf(
        "textual_inversion.initializer_token: '{}' is {} tokens to the tokenizer of '{}'; it "
        "must be one (a common word)",
        config.initializer_token, pieces.size(), encoder_path);
  }
  const int D = encoder.config().hidden_size;
  std::vector<float> rows(size_t(config.vectors) * D);
  const float* table = embedder->encoder().token_embeddings();
  for (int v = 0; v < config.vectors; ++v)
    std::copy_n(table + size_t(pieces[0]) * D, D, rows.data() + size_t(v) * D);
  Result<std::vector<int32_t>> ids =
      embedder->AddTextualInversion(config.token, config.vectors, {rows});
  if (!ids.ok()) return ids.status().WithContext("textual_inversion.token");
  return std::unique_ptr<TextualInversion>(
      new TextualInversion(config, std::move(embedder), (*ids)[0], length, skip_layers));
}

TextualInversion::TextualInversion(TextualInversionConfig config,
                                   std::unique_ptr<TextEmbedder> embedder, int32_t first_id,
                                   int length, int skip_layers)
    : config_(std::move(config)),
      embedder_(std::move(embedder)),
      first_id_(first_id),
      dim_(embedder_->encoder().config().hidden_size),
      params_(size_t(config_.vectors) * dim_),
      grads_(params_.size()),
      passes_(embedder_->encoder(), length, skip_layers) {
  std::copy_n(embedder_->encoder().token_embeddings() + size_t(first_id_) * dim_, params_.size(),
              params_.begin());
}

void TextualInversion::SetSlots(int slots) {
  passes_.SetSlots(slots);
}

std::string TextualInversion::Text(const std::string& caption, uint64_t pick) const {
  if (config_.templates.empty()) return caption;
  const std::string& t = config_.templates[pick % config_.templates.size()];
  const size_t at = t.find("{}");
  return t.substr(0, at) + config_.token + t.substr(at + 2);
}

text::Tokens TextualInversion::Tokenize(const std::string& text) const {
  return embedder_->tokenizer().Encode(embedder_->SpellInversions(text), passes_.length());
}

Status TextualInversion::Encode(int slot, const std::vector<text::Tokens>& texts, float* context) {
  return passes_.Encode(slot, texts, context);
}

void TextualInversion::Backward(int slot, const float* dcontext) {
  const std::vector<float>& dinputs = passes_.Backward(slot, dcontext);
  const std::vector<text::Tokens>& texts = passes_.texts(slot);
  const int length = passes_.length();
  for (size_t n = 0; n < texts.size(); ++n) {
    for (int l = 0; l < length; ++l) {
      const int32_t v = texts[n].ids[l] - first_id_;
      if (v < 0 || v >= config_.vectors) continue;
      const float* d = dinputs.data() + (n * length + l) * dim_;
      float* g = grads_.data() + size_t(v) * dim_;
      for (int i = 0; i < dim_; ++i)
        g[i] += d[i];
    }
  }
}

void TextualInversion::Apply(const float* vectors) {
  std::copy_n(vectors, params_.size(),
              embedder_->encoder().token_embeddings() + size_t(first_id_) * dim_);
}

}  // namespace difftrain
