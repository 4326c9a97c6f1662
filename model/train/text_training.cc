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

size_t EncoderPasses::HeldBytes(int slot) const {
  const Slot& s = slots_[slot];
  return (s.inputs.capacity() + s.dinputs.capacity()) * sizeof(float) + passes_[slot].HeldBytes();
}

size_t EncoderPassBytes(const TextEncoderConfig& c, int texts, int length, int skip_layers,
                        bool weight_gradients) {
  const size_t rows = size_t(texts) * length, RD = rows * c.hidden_size;
  const size_t layer = (weight_gradients ? 8 : 5) * RD + 4 * rows +
                       size_t(texts) * c.num_heads * length * length + rows * c.intermediate_size;
  const size_t layers = size_t(c.num_layers - skip_layers);
  // The layers'; the last stream, the final LayerNorm's statistics, the backward's scratch; the
  // inputs and their gradient.
  return sizeof(float) * (layers * layer + RD + 2 * rows + RD + 2 * RD);
}

Result<TextEncoderMemory> PlanTextEncoderMemory(const TextEncoderConfig& c, const LoraConfig* lora,
                                                int new_tokens, int micro_batch, int slots,
                                                int length, int skip_layers) {
  TextEncoderMemory m;
  const TensorTable table = TextEncoder::Tensors(c);
  m.weights = sizeof(float) * (table.total() + size_t(new_tokens) * c.hidden_size);
  bool fc2 = false;  // ClipPass's backward makes fc2's input where fc2's weight is adapted
  if (lora != nullptr) {
    DT_ASSIGN_OR_RETURN(const LoraElements e, CountTextLoraElements(*lora, table));
    // The adapted weights' gradients (TextEncoderLora::grads: only theirs are touched) and
    // frozen copies; the adapters' parameters, gradients, two moments and EMA.
    m.lora = sizeof(float) * (2 * e.frozen + 5 * e.adapters);
    DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, TextLoraModulesOf(*lora, table));
    for (const LoraModule& module : modules)
      fc2 = fc2 || module.name.ends_with(".mlp.fc2");
  }
  const size_t rows = size_t(micro_batch) * length, RD = rows * c.hidden_size;
  const size_t F = rows * c.intermediate_size;
  // Each slot's passes and its context's gradient (Trainer::BackwardWithTexts); the backward's
  // temporaries: the MLP's gradient, fc2's input where its weight is adapted, four [rows, D].
  m.activations =
      size_t(slots) * (EncoderPassBytes(c, micro_batch, length, skip_layers, lora != nullptr) +
                       sizeof(float) * RD) +
      sizeof(float) * ((fc2 ? 2 : 1) * F + 4 * RD);
  return m;
}

const std::vector<float>& EncoderPasses::Backward(int slot, const float* dcontext) {
  Slot& s = slots_[slot];
  s.dinputs.resize(s.inputs.size());
  passes_[slot].Backward(dcontext, s.dinputs.data());
  return s.dinputs;
}

}  // namespace difftrain
