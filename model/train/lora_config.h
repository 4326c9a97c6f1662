// A LoRA's settings (the job's `lora` section) and the modules they adapt: what the job
// parser, the planner and a checkpoint's metadata need, without the adapters' training
// (model/train/lora_adapters.h).
//
// Modules are matched as peft's target_modules match them: a module (a tensor name `M.weight`
// of two or more dimensions, M the module) is adapted when M is a target or ends with
// "." + a target (`to_q` adapts every attention's query projection; `attn1.to_q` the
// self-attention's only). Biases and everything else stay frozen (peft's bias="none").
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
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

}  // namespace difftrain
