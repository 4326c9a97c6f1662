// Saving and restoring a Trainer through a checkpoint directory (model/io/checkpoint.h).
// With `world` ranks, every rank writes its shard and rank 0 commits once all have written
// (the caller provides that barrier; one process needs none).
#pragma once

#include <cstdint>
#include <optional>

#include "model/io/checkpoint.h"
#include "model/train/trainer.h"

namespace difftrain {

// Writes this rank's shard of the trainer's current step.
Status WriteCheckpointShard(const Trainer& trainer, const io::CheckpointStore& store, int rank,
                            int world);

// Restores the newest complete checkpoint, if any; returns its step (nullopt: none, the
// trainer keeps its fresh initialisation).
Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store, int rank,
                                                       int world);

}  // namespace difftrain
