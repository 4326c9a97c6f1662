#include "model/io/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/json_read.h"
#include "model/io/posix_file.h"

namespace difftrain::io {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFile[] = "manifest.json";
constexpr char kFormat[] = "difftrain-checkpoint";
constexpr int kVersion = 1;
// Directories of unpublished steps: shards being written, or (after a replacement on a
// file system that cannot exchange directories) an old copy of a step on its way out.
constexpr std::string_view kPendingSuffix = ".pending";
constexpr std::string_view kReplacedSuffix = ".replaced";

std::string Join(const std::string& dir, std::string_view name) {
  return dir + "/" + std::string(name);
}
std::string StepName(int64_t step) {
  return fmt::format("step-{:08d}", step);
}
std::string PendingDir(const std::string& dir, int64_t step) {
  return Join(dir, StepName(step) + std::string(kPendingSuffix));
}
std::string ShardName(int rank, int world) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world);
}

struct ShardRecord {
  std::string file;
  uint64_t bytes;
  uint32_t crc32;
};

struct Manifest {
  int64_t step;
  int world;
  std::vector<ShardRecord> shards;  // indexed by rank
};

std::string ManifestJson(const Manifest& manifest) {
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const ShardRecord& shard : manifest.shards) {
    shards.push_back(
        {{"file", shard.file}, {"bytes", shard.bytes}, {"crc32", Crc32Hex(shard.crc32)}});
  }
  nlohmann::ordered_json json = {{"format", kFormat},
                                 {"version", kVersion},
                                 {"step", manifest.step},
                                 {"world", manifest.world},
                                 {"shards", std::move(shards)}};
  return json.dump(2) + "\n";
}

Result<Manifest> ParseManifest(const std::string& path, const std::string& text, int64_t step) {
  auto error = [&](const std::string& what) {
    return Errorf("checkpoint manifest '{}' {}", path, what);
  };
  Manifest manifest;
  std::vector<std::string> crcs;
  try {
    nlohmann::json json = nlohmann::json::parse(text);
    if (json.at("format") != kFormat || json.at("version") != kVersion) {
      return error(fmt::format("is not a {} version {} manifest", kFormat, kVersion));
    }
    manifest.step = json.at("step").get<int64_t>();
    manifest.world = JsonInt(json.at("world"), "world");
    for (const nlohmann::json& shard : json.at("shards")) {
      manifest.shards.push_back(
          {shard.at("file").get<std::string>(), shard.at("bytes").get<uint64_t>(), 0});
      crcs.push_back(shard.at("crc32").get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    return error(fmt::format("is malformed: {}", e.what()));
  }
  if (manifest.step != step) {
    return error(
        fmt::format("records step {}, but lies in the directory of step {}", manifest.step, step));
  }
  if (manifest.world < 1 || manifest.shards.size() != static_cast<size_t>(manifest.world)) {
    return error(fmt::format("lists {} shards for a world of {} ranks", manifest.shards.size(),
                             manifest.world));
  }
  for (int rank = 0; rank < manifest.world; ++rank) {
    ShardRecord& shard = manifest.shards[rank];
    if (shard.file != ShardName(rank, manifest.world)) {
      return error(fmt::format("names shard {} '{}', expected '{}'", rank, shard.file,
                               ShardName(rank, manifest.world)));
    }
    std::optional<uint32_t> crc = ParseCrc32Hex(crcs[rank]);
    if (!crc)
      return error(fmt::format("crc32 '{}' of shard {} is not 8 hex digits", crcs[rank], rank));
    shard.crc32 = *crc;
  }
  return manifest;
}

Result<Manifest> LoadManifest(const std::string& step_dir, int64_t step) {
  std::string path = Join(step_dir, kManifestFile);
  DT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return ParseManifest(path, text, step);
}

Status MatchSize(const std::string& path, const ShardRecord& record, uint64_t bytes) {
  if (bytes == record.bytes) return Status::Ok();
  return Errorf("'{}' is {} bytes, but the manifest says {}", path, bytes, record.bytes);
}

Status MatchDigest(const std::string& path, const ShardRecord& record, const FileDigest& digest) {
  DT_RETURN_IF_ERROR(MatchSize(path, record, digest.bytes));
  if (digest.crc32 == record.crc32) return Status::Ok();
  return Errorf("'{}' has checksum crc32 {}, but the manifest says {}", path,
                Crc32Hex(digest.crc32), Crc32Hex(record.crc32));
}

// How closely to look at a step. LatestComplete reads every byte before trusting a step;
// pruning only needs to tell whole steps from broken ones, and reading every kept
// checkpoint at every commit would cost more than the commit.
enum class Depth { kSizes, kChecksums };

Status CheckComplete(const std::string& step_dir, int64_t step, Depth depth) {
  DT_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(step_dir, step));
  for (const ShardRecord& record : manifest.shards) {
    std::string path = Join(step_dir, record.file);
    if (depth == Depth::kSizes) {
      DT_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path));
      DT_RETURN_IF_ERROR(MatchSize(path, record, file.size()));
      continue;
    }
    DT_ASSIGN_OR_RETURN(FileDigest digest, SafetensorsFile::Verify(path));
    DT_RETURN_IF_ERROR(MatchDigest(path, record, digest));
  }
  return Status::Ok();
}

