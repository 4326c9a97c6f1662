#include "model/train/checkpointing.h"

namespace difftrain {

Status WriteCheckpointShard(const Trainer& trainer, const io::CheckpointStore& store, int rank,
                            int world) {
  io::SafetensorsWriter shard;
  trainer.AddToCheckpoint(shard);
  return store.WriteShard(trainer.step(), rank, world, shard);
}

Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store, int rank,
                                                       int world) {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, store.LatestComplete());
  if (!latest) return std::optional<int64_t>();
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile shard, store.ReadShard(*latest, rank, world));
  Status restored = trainer.RestoreFromCheckpoint(shard);
  if (!restored.ok()) return restored.WithContext("restoring checkpoint");
  return latest;
}

}  // namespace difftrain
