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

Result<std::optional<int64_t>> AgreeOnLatestCheckpoint(const io::CheckpointStore& store,
                                                       parallel::Comm* world) {
  if (world == nullptr || world->size() == 1) return store.LatestComplete();
  // What rank 0 found: 1 a step, 0 none, -1 an error (which it reports); then the step in
  // three 16-bit pieces, each exact in a float.
  float found[4] = {-1, 0, 0, 0};
  Result<std::optional<int64_t>> latest = std::optional<int64_t>();
  if (world->rank() == 0) {
    latest = store.LatestComplete();
    if (latest.ok()) {
      const int64_t step = latest->value_or(0);
      DT_CHECK(step >= 0 && step < (int64_t{1} << 48), "checkpoint step {}", step);
      found[0] = latest->has_value() ? 1 : 0;
      for (int i = 0; i < 3; ++i)
        found[1 + i] = float((step >> (16 * (2 - i))) & 0xffff);
    }
  }
  DT_RETURN_IF_ERROR(world->Broadcast(found, 4, 0)
                         .WithContext(fmt::format(
                             "agreeing on the checkpoint of '{}' to resume from", store.dir())));
  if (world->rank() == 0) return latest;
  if (found[0] < 0) {
    return Errorf(
        "rank 0 could not choose the checkpoint of '{}' to resume from (its log says why)",
        store.dir());
  }
  if (found[0] == 0) return std::optional<int64_t>();
  int64_t step = 0;
  for (int i = 0; i < 3; ++i)
    step = (step << 16) | static_cast<int64_t>(found[1 + i]);
  return std::optional<int64_t>(step);
}

Result<std::optional<int64_t>> RestoreLatestCheckpoint(Trainer& trainer,
                                                       const io::CheckpointStore& store,
                                                       parallel::Comm* world) {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, AgreeOnLatestCheckpoint(store, world));
  if (!latest) return std::optional<int64_t>();
  DT_ASSIGN_OR_RETURN(const int shards, store.World(*latest));
  size_t restored = 0;
  for (int rank = 0; rank < shards; ++rank) {
    // Mapped, and not checked again: rank 0's LatestComplete has just checked every shard's
    // checksum (MapShard checks its size against the manifest, so a shard cut short since is an
    // error, not a fault), and a shard read whole beside the trainer's arenas would double a
    // large model's memory. The rank reads its fragments of it alone, and gives each tensor's
    // pages back once read.
    DT_ASSIGN_OR_RETURN(io::SafetensorsFile shard,
                        store.MapShard(*latest, rank, shards, /*verified=*/true));
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
        *latest, store.dir(), shards, restored, trainer.optimizer_elements());
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