// A subdirectory of the checkpoint directory that belongs to a step.
struct StepEntry {
  int64_t step;
  bool published;  // `step-N`, rather than `step-N.pending` or `step-N.replaced`
  std::string path;
};

// Only names exactly as we write them count; anything else in the directory is left alone.
std::optional<StepEntry> ParseStepEntry(const fs::path& path) {
  std::string name = path.filename().string();
  std::string_view base = name;
  bool published = true;
  for (std::string_view suffix : {kPendingSuffix, kReplacedSuffix}) {
    if (base.ends_with(suffix)) {
      base.remove_suffix(suffix.size());
      published = false;
      break;
    }
  }
  if (!base.starts_with("step-")) return std::nullopt;
  int64_t step = -1;
  auto [end, ec] = std::from_chars(base.data() + 5, base.data() + base.size(), step);
  if (ec != std::errc() || end != base.data() + base.size() || StepName(step) != base) {
    return std::nullopt;
  }
  return StepEntry{step, published, path.string()};
}

// The step directories under `dir`, newest first (at equal steps, the published one
// first); none when `dir` does not exist.
Result<std::vector<StepEntry>> ListSteps(const std::string& dir) {
  std::vector<StepEntry> entries;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return entries;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::optional<StepEntry> entry = ParseStepEntry(it->path());
    if (entry && it->is_directory(ec)) entries.push_back(std::move(*entry));
  }
  if (ec) return OsError("cannot list checkpoint directory", dir, ec.value());
  std::sort(entries.begin(), entries.end(), [](const StepEntry& a, const StepEntry& b) {
    return std::pair(a.step, a.published) > std::pair(b.step, b.published);
  });
  return entries;
}

// Verifies every rank's shard in the pending directory and describes them for the manifest.
Result<Manifest> DigestShards(const std::string& pending, int64_t step, int world) {
  Manifest manifest{step, world, {}};
  for (int rank = 0; rank < world; ++rank) {
    std::string file = ShardName(rank, world);
    DT_ASSIGN_OR_RETURN(FileDigest digest, SafetensorsFile::Verify(Join(pending, file)));
    manifest.shards.push_back({file, digest.bytes, digest.crc32});
  }
  return manifest;
}

// Removes what the pending directory holds beyond the manifest's shards: shards of another
// world size or temporary files from an earlier, crashed attempt at this step. Published,
// they would make the checkpoint ambiguous to whoever reads it without the manifest.
Status RemoveStrays(const std::string& pending, const Manifest& manifest) {
  std::vector<fs::path> strays;
  std::error_code ec;
  for (fs::directory_iterator it(pending, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    bool listed = std::any_of(manifest.shards.begin(), manifest.shards.end(),
                              [&](const ShardRecord& shard) { return shard.file == name; });
    if (!listed) strays.push_back(it->path());
  }
  if (ec) return OsError("cannot list", pending, ec.value());
  for (const fs::path& stray : strays) {
    fs::remove_all(stray, ec);
    if (ec) return OsError("cannot remove", stray.string(), ec.value());
  }
  return Status::Ok();
}

Status WriteManifest(const std::string& step_dir, const Manifest& manifest) {
  std::string text = ManifestJson(manifest);
  DT_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(Join(step_dir, kManifestFile)));
  DT_RETURN_IF_ERROR(file.Append(text.data(), text.size()));
  return file.Commit();
}

void RemoveOrWarn(const std::string& path, const char* why) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    spdlog::warn("cannot remove {} '{}': {}", why, path, ec.message());
  } else {
    spdlog::debug("removed {} '{}'", why, path);
  }
}

