#include "model/train/text_encoder_lora.h"

#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace difftrain {

Status FuseCheckpointTextLora(const io::SafetensorsFile& shard, const LoraConfig& config, bool ema,
                              TextEncoder& encoder) {
  Result<LoraAdapters> made = LoraAdapters::OfTextEncoder(config, encoder.tensors());
  if (!made.ok()) return made.status().WithContext(fmt::format("'{}'", shard.path()));
  LoraAdapters& adapters = *made;
  const std::string prefix = ema ? "ema.lora." : "lora.";
  for (const TensorSpec& t : adapters.table().tensors())
    DT_RETURN_IF_ERROR(shard.CopyF32(prefix + t.name, t.shape, adapters.params() + t.offset));
  for (const LoraModule& m : adapters.modules()) {
    DT_RETURN_IF_ERROR(
        shard.CopyF32("lora.base." + m.name + ".weight", m.shape, encoder.weights() + m.weight));
  }
  adapters.SetBase(nullptr, encoder.weights());
  adapters.Apply(adapters.params(), nullptr, encoder.weights());
  return Status::Ok();
}

Result<std::unique_ptr<TextEncoderLora>> TextEncoderLora::Create(const LoraConfig& config,
                                                                 const std::string& encoder_path,
                                                                 int length, int skip_layers) {
  Result<TextEmbedder> loaded = TextEmbedder::Load(encoder_path);
  if (!loaded.ok()) return loaded.status().WithContext("lora.text_encoder");
  auto embedder = std::make_unique<TextEmbedder>(std::move(loaded).value());
  DT_RETURN_IF_ERROR(CheckTrainedEncoder(*embedder, encoder_path, length, skip_layers,
                                         "lora.text_encoder",
                                         "lora.train_text_encoder adapts one CLIP text encoder"));
  const TensorTable table = TextEncoder::Tensors(embedder->encoder().config());
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, TextLoraModulesOf(config, table));
  std::vector<std::string> trained;
  const size_t prefix = std::string(kLoraTextPrefix).size();
  for (const LoraModule& m : modules) {
    const std::string weight = m.name.substr(prefix) + ".weight";
    // ClipPass computes the attention's and the MLP's Linear weights' gradients.
    if (weight.find(".self_attn.") == std::string::npos &&
        weight.find(".mlp.") == std::string::npos) {
      return Errorf(
          "lora.text_encoder_targets: {} is not a Linear layer of the encoder's attention or MLP "
          "(q_proj, k_proj, v_proj, out_proj, fc1, fc2), which are what is adapted here",
          m.name.substr(prefix));
    }
    trained.push_back(weight);
  }
  return std::unique_ptr<TextEncoderLora>(
      new TextEncoderLora(std::move(embedder), std::move(trained), length, skip_layers));
}

TextEncoderLora::TextEncoderLora(std::unique_ptr<TextEmbedder> embedder,
                                 std::vector<std::string> trained, int length, int skip_layers)
    : embedder_(std::move(embedder)),
      table_(TextEncoder::Tensors(embedder_->encoder().config())),
      trained_(std::move(trained)),
      grads_(table_.total(), BufferPages::kOnFirstTouch),
      passes_(embedder_->encoder(), length, skip_layers) {
  SetSlots(1);
}

void TextEncoderLora::SetSlots(int slots) {
  passes_.SetSlots(slots, grads_.data(), trained_);
}

text::Tokens TextEncoderLora::Tokenize(const std::string& text) const {
  return embedder_->tokenizer().Encode(text, passes_.length());
}

Status TextEncoderLora::Encode(int slot, const std::vector<text::Tokens>& texts, float* context) {
  return passes_.Encode(slot, texts, context);
}

void TextEncoderLora::Backward(int slot, const float* dcontext) {
  passes_.Backward(slot, dcontext);
}

void TextEncoderLora::ZeroGradients() {
  for (const std::string& name : trained_) {
    const TensorSpec* t = table_.Find(name);
    std::memset(grads_.data() + t->offset, 0, t->numel * sizeof(float));
  }
}

size_t TextEncoderLora::trained_elements() const {
  size_t n = 0;
  for (const std::string& name : trained_)
    n += table_.Find(name)->numel;
  return n;
}

}  // namespace difftrain
