// The Trainer's textual inversion (model/train/trainer.h, model/train/textual_inversion.h):
// opening its token and text encoder against the job's data, encoding each micro-batch's texts
// into the model's context before its forward, and carrying the context's gradient through the
// encoder after its backward.
#include "model/train/trainer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace difftrain {

Result<std::unique_ptr<TextualInversion>> Trainer::OpenTextualInversion(const TrainConfig& config,
                                                                        const Dataset& data) {
  const TextualInversionConfig& c = config.textual_inversion;
  const SampleSchema m = FamilyOf(config.model).Samples(config.model);
  const TextTable* table = data.texts();
  std::string encoder = c.text_encoder;
  if (encoder.empty() && table != nullptr) encoder = table->text_encoder;
  if (encoder.empty()) {
    return Status::Error(
        "textual_inversion.text_encoder: required: the data's text table records no text encoder "
        "(a Stable Diffusion pipeline's folder, or data pack --text-encoder)");
  }
  if (c.templates.empty()) {
    // The data's captions are the texts: they must name the token.
    if (table == nullptr) {
      return Errorf(
          "textual_inversion: the data ({}) carry no captions; give textual_inversion.templates "
          "(\"a photo of a {{}}\", …) or pack captions that name {} (data pack --text-encoder)",
          config.data.path.empty() ? config.data.kind : config.data.path, c.token);
    }
    int64_t naming = 0;
    for (const std::string& caption : table->captions)
      naming += caption.find(c.token) != std::string::npos;
    if (naming == 0) {
      return Errorf(
          "textual_inversion.token: none of the data's {} captions names '{}' (e.g. \"{}\"), so "
          "it would learn nothing; caption the pictures with it, or give "
          "textual_inversion.templates",
          table->size(), c.token, table->captions.empty() ? "" : table->captions[0]);
    }
    spdlog::info("textual inversion: {} of the data's {} captions name {}", naming, table->size(),
                 c.token);
  }
  Result<std::unique_ptr<TextualInversion>> made = TextualInversion::Create(
      c, encoder, m.context_length, table != nullptr ? table->skip_layers : 0);
  if (!made.ok()) return made.status();
  if ((*made)->dim() != m.context_dim) {
    return Errorf(
        "textual_inversion.text_encoder '{}' embeds tokens of {} features; the model takes {} "
        "(cross_attention_dim)",
        encoder, (*made)->dim(), m.context_dim);
  }
  spdlog::info("textual inversion: {} ({} vector{} of {}) from '{}', encoded by '{}'", c.token,
               c.vectors, c.vectors == 1 ? "" : "s", m.context_dim, c.initializer_token, encoder);
  return made;
}

Status Trainer::EncodeTexts(int slot, MicroBatch& batch) {
  if (!inversion_) return Status::Ok();
  DT_RETURN_IF_ERROR(inversion_->Encode(slot, batch.texts, batch.context.data()));
  const size_t text = size_t(schema_.context_length) * schema_.context_dim;
  for (int b = 0; b < batch.size; ++b) {
    if (batch.text_dropped[b]) std::fill_n(batch.context.data() + b * text, text, 0.0f);
  }
  return Status::Ok();
}

Status Trainer::BackwardWithTexts(int slot, const float* output_grad, float* input_grad,
                                  const Model::GradientsReady& ready) {
  if (!inversion_) return model_->Backward(slot, output_grad, input_grad, ready);
  const MicroBatch& batch = batches_[slot];
  std::vector<float>& dcontext = dcontexts_[slot];
  dcontext.assign(batch.context.size(), 0.0f);
  DT_RETURN_IF_ERROR(model_->SetContextGradient(slot, dcontext.data()));
  const Status backward = model_->Backward(slot, output_grad, input_grad, ready);
  DT_RETURN_IF_ERROR(model_->SetContextGradient(slot, nullptr));
  DT_RETURN_IF_ERROR(backward);
  // A dropped text's context was zeros, not the encoder's: no gradient reaches the encoder.
  const size_t text = size_t(schema_.context_length) * schema_.context_dim;
  for (int b = 0; b < batch.size; ++b) {
    if (batch.text_dropped[b]) std::fill_n(dcontext.data() + b * text, text, 0.0f);
  }
  inversion_->Backward(slot, dcontext.data());
  return Status::Ok();
}

}  // namespace difftrain
