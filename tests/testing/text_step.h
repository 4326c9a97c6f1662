// The batch of a training step through the text encoder, for a Python reference to repeat
// (tests/reference/textual_inversion.py, text_encoder_lora.py): its x_t, timesteps,
// epsilon-prediction target and token ids, and AdamW's settings in the metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "job/job_spec.h"
#include "model/io/safetensors.h"
#include "model/train/trainer.h"

namespace difftrain::testing {

// `batch` (latents 4 × 8 × 8, texts of 77 tokens) as x_t, t, target and ids (F32), and `o`'s
// lr, beta1, beta2, eps and weight_decay as metadata. Returns the ids' storage, which `step`
// points into until it is written (as it does into `batch`).
[[nodiscard]] inline std::vector<float> AddTextStep(const MicroBatch& batch,
                                                    const OptimizerConfig& o,
                                                    io::SafetensorsWriter& step) {
  std::vector<float> ids;
  for (const text::Tokens& t : batch.texts)
    ids.insert(ids.end(), t.ids.begin(), t.ids.end());
  const int64_t B = batch.size, L = 77;
  step.AddF32("x_t", {B, 4, 8, 8}, batch.x_t.data());
  step.AddF32("t", {B}, batch.t_float.data());
  step.AddF32("target", {B, 4, 8, 8}, batch.noise.data());  // epsilon-prediction
  step.AddF32("ids", {B, L}, ids.data());
  step.SetMetadata("lr", fmt::format("{}", o.lr));
  step.SetMetadata("beta1", fmt::format("{}", o.beta1));
  step.SetMetadata("beta2", fmt::format("{}", o.beta2));
  step.SetMetadata("eps", fmt::format("{}", o.eps));
  step.SetMetadata("weight_decay", fmt::format("{}", o.weight_decay));
  return ids;
}

}  // namespace difftrain::testing
