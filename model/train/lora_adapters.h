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
// Modules are matched as peft's target_modules match them: a module (a tensor name `M.weight`
// of two or more dimensions, M the module) is adapted when M is a target or ends with
// "." + a target (`to_q` adapts every attention's query projection; `attn1.to_q` the
// self-attention's only). Biases and everything else stay frozen (peft's bias="none").
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

namespace difftrain {

struct LoraConfig {
  int rank = 0;      // r; 0: no LoRA (every weight trains)
  double alpha = 0;  // lora_alpha; 0: the rank (a scale of 1, diffusers' scripts' choice)
  // diffusers' train_text_to_image_lora.py's target_modules: the attention projections.
  std::vector<std::string> targets = {"to_q", "to_k", "to_v", "to_out.0"};
  bool use_dora = false;    // peft's use_dora: a trained magnitude per output row
  bool use_rslora = false;  // peft's use_rslora: the scale alpha / √rank (Kalajdzievski 2023)
  // train_dreambooth_lora.py's --train_text_encoder: adapters of the text encoder's modules
  // text_encoder_targets too; the encoder is `text_encoder` (a pipeline's folder or its
  // text_encoder/), "" the one the data's text table records.
  bool train_text_encoder = false;
  std::vector<std::string> text_encoder_targets = {"q_proj", "k_proj", "v_proj", "out_proj"};
  std::string text_encoder;

  bool enabled() const { return rank > 0; }
  // alpha / rank; with use_rslora alpha / √rank.
  double scale() const {
    return (alpha > 0 ? alpha : rank) / (use_rslora ? std::sqrt(double(rank)) : rank);
  }
  Status Validate() const;
  nlohmann::json ToJson() const;
  // ToJson's (a checkpoint's "lora" metadata); an error naming what is malformed.
  static Result<LoraConfig> FromJson(const nlohmann::json& json);
};

// The prefix of the text encoder's modules in the adapters' table (kLoraTextEncoder's).
inline constexpr char kLoraTextPrefix[] = "text_encoder.";

// One adapted module.
struct LoraModule {
  std::string name;  // M: its weight is M.weight (the text encoder's: kLoraTextPrefix + M)
  int part = 0;      // 0: the model's; 1: the text encoder's
  std::vector<int64_t> shape;  // the weight's
  size_t weight = 0;           // the weight's offset in the model's arena
  int64_t out = 0, in = 0;     // the weight as [out, in] (in: everything after the first axis)
  size_t a = 0, b = 0;         // A's and B's offsets in the adapters' arena
  size_t magnitude = 0;        // DoRA's m [out] in the adapters' arena (use_dora only)
  size_t base = 0;             // W0's offset in the frozen copy
};

// The modules of `table` (a model's parameters) that `config.targets` adapt, in table order. An
// error when none matches, naming the targets and a few of the model's modules.
Result<std::vector<LoraModule>> LoraModulesOf(const LoraConfig& config, const TensorTable& table);
// The same for the text encoder of parameter table `table`: config.text_encoder_targets, the
// modules part 1 and named with kLoraTextPrefix.
Result<std::vector<LoraModule>> TextLoraModulesOf(const LoraConfig& config,
                                                  const TensorTable& table);

// The elements a LoRA run keeps beside the model's arenas: its adapters (every module's A and B)
// and the frozen copy of the adapted weights.
struct LoraElements {
  size_t adapters = 0, frozen = 0;  // the adapters'; the adapted weights' (frozen copies)
  size_t vectors = 0;               // the table's tensors of under two dimensions
};
Result<LoraElements> CountLoraElements(const LoraConfig& config, const TensorTable& table);
// The same for the text encoder's targets (TextLoraModulesOf) in `text_table`, the encoder's
// parameters (config.train_text_encoder).
Result<LoraElements> CountTextLoraElements(const LoraConfig& config, const TensorTable& text_table);

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
