// A training job small enough for a unit test: a 2-layer DiT on 8x8 inputs of 4 channels in
// 2x2 patches (16 tokens), 4 heads, 10 classes, fed by the synthetic dataset; two micro-batches
// of 4 per step on one rank. Tests set what they exercise on top (loss, recompute, device ...).
#pragma once

#include <memory>

#include "model/dit/family.h"
#include "model/train/trainer.h"

namespace difftrain::testing {

inline DiTConfig TinyDiT(int hidden_size, int depth = 2) {
  DiTConfig m;
  m.name = "custom";
  m.input_size = 8;
  m.patch_size = 2;
  m.in_channels = 4;
  m.hidden_size = hidden_size;
  m.depth = depth;
  m.num_heads = 4;
  m.num_classes = 10;
  return m;
}

// The same model with one input channel (8×8 grey images), and one micro-batch of 4 a step, as
// the model and batch sections of a job file: for the tests that run the binary.
inline constexpr const char* kTinyGreyJobYaml = R"(model:
  name: custom
  input_size: 8
  patch_size: 2
  in_channels: 1
  hidden_size: 32
  depth: 2
  num_heads: 4
  num_classes: 10
batch:
  micro: 4
  global: 4
)";

inline TrainConfig TinyTrainConfig(int hidden_size, int depth = 2) {
  TrainConfig c;
  c.model = DiTSpec(TinyDiT(hidden_size, depth));
  c.micro_batch = 4;
  c.global_batch = 8;
  c.optimizer.grad_clip = 1.0;
  c.optimizer.ema_decay = 0.99;
  return c;
}

// Changes fields of a DiT spec: EditDiT(c.model, [](DiTConfig& m) { m.depth = 12; }).
template <typename Edit>
void EditDiT(ModelSpec& spec, Edit&& edit) {
  DiTConfig m = DiTConfigOf(spec);
  edit(m);
  spec = DiTSpec(m);
}

inline std::unique_ptr<Dataset> SyntheticData(const TrainConfig& c) {
  const SampleSchema x = FamilyOf(c.model).Samples(c.model);
  return std::make_unique<SyntheticDataset>(c.seed, x.channels, x.height, x.num_classes);
}

}  // namespace difftrain::testing
