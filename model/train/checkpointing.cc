#include "model/train/checkpointing.h"

namespace difftrain {

Status WriteCheckpointShard(Trainer& trainer, const io::CheckpointStore& store, int rank,
                            int world) {
  io::SafetensorsWriter shard;
  DT_RETURN_IF_ERROR(trainer.AddToCheckpoint(shard));
  return store.WriteShard(trainer.step(), rank, world, shard);
}

Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store) {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, store.LatestComplete());
  if (!latest) return std::optional<int64_t>();
  DT_ASSIGN_OR_RETURN(int world, store.World(*latest));
  size_t restored = 0;
  for (int rank = 0; rank < world; ++rank) {
    DT_ASSIGN_OR_RETURN(io::SafetensorsFile shard, store.ReadShard(*latest, rank, world));
    if (rank == 0) {
      Status s = trainer.RestoreModel(shard);
      if (!s.ok()) return s.WithContext("restoring checkpoint");
    }
    Result<size_t> copied = trainer.RestoreOptimizer(shard);
    if (!copied.ok()) return copied.status().WithContext("restoring checkpoint");
    restored += *copied;
  }
  if (restored != trainer.optimizer_elements()) {
    return Errorf(
        "restoring checkpoint step {} of {}: its {} shards hold {} of this rank's {} "
        "optimizer elements",
        *latest, store.dir(), world, restored, trainer.optimizer_elements());
  }
  return latest;
}

}  // namespace difftrain
