// The plan of a job: the parallel sizes, the rank groups, which node runs which ranks,
// the batch arithmetic and an estimate of memory per rank. The controller places ranks
// by it and `difftrain validate` prints it, so both always agree.
//
// Placement: node i (nodes sorted by name) runs global ranks
// [i·devices_per_node, (i+1)·devices_per_node), rank i·devices_per_node + j on its
// device j. With the rank order tp-cp-dp-pp (tp fastest), a TP group is tp consecutive
// ranks, so requiring devices_per_node % tp == 0 keeps every TP group inside a node, and
// devices_per_node % (tp·cp) == 0 keeps every CP group inside one too.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "job/job_spec.h"

namespace difftrain::controller {

struct JobPlan {
  int nodes = 1, devices_per_node = 1, world = 1;
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int accumulation = 1;
  bool cp_inside_node = true;                // false: CP groups span nodes (allowed, slower)
  std::vector<std::vector<int>> node_ranks;  // global ranks of node i, by local rank
  int64_t parameters = 0;
  int64_t state_bytes_per_rank = 0;       // parameters, gradients, AdamW moments, EMA
  int64_t activation_bytes_per_rank = 0;  // one micro-batch
  // The text encoder a textual inversion or lora.train_text_encoder trains through: what it
  // holds a rank (TextEncoderMemory; 0 where it is not counted), its path, or why it is not
  // counted (its files are not readable here). Empty both where the run trains through none.
  int64_t text_encoder_bytes_per_rank = 0;
  std::string text_encoder, text_encoder_not_counted;
  // What writing a checkpoint allocates beside the arenas until it is written
  // (PlanCheckpointMemory): rank 0's, and the most of any other rank's; 0 without checkpoint.dir.
  int64_t checkpoint_bytes_rank0 = 0;
  int64_t checkpoint_bytes_per_rank = 0;

  nlohmann::json ToJson(const Topology& topology) const;
};

// Checks the layout of `config` (its cluster section, with any command-line overrides
// already applied) and makes the plan. Errors name the field and its place in the file.
Result<JobPlan> MakePlan(const TrainConfig& config);

// Whether node `slot` of the plan holds its ranks' host arenas (PlanMemory: what each rank's
// Trainer allocates) and what they allocate while a checkpoint is written in `memory_bytes`, what
// its worker daemon reported (the machine's memory, or its cgroup's limit: `limit` names that
// cgroup, "" where there is none). A job on GPUs keeps no activations on the host: no check. The
// error names the node, its ranks, what they need and what to change.
Status CheckNodeHostMemory(const TrainConfig& config, const JobPlan& plan, int slot,
                           const std::string& node, int64_t memory_bytes, const std::string& limit);

// The plan as `difftrain validate` prints it.
std::string DescribePlan(const TrainConfig& config, const JobPlan& plan);

}  // namespace difftrain::controller
