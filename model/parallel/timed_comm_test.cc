#include "model/parallel/timed_comm.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace difftrain::parallel {
namespace {

using namespace std::chrono_literals;

// A group of one whose ops take 20 ms to complete after they are posted.
class SlowComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<CommWork> AllReduceAsync(float*, size_t, ReduceOp) override { return Work(); }
  std::unique_ptr<CommWork> ReduceScatterAsync(const float*, float*, size_t, ReduceOp) override {
    return Work();
  }
  std::unique_ptr<CommWork> AllGatherAsync(const float*, float*, size_t) override { return Work(); }
  std::unique_ptr<CommWork> BroadcastAsync(float*, size_t, int) override { return Work(); }
  std::unique_ptr<CommWork> SendAsync(const float*, size_t, int) override { return Work(); }
  std::unique_ptr<CommWork> RecvAsync(float*, size_t, int) override { return Work(); }
  std::unique_ptr<CommWork> BarrierAsync() override { return Work(); }

 private:
  class Done : public CommWork {
   public:
    Status Wait() override {
      std::this_thread::sleep_until(done_);
      return Status::Ok();
    }

   private:
    std::chrono::steady_clock::time_point done_ = std::chrono::steady_clock::now() + 20ms;
  };
  static std::unique_ptr<CommWork> Work() { return std::make_unique<Done>(); }
  std::string name_ = "dp[0]";
};

TEST(TimedCommTest, CountsOnlyTheTimeTheCallerWaits) {
  CommTimes times;
  std::unique_ptr<Comm> comm = TimeComm(std::make_unique<SlowComm>(), times);
  EXPECT_EQ(comm->name(), "dp[0]");
  float x = 1;
  ASSERT_TRUE(comm->AllReduce(&x, 1, ReduceOp::kSum).ok());
  // Computing while an op runs costs nothing: the wait after 30 ms of work is free.
  std::unique_ptr<CommWork> work = comm->BarrierAsync();
  std::this_thread::sleep_for(30ms);
  ASSERT_TRUE(work->Wait().ok());
  const CommTimes::Table table = times.Take();
  EXPECT_GE(table.at("dp").at("all_reduce"), 0.015);
  EXPECT_LT(table.at("dp").at("barrier"), 0.01);
  EXPECT_TRUE(times.Take().empty());
}

}  // namespace
}  // namespace difftrain::parallel
