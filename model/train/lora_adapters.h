// LoRA training (Hu et al. 2021), as diffusers' train_text_to_image_lora.py sets peft up:
// the weights of the modules `lora.targets` names stay frozen at W0 and the model computes with
//   W = W0 + (alpha / rank) · B·A,     A [rank, in], B [out, rank]   (model/cpu/low_rank.h),
// A and B the only parameters trained. A is drawn as peft's init_lora_weights="gaussian" draws
// it, N(0, (1/rank)²), and B is zero, so training starts at W0 exactly.
//
// The family's own forward and backward run unchanged on the model's weights W (any family,
// any module: a Linear's [out, in] weight, a convolution's as [out, in·kh·kw]); the adapters'
// gradients follow from the model's gradient of each W by the chain rule. The AdamW moments,
// gradient clipping, the EMA and the data-parallel gradient average are the adapters' only,
// and the model is asked to skip its frozen weights' gradients (Model::SkipGradients; the
// UNet skips its convolutions' and Linear layers', DiT and Latte their Linear layers' and label
// embedding's): that is
// what a LoRA saves over a fine-tune of the whole model (docs/finetuning.md).
//
// With use_dora (DoRA, Liu et al. 2024; peft's use_dora) each module also trains a magnitude m
// [out], and W = (m / ‖V‖) ⊙ V with V = W0 + (alpha / rank) · B·A, the norm of each output row
// (model/cpu/low_rank.h); m starts at ‖W0‖'s rows, as peft's dora_init sets it, so training
// still starts at W0. The model's gradient of W gives m's, A's and B's with the norm held
// constant, as peft detaches it.
//
// With train_text_encoder the text encoder that makes the model's context is adapted too, as
// diffusers' train_dreambooth_lora.py does with --train_text_encoder: its modules
// `text_encoder_targets` (the CLIP attention's q_proj, k_proj, v_proj, out_proj) get adapters
// of the same rank and alpha, named text_encoder.M (M the module's transformers name, the
// prefix diffusers' LoRA files give the text encoder's part), in the same arena after the
// model's: one optimizer, one gradient norm, one EMA over both (the script's
// params_to_optimize).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/tensor/buffer.h"
#include "model/tensor/tensor_table.h"
#include "model/train/lora_config.h"

namespace difftrain {

class LoraAdapters {
 public:
  // The adapters of `table`'s target modules (LoraModulesOf), zero; with `text_table` (the text
  // encoder's parameters; config.train_text_encoder) its targets' (TextLoraModulesOf) after them.
  static Result<LoraAdapters> Create(const LoraConfig& config, const TensorTable& table,
                                     const TensorTable* text_table = nullptr);
  // The text encoder's adapters alone (config.train_text_encoder), as Create lays them out after
  // the model's: what sampling a checkpoint fuses into its text encoder.
  static Result<LoraAdapters> OfTextEncoder(const LoraConfig& config,
                                            const TensorTable& text_table);

  // A from Rng(seed, kLora, module) as N(0, (1/rank)²), B zero (peft's "gaussian"); DoRA's
  // magnitudes the norms of W0's rows (peft's dora_init). After SetBase.
  void Initialize(uint64_t seed);
  // A as above and B drawn too, N(0, 1/out); DoRA's magnitudes the norms of W0 + s·B·A's rows,
  // each times 1 + N(0, 0.1²): a debug dump's, whose A (and the magnitudes' scaling of V's
  // gradient) would otherwise not show in the gradients. After SetBase.
  void InitializeRandom(uint64_t seed);

  // The adapters' arena: every module's A then B (then DoRA's magnitude), module after
  // module, and its gradients.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  size_t size() const { return params_.size(); }
  // The arena's tensors: M.lora_A.weight [rank, in…], M.lora_B.weight [out, rank(, 1, 1)]
  // (peft's names and shapes; a convolution's A has the kernel's shape, B is 1×1).
  const TensorTable& table() const { return table_; }
  const std::vector<LoraModule>& modules() const { return modules_; }
  const LoraConfig& config() const { return config_; }
  double scale() const { return config_.scale(); }

  // Keeps the target weights of `model_params` (and of the text encoder's, `text_params`; null:
  // its W0 stay as they are) as the frozen W0.
  void SetBase(const float* model_params, const float* text_params = nullptr);
  // DoRA: each module's magnitudes set to the norms of the rows of W0 + s·B·A at params(), so
  // that W is W0 + s·B·A (peft's dora_init); nothing without DoRA. Initialize does this; after
  // a new SetBase (pretrained weights) it is to be done again.
  void SetMagnitudesToNorms();
  // W0 of every module, one after the other (LoraModule::base).
  const float* base() const { return base_.data(); }
  float* base() { return base_.data(); }
  size_t base_size() const { return base_.size(); }
  // Writes each target's W0 + s·B·A (DoRA: scaled to its magnitudes) into `model_params` (the
  // text encoder's into `text_params`; null: they are not written), with A and B from `adapters`
  // (an arena laid out as params(): the trained adapters or their EMA).
  void Apply(const float* adapters, float* model_params, float* text_params = nullptr) const;
  // The model's adapted weights (not the text encoder's) written into `out`, laid out as base()
  // (model_base_size() elements: each target at its frozen copy's place): the adapted weights
  // alone, without a copy of the whole model.
  void ApplyToBase(const float* adapters, float* out) const;
  // The elements of base() that hold the model's targets (the text encoder's follow them).
  size_t model_base_size() const;
  // The adapters' gradients (grads(), overwritten) from the model's gradients of each W (and the
  // text encoder's, `text_grads`, given exactly when it is adapted).
  void Gradients(const float* model_grads, const float* text_grads = nullptr);
  // Whether the text encoder is adapted (config().train_text_encoder).
  bool adapts_text_encoder() const { return config_.train_text_encoder; }

 private:
  // The adapters of `modules`, zero.
  // Target m's W0 + s·B·A (DoRA: scaled) with the adapters of `adapters`, into w [out, in].
  void Fuse(const LoraModule& m, const float* adapters, float* w) const;
  static LoraAdapters Make(const LoraConfig& config, std::vector<LoraModule> modules);

  LoraConfig config_;
  std::vector<LoraModule> modules_;
  TensorTable table_;
  Buffer<float> params_, grads_, base_;
};

}  // namespace difftrain
