// The MPI store and communicator in real MPI processes: each test starts this program again
// under `mpirun -np N` with only itself selected; every rank runs the body and writes "ok" or
// "failed" to a file of its own, which the first process checks.
#include "model/parallel/mpi/mpi_comm.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/mpi_world.h"
#include "tests/testing/mpirun.h"
#include "tests/testing/run_command.h"

namespace difftrain::parallel {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr milliseconds kTimeout(10000);
constexpr char kResultsEnv[] = "DIFFTRAIN_MPI_TEST_RESULTS";

float Value(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

class MpiCommTest : public ::testing::Test {
 protected:
  // In the first process: runs this test in `ranks` MPI processes, checks their results and
  // returns false. In an MPI process: joins the world and returns true (run the body).
  bool InRanks(int ranks) {
    if (StartedByMpiLauncher()) {
      Result<std::unique_ptr<MpiWorld>> world = JoinMpiWorld();
      EXPECT_TRUE(world.ok()) << world.status().message();
      if (!world.ok()) std::_Exit(1);
      world_ = std::move(world).value();
      return true;
    }
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::filesystem::path results =
        std::filesystem::temp_directory_path() /
        fmt::format("mpi_comm_test_{}_{}", ::getpid(), test->name());
    std::filesystem::remove_all(results);
    std::filesystem::create_directories(results);
    const TempDir session("ompi");
    const testing::CommandResult r = testing::RunCommand(
        fmt::format("{}={} {} -x {} -np {} /proc/{}/exe --gtest_filter={}.{}", kResultsEnv,
                    results.string(), testing::MpirunCommand(session.path()), kResultsEnv, ranks,
                    ::getpid(), test->test_suite_name(), test->name()));
    for (int rank = 0; rank < ranks; ++rank) {
      std::ifstream in(results / std::to_string(rank));
      std::string result;
      std::getline(in, result);
      EXPECT_EQ(result, "ok") << "rank " << rank << "\n" << r.output;
    }
    if (!HasFailure()) std::filesystem::remove_all(results);
    return false;
  }

  // In an MPI process: every rank ends here, writing its result. `finalize` false: the test
  // left an op unfinished on purpose, so the process ends without MPI_Finalize, which makes
  // mpirun end the others: every rank first waits (in the store) until all have written theirs.
  void End(bool finalize = true) {
    const int me = world_->rank();
    std::ofstream(std::filesystem::path(std::getenv(kResultsEnv)) / std::to_string(me))
        << (HasFailure() ? "failed" : "ok") << "\n";
    std::fflush(stdout);
    if (!finalize) {
      std::vector<std::string> ended;
      for (int q = 0; q < world_->size(); ++q)
        ended.push_back(fmt::format("ended/{}", q));
      (void)world_->store().Set(ended[me], {'1'});
      (void)world_->store().Wait(ended, milliseconds(20000));
      std::_Exit(0);
    }
    // After the result: Finalize waits for every rank, and its own failure is mpirun's to see.
    if (!world_->Finalize(kTimeout).ok()) std::_Exit(1);
    std::_Exit(0);
  }

  std::unique_ptr<Comm> Join(const std::string& name, const std::vector<int>& members,
                             milliseconds timeout = kTimeout) {
    const auto it = std::find(members.begin(), members.end(), world_->rank());
    Result<std::unique_ptr<Comm>> comm = world_->CreateComm(
        "test/" + GroupName(name, members), static_cast<int>(it - members.begin()),
        static_cast<int>(members.size()), members, timeout);
    EXPECT_TRUE(comm.ok()) << comm.status().message();
    return comm.ok() ? std::move(comm).value() : nullptr;
  }

  std::unique_ptr<MpiWorld> world_;
};

TEST_F(MpiCommTest, StoreSetsGetsAddsAndWaits) {
  if (!InRanks(3)) return;
  Store& store = world_->store();
  const int me = world_->rank();
  EXPECT_TRUE(store.Set(fmt::format("key/{}", me), {'r', static_cast<char>('0' + me)}).ok());
  Result<int64_t> added = store.Add("count", 1);
  ASSERT_TRUE(added.ok());
  EXPECT_GE(*added, 1);
  EXPECT_LE(*added, 3);
  EXPECT_TRUE(store.Wait({"key/0", "key/1", "key/2"}, kTimeout).ok());
  for (int q = 0; q < 3; ++q) {
    Result<std::vector<char>> value = store.Get(fmt::format("key/{}", q), kTimeout);
    ASSERT_TRUE(value.ok());
    EXPECT_EQ(std::string(value->begin(), value->end()), fmt::format("r{}", q));
  }
  Result<std::vector<char>> missing = store.Get("never", milliseconds(50));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("'never' did not appear within 50 ms"));
  Status waited = store.Wait({"key/0", "nor/this"}, milliseconds(50));
  EXPECT_THAT(waited.message(), HasSubstr("nor/this did not appear"));
  End();
}

TEST_F(MpiCommTest, CollectivesOfTheWorldAndOfASubgroup) {
  if (!InRanks(4)) return;
  const int me = world_->rank();
  std::unique_ptr<Comm> world = Join("world", {0, 1, 2, 3});
  ASSERT_NE(world, nullptr);
  EXPECT_EQ(world->name(), "world[0,1,2,3]");
  constexpr size_t n = 1000;
  auto expect_sum = [&](const std::vector<float>& got, std::vector<int> ranks, float scale,
                        size_t offset, const char* what) {
    for (size_t i = 0; i < got.size(); ++i) {
      float sum = 0;
      for (int r : ranks)
        sum += Value(r, offset + i);
      ASSERT_FLOAT_EQ(got[i], sum * scale) << what << " element " << i;
    }
  };
  auto contribution = [&](size_t count) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = Value(me, i);
    return v;
  };
  // Two all-reduces in flight at once, waited for in the reverse order.
  std::vector<float> a = contribution(n), b = contribution(n);
  std::unique_ptr<CommWork> first = world->AllReduceAsync(a.data(), n, ReduceOp::kSum);
  std::unique_ptr<CommWork> second = world->AllReduceAsync(b.data(), n, ReduceOp::kAvg);
  ASSERT_TRUE(second->Wait().ok());
  ASSERT_TRUE(first->Wait().ok());
  expect_sum(a, {0, 1, 2, 3}, 1.0f, 0, "all_reduce sum");
  expect_sum(b, {0, 1, 2, 3}, 0.25f, 0, "all_reduce avg");

