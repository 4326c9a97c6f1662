#include "model/io/checkpoint.h"
#include "common/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace difftrain::io {
namespace {

namespace fs = std::filesystem;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  // Every rank's shard holds tensor "w" = value + rank.
  void WriteShards(const CheckpointStore& store, int64_t step, int world, float value) {
    for (int rank = 0; rank < world; ++rank) {
      std::vector<float> w(4, value + static_cast<float>(rank));
      SafetensorsWriter writer;
      writer.AddF32("w", {4}, w.data());
      Status status = store.WriteShard(step, rank, world, writer);
      ASSERT_TRUE(status.ok()) << status.message();
    }
  }
  void WriteCheckpoint(const CheckpointStore& store, int64_t step, int world, float value) {
    WriteShards(store, step, world, value);
    Status status = store.Commit(step, world);
    ASSERT_TRUE(status.ok()) << status.message();
  }

  std::optional<int64_t> Latest(const CheckpointStore& store) {
    Result<std::optional<int64_t>> latest = store.LatestComplete();
    EXPECT_TRUE(latest.ok()) << latest.status().message();
    return latest.ok() ? *latest : std::optional<int64_t>(-1);
  }

  // The first element of "w" in a rank's shard, or NaN when it cannot be read.
  float ReadW(const CheckpointStore& store, int64_t step, int rank, int world) {
    Result<SafetensorsFile> shard = store.ReadShard(step, rank, world);
    std::vector<float> w(4);
    if (!shard.ok() || !shard->CopyF32("w", {4}, w.data()).ok()) return std::nanf("");
    return w[0];
  }

  std::set<std::string> Entries(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir))
      names.insert(entry.path().filename());
    return names;
  }

  std::string Shard(int64_t step, int rank, int world) {
    char name[64];
    std::snprintf(name, sizeof(name), "/step-%08ld/shard-%05d-of-%05d.safetensors",
                  static_cast<long>(step), rank, world);
    return dir_ + name;
  }

  void FlipLastByte(const std::string& path) {
    std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekg(-1, std::ios::end);
    char c = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(c ^ 0x01));
  }

  TempDir root_{"checkpoint_test"};
  std::string dir_ = root_.path() + "/ckpt";
};

TEST_F(CheckpointStoreTest, CommittedShardsAreTheLatestAndReadBack) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  EXPECT_EQ(Latest(store), 10);
  EXPECT_EQ(ReadW(store, 10, 0, 2), 1.0f);
  EXPECT_EQ(ReadW(store, 10, 1, 2), 2.0f);
  EXPECT_EQ(Entries(dir_), (std::set<std::string>{"step-00000010"}));
  EXPECT_EQ(Entries(store.StepDir(10)),
            (std::set<std::string>{"manifest.json", "shard-00000-of-00002.safetensors",
                                   "shard-00001-of-00002.safetensors"}));

  std::ifstream in(store.StepDir(10) + "/manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["format"], "difftrain-checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_EQ(manifest["step"], 10);
  EXPECT_EQ(manifest["world"], 2);
  ASSERT_EQ(manifest["shards"].size(), 2u);
  EXPECT_EQ(manifest["shards"][1]["file"], "shard-00001-of-00002.safetensors");
  EXPECT_EQ(manifest["shards"][1]["bytes"], fs::file_size(Shard(10, 1, 2)));
  EXPECT_EQ(manifest["shards"][1]["crc32"].get<std::string>().size(), 8u);
}

TEST_F(CheckpointStoreTest, AMissingDirectoryMeansNoCheckpointYet) {
  CheckpointStore store(dir_ + "/never/made", 1);
  EXPECT_EQ(Latest(store), std::nullopt);
}

TEST_F(CheckpointStoreTest, AMissingShardMakesTheStepIncomplete) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  WriteCheckpoint(store, 20, 2, 2.0f);
  fs::remove(Shard(20, 1, 2));
  EXPECT_EQ(Latest(store), 10);
  Result<SafetensorsFile> shard = store.ReadShard(20, 1, 2);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find(Shard(20, 1, 2)), std::string::npos);
  EXPECT_NE(shard.status().message().find("No such file"), std::string::npos);
}

TEST_F(CheckpointStoreTest, ACorruptShardMakesTheStepIncomplete) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  WriteCheckpoint(store, 20, 2, 2.0f);
  FlipLastByte(Shard(20, 0, 2));
  EXPECT_EQ(Latest(store), 10);
  Result<SafetensorsFile> shard = store.ReadShard(20, 0, 2);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find(Shard(20, 0, 2)), std::string::npos);
  EXPECT_NE(shard.status().message().find("checksum mismatch"), std::string::npos)
      << shard.status().message();
}

