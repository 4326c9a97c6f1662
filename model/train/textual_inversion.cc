#include "model/train/textual_inversion.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "model/text/clip_bpe.h"

namespace difftrain {

Status TextualInversionConfig::Validate() const {
  if (!enabled()) return Status::Ok();
  if (std::any_of(token.begin(), token.end(), [](unsigned char c) { return std::isspace(c); })) {
    return Errorf(
        "textual_inversion.token: '{}' holds white space; a token is one word, such as "
        "<cat-toy>",
        token);
  }
  if (initializer_token.empty()) {
    return Status::Error(
        "textual_inversion.initializer_token: required (a word the tokenizer makes one token of, "
        "whose embedding the new vectors start from, e.g. toy)");
  }
  if (vectors < 1) {
    return Errorf("textual_inversion.vectors: expected a count >= 1, found {}", vectors);
  }
  for (size_t i = 0; i < templates.size(); ++i) {
    const std::string& t = templates[i];
    const size_t at = t.find("{}");
    if (at == std::string::npos || t.find("{}", at + 2) != std::string::npos) {
      return Errorf(
          "textual_inversion.templates[{}]: '{}' should hold \"{{}}\" once, where the token goes",
          i, t);
    }
  }
  return Status::Ok();
}

nlohmann::json TextualInversionConfig::ToJson() const {
  return {{"token", token},
          {"initializer_token", initializer_token},
          {"vectors", vectors},
          {"text_encoder", text_encoder},
          {"templates", templates}};
}

Result<std::unique_ptr<TextualInversion>> TextualInversion::Create(
    const TextualInversionConfig& config, const std::string& encoder_path, int length,
    int skip_layers) {
  DT_RETURN_IF_ERROR(config.Validate());
  Result<TextEmbedder> loaded = TextEmbedder::Load(encoder_path);
  if (!loaded.ok()) return loaded.status().WithContext("textual_inversion.text_encoder");
  auto embedder = std::make_unique<TextEmbedder>(std::move(loaded).value());
  const TextEncoder& encoder = embedder->encoder();
  if (embedder->encoder_2() != nullptr || embedder->pooled_dim() > 0 ||
      encoder.config().kind != TextEncoderKind::kClip) {
    return Errorf(
        "textual_inversion.text_encoder '{}': textual inversion trains one CLIP text encoder's "
        "tokens (Stable Diffusion 1.x and 2.x); this is {}",
        encoder_path,
        embedder->encoder_2() != nullptr
            ? "SDXL's pair of encoders, whose tokens are not trained here"
            : encoder.config().Describe());
  }
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
  if (length > encoder.config().max_positions) {
    return Errorf(
        "textual_inversion: the model takes texts of {} tokens, more than the encoder "
        "'{}' takes ({})",
        length, encoder_path, encoder.config().max_positions);
  }
  if (skip_layers < 0 || skip_layers >= encoder.config().num_layers) {
    return Errorf("textual_inversion: cannot skip {} of the encoder's {} layers", skip_layers,
                  encoder.config().num_layers);
  }
  return std::unique_ptr<TextualInversion>(
      new TextualInversion(config, std::move(embedder), (*ids)[0], length, skip_layers));
}

TextualInversion::TextualInversion(TextualInversionConfig config,
                                   std::unique_ptr<TextEmbedder> embedder, int32_t first_id,
                                   int length, int skip_layers)
    : config_(std::move(config)),
      embedder_(std::move(embedder)),
      first_id_(first_id),
      length_(length),
      skip_layers_(skip_layers),
      dim_(embedder_->encoder().config().hidden_size),
      params_(size_t(config_.vectors) * dim_),
      grads_(params_.size()) {
  std::copy_n(embedder_->encoder().token_embeddings() + size_t(first_id_) * dim_, params_.size(),
              params_.begin());
  SetSlots(1);
}

void TextualInversion::SetSlots(int slots) {
  slots_.resize(slots);
  passes_.clear();
  for (int s = 0; s < slots; ++s)
    passes_.emplace_back(embedder_->encoder().config(), embedder_->encoder().weights());
}

std::string TextualInversion::Text(const std::string& caption, uint64_t pick) const {
  if (config_.templates.empty()) return caption;
  const std::string& t = config_.templates[pick % config_.templates.size()];
  const size_t at = t.find("{}");
  return t.substr(0, at) + config_.token + t.substr(at + 2);
}

text::Tokens TextualInversion::Tokenize(const std::string& text) const {
  return embedder_->tokenizer().Encode(embedder_->SpellInversions(text), length_);
}

Status TextualInversion::Encode(int slot, const std::vector<text::Tokens>& texts, float* context) {
  DT_CHECK(slot < static_cast<int>(slots_.size()), "slot {} of {}", slot, slots_.size());
  Slot& s = slots_[slot];
  s.texts = texts;
  s.inputs.resize(texts.size() * length_ * dim_);
  DT_RETURN_IF_ERROR(embedder_->encoder().InputEmbeddings(texts, s.inputs.data()));
  passes_[slot].Forward(s.inputs.data(), static_cast<int>(texts.size()), length_, skip_layers_,
                        /*final_norm=*/true, context);
  return Status::Ok();
}

void TextualInversion::Backward(int slot, const float* dcontext) {
  Slot& s = slots_[slot];
  s.dinputs.resize(s.inputs.size());
  passes_[slot].Backward(dcontext, s.dinputs.data());
  for (size_t n = 0; n < s.texts.size(); ++n) {
    for (int l = 0; l < length_; ++l) {
      const int32_t v = s.texts[n].ids[l] - first_id_;
      if (v < 0 || v >= config_.vectors) continue;
      const float* d = s.dinputs.data() + (n * length_ + l) * dim_;
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