bool ExchangeUnsupported(int err) {
  return err == EINVAL || err == ENOSYS || err == ENOTSUP;
}

// Renames the pending directory of `step` to its published name. When the step exists
// already (a run resumed from an older step reached it again), the two directories are
// exchanged in one call, so the published name holds a whole checkpoint at every moment.
Status Publish(const std::string& dir, int64_t step) {
  std::string pending = PendingDir(dir, step);
  std::string published = Join(dir, StepName(step));
  if (::rename(pending.c_str(), published.c_str()) == 0) return FsyncDirectory(dir);
  if (errno != ENOTEMPTY && errno != EEXIST) {
    return OsError("cannot rename '" + pending + "' to", published, errno);
  }
  std::string old_copy = pending;
  if (::renameat2(AT_FDCWD, pending.c_str(), AT_FDCWD, published.c_str(), RENAME_EXCHANGE) != 0) {
    if (!ExchangeUnsupported(errno)) {
      return OsError("cannot exchange '" + pending + "' with", published, errno);
    }
    // Some file systems (NFS) cannot exchange: two renames leave a moment in which the old
    // checkpoint lies only under `.replaced` (documented in docs/formats.md).
    old_copy = published + std::string(kReplacedSuffix);
    RemoveOrWarn(old_copy, "leftover checkpoint");
    if (::rename(published.c_str(), old_copy.c_str()) != 0) {
      return OsError("cannot rename '" + published + "' to", old_copy, errno);
    }
    if (::rename(pending.c_str(), published.c_str()) != 0) {
      return OsError("cannot rename '" + pending + "' to", published, errno);
    }
  }
  DT_RETURN_IF_ERROR(FsyncDirectory(dir));
  RemoveOrWarn(old_copy, "replaced checkpoint");
  return Status::Ok();
}

Status CommitUnpruned(const std::string& dir, int64_t step, int world) {
  std::string pending = PendingDir(dir, step);
  DT_ASSIGN_OR_RETURN(Manifest manifest, DigestShards(pending, step, world));
  DT_RETURN_IF_ERROR(RemoveStrays(pending, manifest));
  DT_RETURN_IF_ERROR(WriteManifest(pending, manifest));
  return Publish(dir, step);
}

// `map`: memory-mapped, checked against the manifest's size and, unless `verified`, the file's
// data checksum only.
Result<SafetensorsFile> ReadCheckedShard(const std::string& step_dir, int64_t step, int rank,
                                         int world, bool map = false, bool verified = false) {
  DT_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(step_dir, step));
  if (manifest.world != world) {
    return Errorf(
        "checkpoint '{}' was written by {} ranks and cannot be read by {} "
        "(resharding is not supported)",
        step_dir, manifest.world, world);
  }
  const ShardRecord& record = manifest.shards[rank];
  std::string path = Join(step_dir, record.file);
  if (map) {
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (!ec) DT_RETURN_IF_ERROR(MatchSize(path, record, bytes));
    return SafetensorsFile::Map(path, /*check_data=*/!verified);
  }
  DT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  DT_RETURN_IF_ERROR(MatchDigest(path, record, file.digest()));
  return file;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  DT_CHECK(keep >= 0, "keep {} must not be negative", keep);
  while (dir_.size() > 1 && dir_.back() == '/')
    dir_.pop_back();
}

std::string CheckpointStore::StepDir(int64_t step) const {
  return Join(dir_, StepName(step));
}

std::string CheckpointStore::ShardPath(int64_t step, int rank, int world) const {
  return Join(StepDir(step), ShardName(rank, world));
}

Status CheckpointStore::WriteShard(int64_t step, int rank, int world,
                                   const SafetensorsWriter& shard) const {
  DT_CHECK(step >= 0 && world >= 1 && rank >= 0 && rank < world, "step {} rank {} world {}", step,
           rank, world);
  std::string pending = PendingDir(dir_, step);
  std::error_code ec;
  fs::create_directories(pending, ec);
  Status status = ec ? OsError("cannot create directory", pending, ec.value())
                     : shard.WriteAtomic(Join(pending, ShardName(rank, world)));
  return status.WithContext(
      fmt::format("writing checkpoint step {} shard {} of {}", step, rank, world));
}

Status CheckpointStore::Commit(int64_t step, int world) const {
  DT_CHECK(step >= 0 && world >= 1, "step {} world {}", step, world);
  DT_RETURN_IF_ERROR(
      CommitUnpruned(dir_, step, world)
          .WithContext(
              fmt::format("committing checkpoint step {} of {} ranks in '{}'", step, world, dir_)));
  Prune(step);
  return Status::Ok();
}

