// A training job small enough for a unit test: a 2-layer DiT on 8x8 inputs of 4 channels in
// 2x2 patches (16 tokens), 4 heads, 10 classes, fed by the synthetic dataset; two micro-batches
// of 4 per step on one rank. Tests set what they exercise on top (loss, recompute, device ...).
#pragma once

#include <memory>

#include "model/train/trainer.h"

namespace difftrain::testing {

inline TrainConfig TinyTrainConfig(int hidden_size, int depth = 2) {
  TrainConfig c;
  c.model.name = "custom";
  c.model.input_size = 8;
  c.model.patch_size = 2;
  c.model.in_channels = 4;
  c.model.hidden_size = hidden_size;
  c.model.depth = depth;
  c.model.num_heads = 4;
  c.model.num_classes = 10;
  c.micro_batch = 4;
  c.global_batch = 8;
  c.optimizer.grad_clip = 1.0;
  c.optimizer.ema_decay = 0.99;
  return c;
}

inline std::unique_ptr<Dataset> SyntheticData(const TrainConfig& c) {
  return std::make_unique<SyntheticDataset>(c.seed, c.model.in_channels, c.model.input_size,
                                            c.model.num_classes);
}

}  // namespace difftrain::testing
