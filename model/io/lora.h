// LoRA weights (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models") fused into a
// model's parameters, as diffusers' fuse_lora does: for each module the file adapts,
//   W += scale · (alpha / rank) · up · down,
// with down [rank, in] and up [out, rank] for a Linear, and down [rank, in, kh, kw] and
// up [out, rank, 1, 1] for a convolution (kohya's LoCon), the product taken over the flattened
// in × kh × kw. alpha is the file's (kohya's `.alpha`); without one it is the rank (a factor 1).
// The product is added in float32 on BLAS, as peft's merge adds it. A module with DoRA's
// magnitude m (peft's lora_magnitude_vector, one per output row) becomes
//   W = m / ‖W0 + scale · (alpha / rank) · up · down‖ ⊙ (W0 + scale · (alpha / rank) · up · down),
// the norm of each output row (model/cpu/low_rank.h), as peft merges a DoRA layer.
//
// A file adapts components, each named by its keys' prefix: the UNet (unet., kohya's
// lora_unet_; keys without a prefix are the UNet's too) and the text encoder (text_encoder.,
// kohya's lora_te_ and lora_te1_; SDXL's second one, text_encoder_2. and lora_te2_, is never a
// target). The key forms diffusers' loaders read (MODULE: the module's name in its component's
// parameter table, whose weight is MODULE.weight: diffusers' and transformers' state-dict names):
//   peft (diffusers' save_lora_weights)  unet.MODULE.lora_A.weight, unet.MODULE.lora_B.weight,
//                                        and DoRA's unet.MODULE.lora_magnitude_vector
//   diffusers' older LoRA layers         unet.MODULE.lora.down.weight, ….lora.up.weight (or
//                                        lora_linear_layer.), MODULE.alpha
//   attention processors'                unet.….attn1.processor.to_q_lora.down.weight, … (to_q,
//                                        to_k, to_v; to_out_lora is to_out.0); the text
//                                        encoder's ….self_attn.to_q_lora.down.weight (q_proj …,
//                                        to_out_lora is out_proj)
//   kohya (sd-scripts, A1111)            lora_unet_MODULE_WITH_UNDERSCORES.lora_down.weight,
//                                        ….lora_up.weight, ….alpha (lora_te_… likewise)
// A kohya name is matched against the table's module names with '.' read as '_', so it needs
// diffusers' block layout (SD 1.x/2.x LoRAs have it; SDXL's original-layout input_blocks names
// do not match and are refused by name).
//
// Refused, naming the key: a component that is neither a target nor skipped (fused by another
// call), a key of none of these forms, a module the table lacks, a down without its up (or the
// reverse), shapes that do not multiply to the weight's, a non-finite scale.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/tensor/tensor_table.h"

namespace difftrain::io {

inline constexpr const char* kLoraUNet = "unet";
inline constexpr const char* kLoraTextEncoder = "text_encoder";
inline constexpr const char* kLoraTextEncoder2 = "text_encoder_2";  // SDXL's second

// A component to fuse into: its name (kLoraUNet, kLoraTextEncoder) and its parameters.
struct LoraTarget {
  std::string component;
  const TensorTable* table = nullptr;
  float* params = nullptr;
};

struct LoraFused {
  int modules = 0;  // modules adapted
  int rank = 0;     // the largest rank among them
};

// Fuses the LoRA of safetensors file `path` (F16, BF16, F32 or F64 tensors) at `scale` into the
// targets. Keys of a component in `skipped` are passed over (another call fuses them); one of
// another component is an error, which `elsewhere` explains (why that component is not here).
Result<LoraFused> FuseLora(const std::string& path, double scale,
                           const std::vector<LoraTarget>& targets,
                           const std::vector<std::string>& skipped = {},
                           const std::string& elsewhere = "");

}  // namespace difftrain::io