void CheckpointStore::Prune(int64_t committed) const {
  Result<std::vector<StepEntry>> entries = ListSteps(dir_);
  if (!entries.ok()) {
    spdlog::warn("not pruning checkpoints: {}", entries.status().message());
    return;
  }
  std::optional<int64_t> newest_complete;
  int kept = 0;
  // Newest first, so that every entry is judged knowing the newest complete step above it.
  for (const StepEntry& entry : *entries) {
    bool complete = entry.published && CheckComplete(entry.path, entry.step, Depth::kSizes).ok();
    if (complete) {
      if (!newest_complete) newest_complete = entry.step;
      if (keep_ == 0 || kept < keep_ || entry.step == committed) {
        ++kept;
      } else {
        RemoveOrWarn(entry.path, "old checkpoint");
      }
    } else if (newest_complete && entry.step < *newest_complete) {
      RemoveOrWarn(entry.path, "stale incomplete checkpoint");
    }
  }
}

Result<std::optional<int64_t>> CheckpointStore::LatestComplete() const {
  DT_ASSIGN_OR_RETURN(std::vector<StepEntry> entries, ListSteps(dir_));
  for (const StepEntry& entry : entries) {
    if (!entry.published) continue;
    Status status = CheckComplete(entry.path, entry.step, Depth::kChecksums);
    if (status.ok()) return std::optional<int64_t>(entry.step);
    spdlog::warn("skipping checkpoint '{}', it is not complete: {}", entry.path, status.message());
  }
  return std::optional<int64_t>();
}

Result<SafetensorsFile> CheckpointStore::ReadShard(int64_t step, int rank, int world) const {
  DT_CHECK(rank >= 0 && rank < world, "rank {} world {}", rank, world);
  Result<SafetensorsFile> shard = ReadCheckedShard(StepDir(step), step, rank, world);
  if (!shard.ok()) {
    return shard.status().WithContext(
        fmt::format("reading checkpoint step {} shard {} of {}", step, rank, world));
  }
  return shard;
}

Result<SafetensorsFile> CheckpointStore::MapShard(int64_t step, int rank, int world,
                                                  bool verified) const {
  DT_CHECK(rank >= 0 && rank < world, "rank {} world {}", rank, world);
  Result<SafetensorsFile> shard =
      ReadCheckedShard(StepDir(step), step, rank, world, /*map=*/true, verified);
  if (!shard.ok()) {
    return shard.status().WithContext(
        fmt::format("mapping checkpoint step {} shard {} of {}", step, rank, world));
  }
  return shard;
}

Result<std::vector<int64_t>> CheckpointStore::PublishedSteps() const {
  DT_ASSIGN_OR_RETURN(std::vector<StepEntry> entries, ListSteps(dir_));
  std::vector<int64_t> steps;
  for (const StepEntry& entry : entries) {
    if (entry.published) steps.push_back(entry.step);
  }
  return steps;
}

Result<int> CheckpointStore::World(int64_t step) const {
  DT_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(StepDir(step), step));
  return manifest.world;
}

Result<std::pair<CheckpointStore, int64_t>> ResolveCheckpointStep(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return Errorf("'{}' is not a directory", path);
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json", ec)) {
    const std::filesystem::path step_dir = std::filesystem::path(path).lexically_normal();
    const std::filesystem::path dir = step_dir.has_filename() ? step_dir : step_dir.parent_path();
    const std::string name = dir.filename().string();
    int64_t step = -1;
    if (name.rfind("step-", 0) == 0) {
      try {
        step = std::stoll(name.substr(5));
      } catch (const std::exception&) {
      }
    }
    // Only the name CheckpointStore writes (step-00000020) names the step it reads.
    if (step < 0 || fmt::format("step-{:08d}", step) != name) {
      return Errorf("'{}' holds a manifest but is not named step-<N> as checkpoint steps are",
                    path);
    }
    const std::string parent = dir.has_parent_path() ? dir.parent_path().string() : ".";
    return std::pair(CheckpointStore(parent, 0), step);
  }
  CheckpointStore store(path, 0);
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, store.LatestComplete());
  if (!latest) return Errorf("'{}' holds no complete checkpoint", path);
  return std::pair(std::move(store), *latest);
}

}  // namespace difftrain::io
