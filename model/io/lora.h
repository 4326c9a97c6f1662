// LoRA weights (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models") fused into a
// model's parameters, as diffusers' fuse_lora does: for each module the file adapts,
//   W += scale · (alpha / rank) · up · down,
// with down [rank, in] and up [out, rank] for a Linear, and down [rank, in, kh, kw] and
// up [out, rank, 1, 1] for a convolution (kohya's LoCon), the product taken over the flattened
// in × kh × kw. alpha is the file's (kohya's `.alpha`); without one it is the rank (a factor 1).
//
// The key forms diffusers' loaders read (MODULE: the module's name in the model's parameter
// table, whose weight is MODULE.weight, diffusers' state-dict names):
//   peft (diffusers' save_lora_weights)  unet.MODULE.lora_A.weight, unet.MODULE.lora_B.weight
//   diffusers' older LoRA layers         unet.MODULE.lora.down.weight, ….lora.up.weight (or
//                                        lora_linear_layer.), MODULE.alpha
//   attention processors'                unet.….attn1.processor.to_q_lora.down.weight, … (to_q,
//                                        to_k, to_v; to_out_lora is to_out.0)
//   kohya (sd-scripts, A1111)            lora_unet_MODULE_WITH_UNDERSCORES.lora_down.weight,
//                                        ….lora_up.weight, ….alpha
// (the unet. prefix optional). A kohya name is matched against the table's module names with
// '.' read as '_', so it needs diffusers' block layout (SD 1.x/2.x LoRAs have it; SDXL's
// original-layout input_blocks names do not match and are refused by name).
//
// Refused, naming the key: a text encoder's LoRA (lora_te…, text_encoder.… : difftrain does not
// apply those), a key of none of these forms, a module the model lacks, a down without its up
// (or the reverse), shapes that do not multiply to the weight's, a non-finite scale.
#pragma once

#include <string>

#include "common/status.h"
#include "model/tensor/tensor_table.h"

namespace difftrain::io {

struct LoraFused {
  int modules = 0;  // modules adapted
  int rank = 0;     // the largest rank among them
};

// Fuses the LoRA of safetensors file `path` (F16, BF16, F32 or F64 tensors) at `scale` into
// `params`, laid out by `table`.
Result<LoraFused> FuseLora(const std::string& path, double scale, const TensorTable& table,
                           float* params);

}  // namespace difftrain::io
