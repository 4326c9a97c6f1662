// The text encoder of a LoRA run that adapts it too (lora.train_text_encoder; diffusers'
// train_dreambooth_lora.py --train_text_encoder): a CLIP text model (Stable Diffusion 1.x and
// 2.x) whose target modules (lora.text_encoder_targets: q_proj, k_proj, v_proj, out_proj) the
// run's LoraAdapters adapt beside the model's (model/train/lora_adapters.h). Each sample's text
// is its caption (the data's text table; with a prior, the prior's), encoded with the adapted
// weights into the context the model cross-attends to; the backward pass through the encoder
// (ClipPass) gives the gradients of the adapted weights, from which the adapters' follow.
// Everything else of the encoder stays frozen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/io/safetensors.h"
#include "model/tensor/buffer.h"
#include "model/tensor/tensor_table.h"
#include "model/text/embedder.h"
#include "model/train/lora_adapters.h"
#include "model/train/text_training.h"

namespace difftrain {

// Fuses the text encoder adapters of LoRA checkpoint shard `shard` (trained with `config`; its
// EMA's where `ema`) into `encoder`, which must be the encoder they were trained on: each
// adapted weight becomes the shard's W0 + s·B·A (DoRA: scaled to its magnitudes).
Status FuseCheckpointTextLora(const io::SafetensorsFile& shard, const LoraConfig& config, bool ema,
                              TextEncoder& encoder);

class TextEncoderLora : public TextTraining {
 public:
  // The encoder at `encoder_path` (a pipeline's folder or its text_encoder/), for contexts of
  // `length` tokens after all but `skip_layers` layers (the data's table's clip skip). Errors
  // name what does not fit: not one CLIP encoder, targets that match none of its modules.
  static Result<std::unique_ptr<TextEncoderLora>> Create(const LoraConfig& config,
                                                         const std::string& encoder_path,
                                                         int length, int skip_layers);

  void SetSlots(int slots) override;
  std::string Text(const std::string& caption, uint64_t) const override { return caption; }
  text::Tokens Tokenize(const std::string& text) const override;
  Status Encode(int slot, const std::vector<text::Tokens>& texts, float* context) override;
  // The gradient of slot's context → the adapted weights' gradients (added into grads()).
  void Backward(int slot, const float* dcontext) override;

  // The encoder's weights, laid out as table(); the adapted ones are W0 + s·B·A
  // (LoraAdapters::Apply writes them).
  float* weights() { return embedder_->encoder().weights(); }
  const TensorTable& table() const { return table_; }
  // The adapted weights' gradients, laid out as table() (only theirs are ever written).
  const float* grads() const { return grads_.data(); }
  void ZeroGradients();
  const TextEmbedder& embedder() const { return *embedder_; }
  const EncoderPasses& passes() const { return passes_; }
  // The adapted weights' elements (their gradients' memory).
  size_t trained_elements() const;

 private:
  TextEncoderLora(std::unique_ptr<TextEmbedder> embedder, std::vector<std::string> trained,
                  int length, int skip_layers);

  std::unique_ptr<TextEmbedder> embedder_;
  TensorTable table_;
  std::vector<std::string> trained_;  // the adapted weights' names (M.weight)
  Buffer<float> grads_;
  EncoderPasses passes_;
};

}  // namespace difftrain
