// The text encoder a run trains through, the model's context made from each sample's text
// during training rather than read from the data: a textual inversion's new tokens
// (model/train/textual_inversion.h) or a LoRA of the encoder's weights
// (model/train/text_encoder_lora.h). Each micro-batch's texts are tokenized and encoded into the
// model's context before the model's forward; after its backward the context's gradient is
// carried back through the encoder (Model::SetContextGradient gives it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/text/clip_pass.h"
#include "model/text/embedder.h"
#include "model/text/encoder.h"
#include "model/text/tokenizer.h"
#include "model/train/lora_adapters.h"

namespace difftrain {

class TextTraining {
 public:
  virtual ~TextTraining() = default;
  // Micro-batches in flight (Encode's slots); 1 at first.
  virtual void SetSlots(int slots) = 0;
  // The text of a sample whose caption is `caption` (`pick`: a draw of its own, for a choice
  // among prompt templates).
  virtual std::string Text(const std::string& caption, uint64_t pick) const = 0;
  // `text` as the encoder's tokens. Throws std::invalid_argument for text it cannot tokenize.
  virtual text::Tokens Tokenize(const std::string& text) const = 0;
  // Encodes micro-batch `slot`'s texts into context [B, length, D], keeping what Backward reads.
  virtual Status Encode(int slot, const std::vector<text::Tokens>& texts, float* context) = 0;
  // The gradient of slot's context, dcontext [B, length, D], into the trained gradients (added).
  virtual void Backward(int slot, const float* dcontext) = 0;
};

// Whether `embedder` (loaded from `path`, the job's setting `setting`) is what a run trains
// through: one CLIP text encoder (Stable Diffusion 1.x and 2.x; not SDXL's pair) that takes
// texts of `length` tokens and has more than `skip_layers` layers. `trains` says what the run
// trains, for the messages ("textual inversion trains one CLIP text encoder's tokens").
Status CheckTrainedEncoder(const TextEmbedder& embedder, const std::string& path, int length,
                           int skip_layers, const std::string& setting, const std::string& trains);

// The CLIP passes of a TextTraining: one ClipPass per micro-batch in flight over `encoder`'s
// weights, texts of `length` tokens after all but `skip_layers` layers, through the final
// LayerNorm (what the data's text table holds: TextEncoder::Encode).
// What training through a CLIP text encoder of `config` holds in host memory beside the model's
// arenas (PlanMemory adds it to a rank's), the text encoder's counterpart of MemoryBytes:
struct TextEncoderMemory {
  size_t weights = 0;  // the encoder's weights, with a textual inversion's `new_tokens` rows
  // lora.train_text_encoder: the adapted weights' gradients and frozen copies; the encoder's
  // adapters' parameters, gradients, AdamW moments and EMA.
  size_t lora = 0;
  // What each micro-batch in flight keeps from its forward to its backward (EncoderPassBytes)
  // with its context's gradient, and one backward's temporaries.
  size_t activations = 0;
  size_t total() const { return weights + lora + activations; }
};
// The bytes one micro-batch of `texts` texts of `length` tokens keeps through all but
// `skip_layers` layers (EncoderPasses::HeldBytes after its backward): per layer the stream in
// and after the attention, q, k, v, the attention's probabilities, fc1's output and the
// LayerNorms' statistics, with `weight_gradients` (a LoRA) the Linear layers' inputs too; the
// last stream, the final LayerNorm's statistics and the backward's scratch; the input embeddings
// and their gradient.
size_t EncoderPassBytes(const TextEncoderConfig& config, int texts, int length, int skip_layers,
                        bool weight_gradients);
// A run's: `lora` null for a textual inversion of `new_tokens` vectors, else the LoRA that
// adapts the encoder; `slots` micro-batches of `micro_batch` texts in flight. Errors: LoRA
// targets that match none of the encoder's modules.
Result<TextEncoderMemory> PlanTextEncoderMemory(const TextEncoderConfig& config,
                                                const LoraConfig* lora, int new_tokens,
                                                int micro_batch, int slots, int length,
                                                int skip_layers);

class EncoderPasses {
 public:
  EncoderPasses(TextEncoder& encoder, int length, int skip_layers);
  // `slots` passes; each adds the gradients of the Linear weights `weights` into `grads` (laid
  // out as the encoder's weights; ClipPass::SetWeightGradients), none when empty.
  void SetSlots(int slots, float* grads = nullptr, const std::vector<std::string>& weights = {});
  Status Encode(int slot, const std::vector<text::Tokens>& texts, float* context);
  // The gradient of slot's input embeddings [B, length, D] from its context's (and the weights'
  // gradients SetSlots asked for, added).
  const std::vector<float>& Backward(int slot, const float* dcontext);
  // The texts slot's last Encode took.
  const std::vector<text::Tokens>& texts(int slot) const { return slots_[slot].texts; }
  int length() const { return length_; }
  int dim() const { return dim_; }
  // The bytes slot `slot` keeps: its inputs, their gradient and its ClipPass's.
  size_t HeldBytes(int slot) const;

 private:
  TextEncoder& encoder_;
  int length_, skip_layers_, dim_;
  struct Slot {
    std::vector<text::Tokens> texts;
    std::vector<float> inputs, dinputs;
  };
  std::vector<Slot> slots_;
  std::vector<ClipPass<float>> passes_;  // one per slot
};

}  // namespace difftrain
