// Where each DiT parameter sits in an arena laid out by a shard's table (the reference
// state-dict names): the one binding of names to offsets, used by the CPU model
// (model/dit/dit.h) and by the GPU step (model/dit/cuda/dit.h) alike.
#pragma once

#include <cstddef>
#include <vector>

#include "model/dit/shard.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

struct DiTBlockParams {
  size_t ada_w, ada_b, qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

struct DiTParams {
  // The embedders (the first stage's).
  size_t x_w = 0, x_b = 0, t1_w = 0, t1_b = 0, t2_w = 0, t2_b = 0, y_table = 0;
  std::vector<DiTBlockParams> blocks;  // the shard's blocks, first_block first
  // The final layer (the last stage's).
  size_t fada_w = 0, fada_b = 0, flin_w = 0, flin_b = 0;

  // Fails fast when `table` lacks a tensor the shard must hold.
  static DiTParams Bind(const TensorTable& table, const DiTShard& shard);
};

}  // namespace difftrain
