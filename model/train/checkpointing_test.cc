#include "model/train/checkpointing.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/gloo_comm.h"
#include "model/parallel/store.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// Rank 0 and rank 1 of a world of two (threads: the rendezvous needs both at once), each asking
// for the newest checkpoint of its own view of the directory: `dirs[r]`.
class AgreeOnLatestCheckpointTest : public ::testing::Test {
 protected:
  std::vector<Result<std::optional<int64_t>>> Agree(const std::string (&dirs)[2]) {
    std::vector<Result<std::optional<int64_t>>> got(2, std::optional<int64_t>());
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        Result<parallel::FileStore> store = parallel::FileStore::Open(temp_.path() + "/store");
        ASSERT_TRUE(store.ok());
        Result<std::unique_ptr<parallel::Comm>> world = parallel::CreateGlooComm(
            *store, "world" + std::to_string(round_), r, 2, {0, 1}, std::chrono::seconds(10));
        ASSERT_TRUE(world.ok()) << world.status().message();
        got[r] = AgreeOnLatestCheckpoint(io::CheckpointStore(dirs[r], 0), world->get());
      });
    }
    for (std::thread& t : ranks)
      t.join();
    ++round_;
    return got;
  }

  // A committed checkpoint of `step` in `dir`: one shard of 1024 floats.
  static void Write(const std::string& dir, int64_t step) {
    const io::CheckpointStore store(dir, 0);
    std::vector<float> w(1024, float(step % 1000));
    io::SafetensorsWriter writer;
    writer.AddF32("w", {1024}, w.data());
    ASSERT_TRUE(store.WriteShard(step, 0, 1, writer).ok());
    ASSERT_TRUE(store.Commit(step, 1).ok());
  }

  TempDir temp_{"checkpointing_test"};
  int round_ = 0;
};

TEST_F(AgreeOnLatestCheckpointTest, EveryRankTakesTheStepRankZeroChecked) {
  const std::string dir = temp_.path() + "/ckpt", copy = temp_.path() + "/copy";
  Write(dir, 10);
  Write(dir, 123456789012);  // beyond a float's 2^24: sent in pieces, exact
  fs::copy(dir, copy, fs::copy_options::recursive);
  // Rank 1's view of the newest step has a flipped byte in its data: rank 1 would skip it if it
  // read the shard to check it, as every rank once did.
  const std::string shard = io::CheckpointStore(copy, 0).ShardPath(123456789012, 0, 1);
  {
    std::fstream f(shard, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  ASSERT_EQ(io::CheckpointStore(copy, 0).LatestComplete()->value_or(-1), 10);

  const std::vector<Result<std::optional<int64_t>>> got = Agree({dir, copy});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status().message();
    EXPECT_EQ(got[r]->value_or(-1), 123456789012) << "rank " << r;
  }
}

TEST_F(AgreeOnLatestCheckpointTest, NoneIsNoneOnEveryRank) {
  const std::string none = temp_.path() + "/none";
  const std::vector<Result<std::optional<int64_t>>> got = Agree({none, none});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status().message();
    EXPECT_FALSE(got[r]->has_value()) << "rank " << r;
  }
}

TEST_F(AgreeOnLatestCheckpointTest, RankZerosErrorFailsEveryRank) {
  // A file where the directory should be: rank 0 cannot list it.
  const std::string file = temp_.path() + "/file", dir = temp_.path() + "/ckpt";
  std::ofstream(file) << "x";
  Write(dir, 10);
  const std::vector<Result<std::optional<int64_t>>> got = Agree({file, dir});
  ASSERT_FALSE(got[0].ok());
  EXPECT_THAT(got[0].status().message(), ::testing::HasSubstr(file));
  ASSERT_FALSE(got[1].ok());
  EXPECT_THAT(got[1].status().message(),
              ::testing::HasSubstr("rank 0 could not choose the checkpoint of '" + dir +
                                   "' to resume from (its log says why)"));
}

}  // namespace
}  // namespace difftrain
