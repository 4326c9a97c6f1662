// The Trainer's text encoder, where it trains through one (model/train/trainer.h,
// model/train/text_training.h: a textual inversion, a LoRA of the encoder): opening it against
// the job's data, encoding each micro-batch's texts into the model's context before its
// forward, and carrying the context's gradient through the encoder after its backward.
#include "model/train/trainer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace difftrain {

namespace {

// The text encoder of setting `setting` (`given`), else the one the data's text table records.
Result<std::string> TrainedEncoderPath(const std::string& given, const Dataset& data,
                                       const std::string& setting) {
  if (!given.empty()) return given;
  const TextTable* table = data.texts();
  if (table != nullptr && !table->text_encoder.empty()) return table->text_encoder;
  return Errorf(
      "{}: required: the data's text table records no text encoder (a Stable Diffusion "
      "pipeline's folder, or data pack --text-encoder)",
      setting);
}

// A textual inversion's texts are the data's captions unless templates make them: they must
// name the token.
Status CheckCaptionsNameTheToken(const TrainConfig& config, const Dataset& data) {
  const TextualInversionConfig& c = config.textual_inversion;
  if (!c.templates.empty()) return Status::Ok();
  const TextTable* table = data.texts();
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
  return Status::Ok();
}

}  // namespace

std::optional<TrainedEncoder> Trainer::TrainedTextEncoder(const TrainConfig& config,
                                                          std::string* why) {
  const auto none = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  const bool inversion = config.textual_inversion.enabled();
  if (!inversion && !(config.lora.enabled() && config.lora.train_text_encoder))
    return none("the run trains through no text encoder");
  const std::string& given =
      inversion ? config.textual_inversion.text_encoder : config.lora.text_encoder;
  const char* setting = inversion ? "textual_inversion.text_encoder" : "lora.text_encoder";
  TrainedEncoder encoder;
  // The data's text table: its clip skip, and the encoder where the job names none.
  const SampleSchema m = FamilyOf(config.model).Samples(config.model);
  Result<std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>>> opened =
      OpenData(config, m, /*announce=*/false);
  if (opened.ok()) {
    Result<std::string> path = TrainedEncoderPath(given, *opened->first, setting);
    if (!path.ok()) return none(std::string(path.status().message()));
    encoder.path = *path;
    if (const TextTable* table = opened->first->texts()) encoder.skip_layers = table->skip_layers;
  } else if (!given.empty()) {
    encoder.path = given;
  } else {
    return none(fmt::format("{} is the data's, which are not readable here", setting));
  }
  Result<TextEncoderConfig> read = TextEncoder::ReadConfig(encoder.path);
  if (!read.ok()) return none(std::string(read.status().message()));
  encoder.config = *read;
  return encoder;
}

Result<std::unique_ptr<TextTraining>> Trainer::OpenTextTraining(const TrainConfig& config,
                                                                const Dataset& data) {
  const SampleSchema m = FamilyOf(config.model).Samples(config.model);
  const TextTable* table = data.texts();
  const int skip_layers = table != nullptr ? table->skip_layers : 0;
  std::unique_ptr<TextTraining> made;
  int dim = 0;
  std::string encoder;
  if (config.textual_inversion.enabled()) {
    const TextualInversionConfig& c = config.textual_inversion;
    DT_ASSIGN_OR_RETURN(encoder,
                        TrainedEncoderPath(c.text_encoder, data, "textual_inversion.text_encoder"));
    DT_RETURN_IF_ERROR(CheckCaptionsNameTheToken(config, data));
    DT_ASSIGN_OR_RETURN(auto inversion,
                        TextualInversion::Create(c, encoder, m.context_length, skip_layers));
    dim = inversion->dim();
    spdlog::info("textual inversion: {} ({} vector{} of {}) from '{}', encoded by '{}'", c.token,
                 c.vectors, c.vectors == 1 ? "" : "s", m.context_dim, c.initializer_token, encoder);
    made = std::move(inversion);
  } else if (config.lora.enabled() && config.lora.train_text_encoder) {
    DT_ASSIGN_OR_RETURN(encoder,
                        TrainedEncoderPath(config.lora.text_encoder, data, "lora.text_encoder"));
    if (table == nullptr) {
      return Errorf(
          "lora.train_text_encoder: the data ({}) carry no captions for the text encoder to "
          "encode (data pack --text-encoder)",
          config.data.path.empty() ? config.data.kind : config.data.path);
    }
    DT_ASSIGN_OR_RETURN(
        auto lora, TextEncoderLora::Create(config.lora, encoder, m.context_length, skip_layers));
    dim = lora->embedder().encoder().config().hidden_size;
    spdlog::info("lora: the text encoder '{}' is adapted too ({} of its elements)", encoder,
                 lora->trained_elements());
    made = std::move(lora);
  } else {
    return std::unique_ptr<TextTraining>();
  }
  if (dim != m.context_dim) {
    return Errorf(
        "{} '{}' embeds tokens of {} features; the model takes {} (cross_attention_dim)",
        config.textual_inversion.enabled() ? "textual_inversion.text_encoder" : "lora.text_encoder",
        encoder, dim, m.context_dim);
  }
  return made;
}

Status Trainer::EncodeTexts(int slot, MicroBatch& batch) {
  if (!texts_) return Status::Ok();
  DT_RETURN_IF_ERROR(texts_->Encode(slot, batch.texts, batch.context.data()));
  const size_t text = size_t(schema_.context_length) * schema_.context_dim;
  for (int b = 0; b < batch.size; ++b) {
    if (batch.text_dropped[b]) std::fill_n(batch.context.data() + b * text, text, 0.0f);
  }
  return Status::Ok();
}

Status Trainer::BackwardWithTexts(int slot, const float* output_grad, float* input_grad,
                                  const Model::GradientsReady& ready) {
  if (!texts_) return model_->Backward(slot, output_grad, input_grad, ready);
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
  texts_->Backward(slot, dcontext.data());
  return Status::Ok();
}

}  // namespace difftrain
