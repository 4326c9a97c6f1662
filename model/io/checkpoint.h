// A directory of checkpoints, one subdirectory per step:
//
//   dir/step-00000020/shard-00000-of-00002.safetensors   one safetensors file per rank
//   dir/step-00000020/shard-00001-of-00002.safetensors
//   dir/step-00000020/manifest.json                      the size and CRC-32 of every shard
//
// Ranks write their shards into `dir/step-00000020.pending/`; rank 0's Commit verifies
// them, writes the manifest and only then renames the directory to `step-00000020`, so a
// step directory always holds a whole checkpoint and a crash at any moment leaves the
// previous checkpoints as they were. A step is "complete" when its manifest and every
// shard it lists exist and match their recorded size and checksum. See docs/formats.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/io/safetensors.h"

namespace difftrain::io {

class CheckpointStore {
 public:
  // `keep`: how many complete checkpoints Commit leaves in place; 0 keeps all of them.
  CheckpointStore(std::string dir, int keep);

  // Writes rank `rank`'s shard of step `step` (atomically) into the step's pending
  // directory, creating directories as needed. Every rank calls it; none of it is visible
  // to LatestComplete or ReadShard until Commit.
  Status WriteShard(int64_t step, int rank, int world, const SafetensorsWriter& shard) const;

  // Called by rank 0 once every rank's WriteShard returned: verifies every shard, writes
  // the manifest, publishes the step (replacing an existing directory of the same step
  // in one atomic exchange) and prunes old checkpoints: the newest `keep` complete ones
  // and the one just written stay, older complete ones go, and so do incomplete and
  // pending ones older than the newest complete one. A failure to prune is logged, not
  // returned: the checkpoint itself was written.
  Status Commit(int64_t step, int world) const;

  // The newest complete step, verifying every shard's checksum; nullopt when there is none
  // (a missing directory included). Incomplete or corrupt steps are skipped with a warning.
  Result<std::optional<int64_t>> LatestComplete() const;

  // The published steps, newest first, without reading them: a step directory is renamed into
  // place only after Commit verified it, so each is whole unless changed since (sampling's
  // --watch lists them every second; a reader still checks the shard it reads). None when the
  // directory does not exist.
  Result<std::vector<int64_t>> PublishedSteps() const;

  // Reads rank `rank`'s shard of a committed step after checking it against the manifest:
  // the manifest's step and world, the shard's size and whole-file checksum.
  Result<SafetensorsFile> ReadShard(int64_t step, int rank, int world) const;
  // The same shard memory-mapped, for a reader that takes part of it (sampling and export read
  // the model or its EMA, not the optimizer's moments: a whole fine-tune of SD 1.5 holds 13.7 GB
  // of which sampling needs 3.4): the manifest's step, world and size, and the data against the
  // file's own crc32 (SafetensorsFile::Map), not the whole-file checksum, which would read it a
  // second time. `verified`: the caller has just checked the whole-file checksum
  // (LatestComplete), and the data is not read again.
  Result<SafetensorsFile> MapShard(int64_t step, int rank, int world, bool verified = false) const;

  // The number of shards (ranks) a committed step was written by; a run of another size
  // reads all of them to reassemble sharded state.
  Result<int> World(int64_t step) const;

  const std::string& dir() const { return dir_; }
  // The directory of a committed step: `dir/step-00000020`.
  std::string StepDir(int64_t step) const;
  // A shard's file in a committed step: `dir/step-00000020/shard-00000-of-00002.safetensors`.
  std::string ShardPath(int64_t step, int rank, int world) const;

 private:
  void Prune(int64_t committed) const;

  std::string dir_;
  int keep_;
};

// `path` is a checkpoint directory (its newest complete step) or one step directory
// `.../step-00000020`: the store holding the step, and the step. Errors name the path.
Result<std::pair<CheckpointStore, int64_t>> ResolveCheckpointStep(const std::string& path);

}  // namespace difftrain::io