  // Reduce-scatter into a separate buffer and in place (this rank's chunk of the input).
  std::vector<float> in = contribution(4 * n), out(n);
  ASSERT_TRUE(world->ReduceScatter(in.data(), out.data(), n, ReduceOp::kSum).ok());
  expect_sum(out, {0, 1, 2, 3}, 1.0f, me * n, "reduce_scatter");
  float* own = in.data() + me * n;
  ASSERT_TRUE(world->ReduceScatter(in.data(), own, n, ReduceOp::kAvg).ok());
  expect_sum(std::vector<float>(own, own + n), {0, 1, 2, 3}, 0.25f, me * n, "in place");

  // All-gather from a separate buffer and in place.
  std::vector<float> gathered(4 * n, -1), mine(n, static_cast<float>(me));
  ASSERT_TRUE(world->AllGather(mine.data(), gathered.data(), n).ok());
  for (int q = 0; q < 4; ++q)
    EXPECT_EQ(gathered[q * n + n - 1], static_cast<float>(q));
  std::fill(gathered.begin(), gathered.end(), static_cast<float>(me));
  ASSERT_TRUE(world->AllGather(gathered.data() + me * n, gathered.data(), n).ok());
  for (int q = 0; q < 4; ++q)
    EXPECT_EQ(gathered[q * n], static_cast<float>(q));

  std::vector<float> broadcast = contribution(n);
  ASSERT_TRUE(world->Broadcast(broadcast.data(), n, 2).ok());
  expect_sum(broadcast, {2}, 1.0f, 0, "broadcast");

  // A ring of sends and receives, both halves in flight together.
  std::vector<float> sent = contribution(n), received(n);
  std::unique_ptr<CommWork> recv = world->RecvAsync(received.data(), n, (me + 3) % 4);
  std::unique_ptr<CommWork> send = world->SendAsync(sent.data(), n, (me + 1) % 4);
  ASSERT_TRUE(recv->Wait().ok());
  ASSERT_TRUE(send->Wait().ok());
  expect_sum(received, {(me + 3) % 4}, 1.0f, 0, "recv");

  // A group of two ranks out of four, ranks given in group order.
  if (me % 2 == 1) {
    std::unique_ptr<Comm> odd = Join("dp", {1, 3});
    ASSERT_NE(odd, nullptr);
    EXPECT_EQ(odd->rank(), me / 2);
    std::vector<float> v = contribution(n);
    ASSERT_TRUE(odd->AllReduce(v.data(), n, ReduceOp::kSum).ok());
    expect_sum(v, {1, 3}, 1.0f, 0, "subgroup all_reduce");
  }
  EXPECT_TRUE(world->Barrier().ok());
  End();
}

// Rank 2 never enters the all-reduce: the others' Wait returns, after the timeout, an error
// that names the group, the op and rank 2, and the communicator stays broken.
TEST_F(MpiCommTest, AnOpThatTimesOutNamesTheMissingRank) {
  if (!InRanks(3)) return;
  const int me = world_->rank();
  std::unique_ptr<Comm> world = Join("world", {0, 1, 2}, milliseconds(1500));
  ASSERT_NE(world, nullptr);
  std::vector<float> v(100, 1.0f);
  if (me != 2) {
    const auto start = std::chrono::steady_clock::now();
    Status s = world->AllReduce(v.data(), v.size(), ReduceOp::kSum);
    const auto took = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("world[0,1,2]: all_reduce #1 (100 floats) failed on rank"));
    EXPECT_THAT(s.message(), HasSubstr("2 (never started it)"));
    EXPECT_THAT(s.message(), HasSubstr("timeout 1500 ms"));
    EXPECT_LT(took, std::chrono::seconds(8));
    EXPECT_THAT(world->Barrier().message(), HasSubstr("not run: the communicator failed earlier"));
  }
  End(/*finalize=*/false);
}

}  // namespace
}  // namespace difftrain::parallel
