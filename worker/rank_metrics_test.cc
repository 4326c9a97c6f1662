#include "worker/rank_metrics.h"

#include <unistd.h>

#include <ctime>

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "tests/testing/promtool.h"

namespace difftrain::worker {
namespace {

RankReport Step(int rank, int64_t step, double loss) {
  RankReport r;
  r.rank = rank;
  r.tp = rank % 2;
  r.dp = rank / 2;
  r.step = step;
  r.loss = loss;
  r.epoch = 0.125 * static_cast<double>(step);
  r.step_seconds = 0.2;
  r.samples_per_second = 40;
  r.flops_per_second = 1e9;
  r.peak_flops_per_second = 4e9;
  r.mfu = 0.25;
  r.data_wait_seconds = 0.01;
  r.comm_seconds["dp"]["all_reduce"] = 0.05;
  r.comm_seconds["tp"]["all_gather"] = 0.02;
  r.device_memory_allocated_bytes = r.device_memory_reserved_bytes = 1000;
  r.host_resident_bytes = 5000;
  return r;
}

class RankMetricsTest : public ::testing::Test {
 protected:
  RankMetricsTest() { metrics_.SetJob("dit", "n0"); }
  std::string Text() const { return SerializeMetrics(*metrics_.registry()); }
  RankMetrics metrics_;
};

TEST_F(RankMetricsTest, StepsBecomeSeriesWithTheRanksLabels) {
  metrics_.Record(Step(0, 1, 0.5));
  metrics_.Record(Step(1, 1, 0.5));
  metrics_.Record(Step(0, 2, 0.25));
  metrics_.SetRanksRunning(2);
  const std::string text = Text();
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_loss{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 0.25)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_iteration{cp="0",dp="0",job="dit",node="n0",pp="0",rank="1",tp="1"} 1)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_step_seconds_count{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 2)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_epoch{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 0.25)"),
      std::string::npos)
      << text;
  // Counters add up the steps' seconds.
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_comm_seconds_total{cp="0",dp="0",group="dp",job="dit",node="n0",op="all_reduce",pp="0",rank="0",tp="0"} 0.1)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(difftrain_worker_ranks_running{job="dit",node="n0"} 2)"),
            std::string::npos)
      << text;
  const testing::CommandResult lint = testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;
}

TEST_F(RankMetricsTest, ARestartedRankContinuesItsSeries) {
  metrics_.Record(Step(0, 5, 0.5));
  metrics_.RankExited(0);
  EXPECT_NE(Text().find(
                R"(difftrain_rank_up{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 0)"),
            std::string::npos);
  RankReport started = Step(0, 4, 0);
  started.event = "started";
  started.last_checkpoint_step = 4;
  metrics_.Record(started);
  const std::string text = Text();
  EXPECT_NE(
      text.find(R"(difftrain_rank_up{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 1)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_last_checkpoint_step{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 4)"),
      std::string::npos)
      << text;
  // A start is no step: the histogram and the counters did not move.
  EXPECT_NE(
      text.find(
          R"(difftrain_rank_step_seconds_count{cp="0",dp="0",job="dit",node="n0",pp="0",rank="0",tp="0"} 1)"),
      std::string::npos)
      << text;
}

// The time of the last checkpoint moves when a new checkpoint is reported, not with each step.
TEST_F(RankMetricsTest, CheckpointTimestampIsTheTimeOfTheLastNewCheckpoint) {
  const auto timestamp = [&] {
    const std::string text = Text();
    const std::string name = "\ndifftrain_rank_last_checkpoint_timestamp_seconds{";
    const size_t line = text.find(name);
    EXPECT_NE(line, std::string::npos) << text;
    return std::stod(text.substr(text.find("} ", line) + 2));
  };
  const double before = static_cast<double>(std::time(nullptr));
  RankReport first = Step(0, 1, 0.5);
  first.last_checkpoint_step = -1;
  metrics_.Record(first);
  const double started = timestamp();
  EXPECT_GE(started, before);
  EXPECT_LE(started, before + 5);
  sleep(1);
  RankReport second = Step(0, 2, 0.5);
  second.last_checkpoint_step = -1;
  metrics_.Record(second);
  EXPECT_EQ(timestamp(), started) << "no new checkpoint";
  RankReport third = Step(0, 3, 0.5);
  third.last_checkpoint_step = 3;
  metrics_.Record(third);
  EXPECT_GT(timestamp(), started);
}

}  // namespace
}  // namespace difftrain::worker
