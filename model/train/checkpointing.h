// Saving and restoring a Trainer through a checkpoint directory (model/io/checkpoint.h).
// Every rank writes its shard (rank 0's holds the whole model, gathered from the others);
// rank 0 commits once all have written (the caller provides that barrier; one process needs
// none). Restoring reads shard 0 for the model and every shard for the optimizer moments,
// so a checkpoint loads into a run with another parallel layout or ZeRO setting.
#pragma once

#include <cstdint>
#include <optional>

#include "model/io/checkpoint.h"
#include "model/parallel/comm.h"
#include "model/train/trainer.h"

namespace difftrain {

// Writes this rank's shard of the trainer's current step; every rank calls it (it gathers).
Status WriteCheckpointShard(Trainer& trainer, const io::CheckpointStore& store, int rank,
                            int world);

// The newest complete checkpoint of `store` (nullopt: none), the same for every rank of
// `world`: its rank 0 reads every shard's checksum (LatestComplete) and broadcasts the step it
// chose, so one rank streams the checkpoint to check it rather than all of them. The others
// check only the sizes of the shards they map (CheckpointStore::MapShard). Without `world`, or
// one of one rank, LatestComplete itself.
Result<std::optional<int64_t>> AgreeOnLatestCheckpoint(const io::CheckpointStore& store,
                                                       parallel::Comm* world);

// Restores the newest complete checkpoint, if any, on every rank of `world` (see
// AgreeOnLatestCheckpoint); returns its step (nullopt: none, the trainer keeps its fresh
// initialisation).
Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store,
                                                       parallel::Comm* world = nullptr);

// Starts a trainer that resumed nothing from the weights `path` names (checkpoint.init_from,
// model/train/initial_weights.h); returns the file read. Logs, at info level (rank 0's), the
// file's tensors the model did not take.
Result<std::string> InitializeFromWeights(Trainer& trainer, const std::string& path);

}  // namespace difftrain
