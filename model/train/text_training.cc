#include "model/train/text_training.h"

#include <fmt/format.h>

#include "common/check.h"

namespace difftrain {

Status CheckTrainedEncoder(const TextEmbedder& embedder, const std::string& path, int length,
                           int skip_layers, const std::string& setting, const std::string& trains) {
  const TextEncoderConfig& c = embedder.encoder().config();
  if (embedder.encoder_2() != nullptr || embedder.pooled_dim() > 0 ||
      c.kind != TextEncoderKind::kClip) {
    return Errorf("{} '{}': {} (Stable Diffusion 1.x and 2.x); this is {}", setting, path, trains,
                  embedder.encoder_2() != nullptr
                      ? "SDXL's pair of encoders, which are not trained here"
                      : c.Describe());
  }
  if (length > c.max_positions) {
    return Errorf("{} '{}': the model takes texts of {} tokens, more than the encoder takes ({})",
                  setting, path, length, c.max_positions);
  }
  if (skip_layers < 0 || skip_layers >= c.num_layers) {
    return Errorf("{} '{}': cannot skip {} of the encoder's {} layers", setting, path, skip_layers,
                  c.num_layers);
  }
  return Status::Ok();
}

EncoderPasses::EncoderPasses(TextEncoder& encoder, int length, int skip_layers)
    : encoder_(encoder),
      length_(length),
      skip_layers_(skip_layers),
      dim_(encoder.config().hidden_size) {
  SetSlots(1);
}

void EncoderPasses::SetSlots(int slots, float* grads, const std::vector<std::string>& weights) {
  slots_.resize(slots);
  passes_.clear();
  for (int s = 0; s < slots; ++s) {
    passes_.emplace_back(encoder_.config(), encoder_.weights());
    passes_.back().SetWeightGradients(grads, weights);
  }
}

Status EncoderPasses::Encode(int slot, const std::vector<text::Tokens>& texts, float* context) {
  DT_CHECK(slot < static_cast<int>(slots_.size()), "slot {} of {}", slot, slots_.size());
  Slot& s = slots_[slot];
  s.texts = texts;
  s.inputs.resize(texts.size() * length_ * dim_);
  DT_RETURN_IF_ERROR(encoder_.InputEmbeddings(texts, s.inputs.data()));
  passes_[slot].Forward(s.inputs.data(), static_cast<int>(texts.size()), length_, skip_layers_,
                        /*final_norm=*/true, context);
  return Status::Ok();
}

const std::vector<float>& EncoderPasses::Backward(int slot, const float* dcontext) {
  Slot& s = slots_[slot];
  s.dinputs.resize(s.inputs.size());
  passes_[slot].Backward(dcontext, s.dinputs.data());
  return s.dinputs;
}

}  // namespace difftrain
