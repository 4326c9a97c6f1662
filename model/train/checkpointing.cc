#include "model/train/checkpointing.h"

#include <spdlog/spdlog.h>

#include "model/train/initial_weights.h"

namespace difftrain {

Status WriteCheckpointShard(Trainer& trainer, const io::CheckpointStore& store, int rank,
                            int world) {
  io::SafetensorsWriter shard;
  Status added = trainer.AddToCheckpoint(shard);
  if (added.ok()) added = store.WriteShard(trainer.step(), rank, world, shard);
  trainer.ReleaseCheckpoint();
  return added;
}

Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store) {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, store.LatestComplete());
  if (!latest) return std::optional<int64_t>();
  DT_ASSIGN_OR_RETURN(int world, store.World(*latest));
  size_t restored = 0;
  for (int rank = 0; rank < world; ++rank) {
    // Mapped, and not checked again: LatestComplete has just checked every shard's checksum,
    // and a shard read whole beside the trainer's arenas would double a large model's memory.
    // The rank reads its fragments of it alone, and gives each tensor's pages back once read.
    DT_ASSIGN_OR_RETURN(io::SafetensorsFile shard,
                        store.MapShard(*latest, rank, world, /*verified=*/true));
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

Result<std::string> InitializeFromWeights(Trainer& trainer, const std::string& path) {
  DT_ASSIGN_OR_RETURN(const std::string file_path, InitialWeightsFile(path));
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile file, io::SafetensorsFile::Map(file_path));
  DT_ASSIGN_OR_RETURN(const std::vector<std::string> unused, trainer.InitializeFrom(file));
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 5; ++i)
      names += (i == 0 ? "" : ", ") + unused[i];
    spdlog::info("{}: {} tensor(s) the model does not have were not read: {}{}", file_path,
                 unused.size(), names, unused.size() > 5 ? ", ..." : "");
  }
  return file_path;
}

}  // namespace difftrain
