#include <sys/mman.h>
#include <unistd.h>

#include "model/parallel/gloo_comm.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/rank_processes.h"

namespace difftrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr milliseconds kTimeout(3000);       // for tests that expect success
constexpr milliseconds kShortTimeout(1500);  // for tests that expect a timeout
constexpr milliseconds kProcessLimit(30000);

// What rank `rank` contributes at index i: distinct per rank and exact in float, so sums
// are exact.
float Value(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

std::vector<float> Contribution(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = Value(rank, i);
  return v;
}

// The sum over `ranks` of their contributions at index i.
float SumOf(const std::vector<int>& ranks, size_t i) {
  float sum = 0;
  for (int r : ranks)
    sum += Value(r, i);
  return sum;
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// An error naming the first element of `got` that differs from expected(i).
template <typename Expected>
Status Check(const std::string& what, const float* got, size_t n, Expected expected) {
  for (size_t i = 0; i < n; ++i) {
    const float want = expected(i);
    if (std::fabs(got[i] - want) > 1e-5f * std::max(1.0f, std::fabs(want))) {
      return Errorf("{}: element {} is {}, expected {}", what, i, got[i], want);
    }
  }
  return Status::Ok();
}

class GlooCommTest : public ::testing::Test {
 protected:
  // Called in a rank process: opens the test's store (every rank opens the same one).
  Result<FileStore> OpenStore() const { return FileStore::Open(dir_.path() + "/store"); }

  // Called in a rank process: joins group `token` made of `members` (global ranks) as
  // global rank `me`.
  static Result<std::unique_ptr<Comm>> Join(Store& store, const std::string& token,
                                            const std::vector<int>& members, int me,
                                            milliseconds timeout = kTimeout) {
    const int rank =
        static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    return CreateGlooComm(store, "job/0/" + GroupName(token, members), rank,
                          static_cast<int>(members.size()), members, timeout);
  }

  // Runs body(comm) in `size` rank processes joined in one group; the first failure.
  Status RunGroup(int size, const std::function<Status(Comm&)>& body) {
    RankProcesses ranks(dir_.path(), size, [&](int rank) -> Status {
      DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
      DT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, Join(store, "world", Iota(size), rank));
      return body(*comm);
    });
    return ranks.WaitAll(kProcessLimit);
  }

  TempDir dir_;
};

class GlooCollectiveTest : public GlooCommTest, public ::testing::WithParamInterface<int> {};

INSTANTIATE_TEST_SUITE_P(GroupSizes, GlooCollectiveTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

TEST_P(GlooCollectiveTest, AllReduceSumsAndAverages) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    // One element, an odd count, and more than one of Gloo's 1 MiB segments.
    for (size_t n : {size_t{1}, size_t{1027}, size_t{300007}}) {
      std::vector<float> sum = Contribution(comm.rank(), n);
      DT_RETURN_IF_ERROR(comm.AllReduce(sum.data(), n, ReduceOp::kSum));
      DT_RETURN_IF_ERROR(
          Check("sum", sum.data(), n, [&](size_t i) { return SumOf(Iota(size), i); }));
      std::vector<float> avg = Contribution(comm.rank(), n);
      DT_RETURN_IF_ERROR(comm.AllReduce(avg.data(), n, ReduceOp::kAvg));
      DT_RETURN_IF_ERROR(
          Check("avg", avg.data(), n, [&](size_t i) { return SumOf(Iota(size), i) / size; }));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_P(GlooCollectiveTest, ReduceScatterGivesEachRankItsReducedChunk) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    const int r = comm.rank();
    for (size_t n : {size_t{1}, size_t{1027}}) {
      const std::vector<float> in = Contribution(r, n * size);
      // The reduction of chunk r, element i: index r·n + i of every rank's input.
      auto reduced = [&](size_t i) { return SumOf(Iota(size), r * n + i); };
      std::vector<float> out(n);
      DT_RETURN_IF_ERROR(comm.ReduceScatter(in.data(), out.data(), n, ReduceOp::kSum));
      DT_RETURN_IF_ERROR(Check("sum", out.data(), n, reduced));
      DT_RETURN_IF_ERROR(comm.ReduceScatter(in.data(), out.data(), n, ReduceOp::kAvg));
      DT_RETURN_IF_ERROR(Check("avg", out.data(), n, [&](size_t i) { return reduced(i) / size; }));
      // In place: the output is this rank's chunk of the input.
      std::vector<float> inout = in;
      float* own = inout.data() + r * n;
      DT_RETURN_IF_ERROR(comm.ReduceScatter(inout.data(), own, n, ReduceOp::kSum));
      DT_RETURN_IF_ERROR(Check("in place", own, n, reduced));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

// Regression: the ring reduce-scatter once copied one chunk more than its input holds.
// The input ends exactly at an inaccessible page here, so any read past it faults.
TEST_P(GlooCollectiveTest, ReduceScatterReadsNothingPastItsInput) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    const size_t n = 1000, page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t bytes = n * size * sizeof(float);
    const size_t mapped = (bytes + page - 1) / page * page;
    char* base = static_cast<char*>(
        ::mmap(nullptr, mapped + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) return Status::Error("mmap failed");
    ::mprotect(base + mapped, page, PROT_NONE);
    float* in = reinterpret_cast<float*>(base + mapped - bytes);
    const std::vector<float> contribution = Contribution(comm.rank(), n * size);
    std::copy(contribution.begin(), contribution.end(), in);
    std::vector<float> out(n);
    DT_RETURN_IF_ERROR(comm.ReduceScatter(in, out.data(), n, ReduceOp::kSum));
    const int r = comm.rank();
    DT_RETURN_IF_ERROR(
        Check("sum", out.data(), n, [&](size_t i) { return SumOf(Iota(size), r * n + i); }));
    ::munmap(base, mapped + page);
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_P(GlooCollectiveTest, AllGatherConcatenatesInRankOrder) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    const int r = comm.rank();
    for (size_t n : {size_t{1}, size_t{1027}}) {
      auto gathered = [&](size_t i) { return Value(static_cast<int>(i / n), i % n); };
      const std::vector<float> in = Contribution(r, n);
      std::vector<float> out(n * size, -1.0f);
      DT_RETURN_IF_ERROR(comm.AllGather(in.data(), out.data(), n));
      DT_RETURN_IF_ERROR(Check("gathered", out.data(), n * size, gathered));
      std::vector<float> inout(n * size, -1.0f);
      std::copy(in.begin(), in.end(), inout.begin() + r * n);
      DT_RETURN_IF_ERROR(comm.AllGather(inout.data() + r * n, inout.data(), n));
      DT_RETURN_IF_ERROR(Check("in place", inout.data(), n * size, gathered));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_P(GlooCollectiveTest, BroadcastCopiesTheRootsData) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    constexpr size_t n = 1027;
    for (int root = 0; root < size; ++root) {
      std::vector<float> data =
          comm.rank() == root ? Contribution(root, n) : std::vector<float>(n, -1.0f);
      DT_RETURN_IF_ERROR(comm.Broadcast(data.data(), n, root));
      DT_RETURN_IF_ERROR(Check(fmt::format("root {}", root), data.data(), n,
                               [&](size_t i) { return Value(root, i); }));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_P(GlooCollectiveTest, SendAndRecvAroundARingInBothDirectionsAtOnce) {
  const int size = GetParam();
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    // 4 MiB each way, more than socket buffers hold: if a send waited for its receiver
    // before the receive behind it was posted, every rank would wait forever.
    constexpr size_t n = size_t{1} << 20;
    const int right = (comm.rank() + 1) % size;
    const int left = (comm.rank() + size - 1) % size;
    const std::vector<float> first = Contribution(comm.rank(), n);
    const std::vector<float> second = Contribution(comm.rank() + 10, n);
    std::vector<float> from_left_1(n), from_left_2(n), from_right(n);
    auto send_1 = comm.SendAsync(first.data(), n, right);
    auto send_2 = comm.SendAsync(second.data(), n, right);
    auto recv_1 = comm.RecvAsync(from_left_1.data(), n, left);
    auto recv_2 = comm.RecvAsync(from_left_2.data(), n, left);
    DT_RETURN_IF_ERROR(send_1->Wait());
    DT_RETURN_IF_ERROR(send_2->Wait());
    DT_RETURN_IF_ERROR(recv_1->Wait());
    DT_RETURN_IF_ERROR(recv_2->Wait());
    // Messages between two ranks arrive in the order they were sent.
    DT_RETURN_IF_ERROR(
        Check("first from left", from_left_1.data(), n, [&](size_t i) { return Value(left, i); }));
    DT_RETURN_IF_ERROR(Check("second from left", from_left_2.data(), n,
                             [&](size_t i) { return Value(left + 10, i); }));
    // The blocking forms, the other way round: even ranks send first, odd ranks receive.
    if (size % 2 == 0) {
      if (comm.rank() % 2 == 0) {
        DT_RETURN_IF_ERROR(comm.Send(first.data(), n, left));
        DT_RETURN_IF_ERROR(comm.Recv(from_right.data(), n, right));
      } else {
        DT_RETURN_IF_ERROR(comm.Recv(from_right.data(), n, right));
        DT_RETURN_IF_ERROR(comm.Send(first.data(), n, left));
      }
      DT_RETURN_IF_ERROR(
          Check("from right", from_right.data(), n, [&](size_t i) { return Value(right, i); }));
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_P(GlooCollectiveTest, BarrierWaitsForEveryRank) {
  const int size = GetParam();
  const std::string marks = dir_.path() + "/marks";
  std::filesystem::create_directory(marks);
  Status status = RunGroup(size, [&](Comm& comm) -> Status {
    // Ranks arrive at different times; none may leave before the last has arrived.
    std::this_thread::sleep_for(milliseconds(50 * comm.rank()));
    std::ofstream(fmt::format("{}/{}", marks, comm.rank())).put('x');
    DT_RETURN_IF_ERROR(comm.Barrier());
    for (int q = 0; q < size; ++q) {
      if (!std::filesystem::exists(fmt::format("{}/{}", marks, q))) {
        return Errorf("left the barrier before rank {} arrived", q);
      }
    }
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(GlooCommTest, GroupOfOneReturnsItsOwnData) {
  Status status = RunGroup(1, [&](Comm& comm) -> Status {
    constexpr size_t n = 5;
    std::vector<float> data = Contribution(0, n);
    DT_RETURN_IF_ERROR(comm.AllReduce(data.data(), n, ReduceOp::kAvg));
    std::vector<float> out(n);
    DT_RETURN_IF_ERROR(comm.ReduceScatter(data.data(), out.data(), n, ReduceOp::kSum));
    std::vector<float> gathered(n);
    DT_RETURN_IF_ERROR(comm.AllGather(out.data(), gathered.data(), n));
    DT_RETURN_IF_ERROR(comm.Broadcast(gathered.data(), n, 0));
    DT_RETURN_IF_ERROR(comm.Barrier());
    return Check("group of one", gathered.data(), n, [](size_t i) { return Value(0, i); });
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(GlooCommTest, AsyncOpsOverlapTheCallerAndFinishInOrder) {
  constexpr int kSize = 3;
  Status status = RunGroup(kSize, [&](Comm& comm) -> Status {
    // Eight gradient buckets of different sizes, then a sharded step's reduce-scatter
    // and all-gather, all in flight before the first wait.
    std::vector<std::vector<float>> buckets;
    std::vector<std::unique_ptr<CommWork>> work;
    for (int b = 0; b < 8; ++b) {
      buckets.push_back(Contribution(comm.rank() + b, 4099 + 100 * b));
      work.push_back(comm.AllReduceAsync(buckets[b].data(), buckets[b].size(), ReduceOp::kSum));
    }
    constexpr size_t n = 2048;
    const std::vector<float> in = Contribution(comm.rank(), n * kSize);
    std::vector<float> shard(n), gathered(n * kSize);
    work.push_back(comm.ReduceScatterAsync(in.data(), shard.data(), n, ReduceOp::kAvg));
    work.push_back(comm.AllGatherAsync(shard.data(), gathered.data(), n));
    for (auto it = work.rbegin(); it != work.rend(); ++it)
      DT_RETURN_IF_ERROR((*it)->Wait());
    for (int b = 0; b < 8; ++b) {
      DT_RETURN_IF_ERROR(
          Check(fmt::format("bucket {}", b), buckets[b].data(), buckets[b].size(), [&](size_t i) {
            return SumOf({b, b + 1, b + 2}, i);
          }));
    }
    // The all-gather ran after the reduce-scatter: it gathered every rank's averaged shard.
    return Check("gathered shards", gathered.data(), n * kSize,
                 [&](size_t i) { return SumOf(Iota(kSize), i) / kSize; });
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(GlooCommTest, TwoGroupsInOneProcess) {
  // Four ranks, each in the world group and in one of two data-parallel pairs.
  constexpr int kSize = 4;
  RankProcesses ranks(dir_.path(), kSize, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> world, Join(store, "world", Iota(kSize), me));
    const std::vector<int> pair = {me % 2, me % 2 + 2};
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Comm> dp, Join(store, "dp", pair, me));
    if (dp->name() != GroupName("dp", pair)) return Errorf("group named '{}'", dp->name());
    constexpr size_t n = 1027;
    std::vector<float> world_data = Contribution(me, n);
    std::vector<float> dp_data = Contribution(me, n);
    auto world_work = world->AllReduceAsync(world_data.data(), n, ReduceOp::kSum);
    auto dp_work = dp->AllReduceAsync(dp_data.data(), n, ReduceOp::kSum);
    DT_RETURN_IF_ERROR(dp_work->Wait());
    DT_RETURN_IF_ERROR(world_work->Wait());
    DT_RETURN_IF_ERROR(
        Check("world", world_data.data(), n, [&](size_t i) { return SumOf(Iota(kSize), i); }));
    return Check("dp", dp_data.data(), n, [&](size_t i) { return SumOf(pair, i); });
  });
  Status status = ranks.WaitAll(kProcessLimit);
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(GlooCommTest, GroupNamesShortenLongProgressions) {
  EXPECT_EQ(GroupName("dp", {0, 2}), "dp[0,2]");
  EXPECT_EQ(GroupName("tp", {0, 1, 2, 3}), "tp[0,1,2,3]");
  EXPECT_EQ(GroupName("dp", {0, 8, 16, 24, 32}), "dp[0,8,..,32]");
  EXPECT_EQ(GroupName("dp-cp", {0, 1, 8, 9, 16}), "dp-cp[0,1,8,9,16]");
}

// --- Failures: an error that names the group, the op and the missing rank; no hang. ---

// The longest a failing collective may take: its timeout, the grace in which it waits to
// hear from the others, and slack for a loaded machine.
constexpr milliseconds kFailureBound = kShortTimeout + kShortTimeout / 4 + milliseconds(1500);

// In a rank process: runs an all-reduce that is expected to fail, checks that it failed
// in time and that the broken communicator then refuses work at once; returns the error.
Status AllReduceExpectingFailure(Comm& comm) {
  std::vector<float> data(1027, 1.0f);
  const Clock::time_point start = Clock::now();
  Status status = comm.AllReduce(data.data(), data.size(), ReduceOp::kSum);
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  if (status.ok()) return Status::Error("all_reduce succeeded without a rank");
  if (elapsed > kFailureBound)
    return Errorf("failed only after {} ms: {}", elapsed.count(), status.message());
  const Clock::time_point after = Clock::now();
  Status later = comm.Barrier();
  if (later.ok() || Clock::now() - after > milliseconds(500) ||
      later.message().find("failed earlier") == std::string::npos) {
    return Errorf("the broken communicator accepted a barrier: {}", later.message());
  }
  return status;
}

TEST_F(GlooCommTest, RendezvousTimeoutNamesTheRankThatNeverStarted) {
  RankProcesses ranks(dir_.path(), 3, {0, 1}, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    Result<std::unique_ptr<Comm>> comm = Join(store, "world", Iota(3), me, milliseconds(1000));
    return comm.ok() ? Status::Error("rendezvous succeeded without rank 2") : comm.status();
  });
  for (int r : {0, 1}) {
    EXPECT_THAT(ranks.Wait(r, kProcessLimit).message(),
                AllOf(HasSubstr("world[0,1,2]: rendezvous of rank"), HasSubstr("1000 ms"),
                      HasSubstr("ranks that did not arrive: 2")));
  }
}

TEST_F(GlooCommTest, RankKilledBeforeACollectiveIsNamed) {
  RankProcesses ranks(dir_.path(), 3, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    DT_ASSIGN_OR_RETURN(auto comm, Join(store, "world", Iota(3), me, kShortTimeout));
    DT_RETURN_IF_ERROR(comm->Barrier());
    if (me == 2) ::raise(SIGKILL);
    return AllReduceExpectingFailure(*comm);
  });
  for (int r : {0, 1}) {
    EXPECT_THAT(ranks.Wait(r, kProcessLimit).message(),
                AllOf(HasSubstr("world[0,1,2]: all_reduce #2 (1027 floats) failed on rank"),
                      HasSubstr("missing ranks: 2 (never started it)")));
  }
  EXPECT_THAT(ranks.Wait(2, kProcessLimit).message(), HasSubstr("signal 9"));
}

// Regression: Gloo writes without MSG_NOSIGNAL, and a neighbour of a killed rank used to
// die of SIGPIPE (now and then, in RankKilledBeforeACollectiveIsNamed) instead of
// reporting the lost rank.
TEST_F(GlooCommTest, CreatingACommunicatorIgnoresSigpipe) {
  Status status = RunGroup(2, [&](Comm&) -> Status {
    struct sigaction action;
    ::sigaction(SIGPIPE, nullptr, &action);
    return action.sa_handler == SIG_IGN ? Status::Ok() : Status::Error("SIGPIPE not ignored");
  });
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(GlooCommTest, RankKilledInsideACollectiveIsNamed) {
  RankProcesses ranks(dir_.path(), 3, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    DT_ASSIGN_OR_RETURN(auto comm, Join(store, "world", Iota(3), me, kShortTimeout));
    DT_RETURN_IF_ERROR(comm->Barrier());
    if (me == 2) {
      // Rank 0 comes late, so rank 2 is still inside the all-reduce when it dies, long
      // enough after entering it for its progress to have reached the store.
      std::vector<float> data(1027, 1.0f);
      auto work = comm->AllReduceAsync(data.data(), data.size(), ReduceOp::kSum);
      std::this_thread::sleep_for(milliseconds(500));
      ::raise(SIGKILL);
    }
    if (me == 0) std::this_thread::sleep_for(milliseconds(800));
    return AllReduceExpectingFailure(*comm);
  });
  for (int r : {0, 1}) {
    EXPECT_THAT(ranks.Wait(r, kProcessLimit).message(),
                AllOf(HasSubstr("world[0,1,2]: all_reduce #2"),
                      HasSubstr("missing ranks: 2 (started it, then went silent)")));
  }
}

TEST_F(GlooCommTest, HungRankTimesOutAndIsNamed) {
  // A stopped process keeps its sockets open: the others learn nothing from the network
  // and must rely on the timeout.
  RankProcesses ranks(dir_.path(), 3, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    DT_ASSIGN_OR_RETURN(auto comm, Join(store, "world", Iota(3), me, kShortTimeout));
    DT_RETURN_IF_ERROR(comm->Barrier());
    if (me == 2) ::raise(SIGSTOP);
    return AllReduceExpectingFailure(*comm);
  });
  for (int r : {0, 1}) {
    EXPECT_THAT(ranks.Wait(r, kProcessLimit).message(),
                AllOf(HasSubstr("world[0,1,2]: all_reduce #2"), HasSubstr("timeout 1500 ms"),
                      HasSubstr("missing ranks: 2 (never started it)")));
  }
  ranks.Kill(2);
}

TEST_F(GlooCommTest, RecvFromARankThatNeverSendsTimesOut) {
  RankProcesses ranks(dir_.path(), 2, [&](int me) -> Status {
    DT_ASSIGN_OR_RETURN(FileStore store, OpenStore());
    DT_ASSIGN_OR_RETURN(auto comm, Join(store, "pp", {0, 1}, me, kShortTimeout));
    if (me == 1) return Status::Ok();
    std::vector<float> data(16);
    Status status = comm->Recv(data.data(), data.size(), 1);
    return status.ok() ? Status::Error("recv succeeded without a sender") : status;
  });
  EXPECT_THAT(ranks.Wait(0, kProcessLimit).message(),
              HasSubstr("pp[0,1]: recv of 16 floats from rank 1 on rank 0 failed after"));
  EXPECT_TRUE(ranks.Wait(1, kProcessLimit).ok());
}

}  // namespace
}  // namespace difftrain::parallel
