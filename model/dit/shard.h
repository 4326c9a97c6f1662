// Where one rank's part of a DiT sits in a tensor × context × pipeline parallel layout, and
// which parameters it holds.
//
// - Tensor parallel (tp, Megatron style): each block's qkv and fc1 are column-parallel
//   (rank r holds heads [r·H/tp, (r+1)·H/tp) of q, k and v, and rows [r·M/tp, (r+1)·M/tp)
//   of fc1), attn.proj and fc2 are row-parallel (the matching input columns). Everything
//   else — adaLN modulations, the embedders, the final layer, and the biases of the
//   row-parallel layers — is replicated: every rank of the group computes it from the same
//   inputs with the same code, so its gradients are identical on every rank (the
//   all-reduces that feed them return the same bits everywhere).
// - Context parallel (cp): the T tokens of each sample are split into cp contiguous shards;
//   the parameters are the same on every cp rank.
// - Pipeline parallel (pp): stage s holds blocks [first_block, end_block); the embedders on
//   stage 0, the final layer on stage pp − 1.
//
// A rank's parameters are one arena laid out by a local table with the reference names and
// local shapes. Fragments map it onto the arena of the whole model (the global table, the
// layout one process uses): initialisation, checkpoints and resharding go through them.
#pragma once

#include <cstddef>
#include <vector>

#include "common/status.h"
#include "model/dit/config.h"
#include "model/family/model.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

struct DiTShard : ModelShard {
  int first_block = 0, end_block = 0;

  // The whole model in one process.
  static DiTShard Whole(const DiTConfig& c);
  // `stage_blocks`: blocks per stage (empty: balanced, later stages taking the remainder).
  // Fails, before any work, when heads, hidden size, MLP width or tokens do not divide, or
  // the stages do not cover the blocks with at least one each.
  static Result<DiTShard> Create(const DiTConfig& c, int tp, int tp_rank, int cp, int cp_rank,
                                 int pp, int stage, const std::vector<int>& stage_blocks = {});
};

// Checks a layout for a model; the message names the sizes and what must divide.
Status ValidateParallelLayout(const DiTConfig& c, int tp, int cp, int pp,
                              const std::vector<int>& stage_blocks);

// The local parameter table of `shard`; with DiTShard::Whole, the reference table.
ShardedParameters ShardParameters(const DiTConfig& c, const DiTShard& shard);

}  // namespace difftrain