// A mapped shard reads as the read one; a corrupt or truncated one is an error naming it.
TEST_F(CheckpointStoreTest, AMappedShardIsCheckedAsItIsMapped) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  Result<SafetensorsFile> mapped = store.MapShard(10, 1, 2);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  std::vector<float> w(4);
  ASSERT_TRUE(mapped->CopyF32("w", {4}, w.data()).ok());
  EXPECT_EQ(w, std::vector<float>(4, 2.0f));
  FlipLastByte(Shard(10, 0, 2));
  Result<SafetensorsFile> corrupt = store.MapShard(10, 0, 2);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.status().message(), ::testing::HasSubstr(Shard(10, 0, 2)));
  EXPECT_THAT(corrupt.status().message(), ::testing::HasSubstr("checksum mismatch"));
  fs::resize_file(Shard(10, 1, 2), fs::file_size(Shard(10, 1, 2)) - 4);
  Result<SafetensorsFile> truncated = store.MapShard(10, 1, 2);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), ::testing::HasSubstr(Shard(10, 1, 2)));
}

TEST_F(CheckpointStoreTest, ACorruptManifestMakesTheStepIncomplete) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 1, 1.0f);
  WriteCheckpoint(store, 20, 1, 2.0f);
  std::ofstream(store.StepDir(20) + "/manifest.json") << R"({"format": "difftrain-check)";
  EXPECT_EQ(Latest(store), 10);
  Result<SafetensorsFile> shard = store.ReadShard(20, 0, 1);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find(store.StepDir(20) + "/manifest.json' is malformed"),
            std::string::npos)
      << shard.status().message();
}

TEST_F(CheckpointStoreTest, CommitRefusesAMissingShardAndKeepsThePrevious) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  std::vector<float> w(4, 5.0f);
  SafetensorsWriter writer;
  writer.AddF32("w", {4}, w.data());
  ASSERT_TRUE(store.WriteShard(20, 0, 2, writer).ok());
  Status status = store.Commit(20, 2);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("step-00000020.pending/shard-00001-of-00002.safetensors"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(Latest(store), 10);
}

TEST_F(CheckpointStoreTest, ACrashBeforeCommitLeavesThePreviousCheckpointLatest) {
  CheckpointStore store(dir_, 3);
  WriteCheckpoint(store, 10, 2, 1.0f);
  WriteShards(store, 20, 2, 2.0f);  // every rank wrote, then rank 0 died before Commit
  EXPECT_EQ(Latest(store), 10);
  EXPECT_FALSE(fs::exists(store.StepDir(20)));
  EXPECT_FALSE(store.ReadShard(20, 0, 2).ok());
}

TEST_F(CheckpointStoreTest, PruningKeepsTheNewestAndDropsStalePendingSteps) {
  CheckpointStore store(dir_, 2);
  WriteCheckpoint(store, 10, 1, 1.0f);
  WriteCheckpoint(store, 20, 1, 2.0f);
  WriteShards(store, 25, 1, 2.5f);  // never committed: stale once 30 is complete
  WriteCheckpoint(store, 30, 1, 3.0f);
  WriteShards(store, 50, 1, 5.0f);  // newer than every complete step: maybe in progress
  WriteCheckpoint(store, 40, 1, 4.0f);
  EXPECT_EQ(Entries(dir_),
            (std::set<std::string>{"step-00000030", "step-00000040", "step-00000050.pending"}));
  EXPECT_EQ(Latest(store), 40);
  EXPECT_EQ(ReadW(store, 30, 0, 1), 3.0f);
}

TEST_F(CheckpointStoreTest, KeepZeroKeepsEveryCompleteCheckpoint) {
  CheckpointStore store(dir_, 0);
  for (int64_t step : {1, 2, 3})
    WriteCheckpoint(store, step, 1, 1.0f);
  EXPECT_EQ(Entries(dir_).size(), 3u);
}

TEST_F(CheckpointStoreTest, RewritingACompleteStepReplacesItOnlyAtCommit) {
  CheckpointStore store(dir_, 1);
  WriteCheckpoint(store, 10, 2, 1.0f);
  WriteShards(store, 10, 2, 7.0f);  // a resumed run reaches step 10 again
  EXPECT_EQ(Latest(store), 10);
  EXPECT_EQ(ReadW(store, 10, 1, 2), 2.0f);
  ASSERT_TRUE(store.Commit(10, 2).ok());
  EXPECT_EQ(ReadW(store, 10, 1, 2), 8.0f);
  EXPECT_EQ(Entries(dir_), (std::set<std::string>{"step-00000010"}));
}

TEST_F(CheckpointStoreTest, ShardsOfAnotherWorldSizeAreNotPublished) {
  CheckpointStore store(dir_, 1);
  WriteShards(store, 10, 3, 9.0f);  // an earlier attempt with 3 ranks crashed
  WriteCheckpoint(store, 10, 2, 1.0f);
  EXPECT_EQ(Entries(store.StepDir(10)),
            (std::set<std::string>{"manifest.json", "shard-00000-of-00002.safetensors",
                                   "shard-00001-of-00002.safetensors"}));
}

TEST_F(CheckpointStoreTest, ReadingWithAnotherWorldSizeIsAnError) {
  CheckpointStore store(dir_, 1);
  WriteCheckpoint(store, 10, 2, 1.0f);
  Result<SafetensorsFile> shard = store.ReadShard(10, 0, 4);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("written by 2 ranks and cannot be read by 4"),
            std::string::npos)
      << shard.status().message();
}

}  // namespace
}  // namespace difftrain::io
