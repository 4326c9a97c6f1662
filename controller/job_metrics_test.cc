#include "controller/job_metrics.h"

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "tests/testing/promtool.h"

namespace difftrain::controller {
namespace {

JobSnapshot::Rank RankAt(const char* node, int64_t step, double step_seconds,
                         double compute_seconds) {
  JobSnapshot::Rank r;
  r.node = node;
  r.step = step;
  r.step_seconds = step_seconds;
  r.compute_seconds = compute_seconds;
  r.samples_per_second = 8 / step_seconds;
  return r;
}

TEST(FindStragglerTest, SlowestBusyTimeOverTheMedian) {
  // Equal wall times (the fast ranks wait in collectives); rank 2 computes twice as long.
  const std::vector<JobSnapshot::Rank> ranks = {RankAt("a", 3, 1.0, 0.5), RankAt("a", 3, 1.0, 0.5),
                                                RankAt("b", 3, 1.0, 1.0), RankAt("b", 3, 1.0, 0.5)};
  const Straggler s = FindStraggler(ranks);
  EXPECT_EQ(s.rank, 2);
  EXPECT_DOUBLE_EQ(s.ratio, 2.0);
}

TEST(FindStragglerTest, StepSecondsWithoutComputeSecondsAndNothingBeforeAStep) {
  EXPECT_EQ(FindStraggler({RankAt("a", -1, 0, 0), RankAt("a", 0, 0, 0)}).rank, -1);
  const Straggler s = FindStraggler({RankAt("a", 2, 0.3, 0), RankAt("a", 2, 0.1, 0)});
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.ratio, 3.0);
}

TEST(JobMetricsTest, SnapshotBecomesTheJobsSeries) {
  Result<Topology> topology = Topology::Create(2, 1, 2, 1);
  ASSERT_TRUE(topology.ok());
  JobMetrics metrics("dit", *topology, 1e9);
  JobSnapshot s;
  s.state = "RENDEZVOUS";
  s.world = 4;
  s.workers_expected = 2;
  s.heartbeat_age_seconds = {{"n0", 0.1}, {"n1", 0.2}};
  metrics.Publish(s);
  s.state = "RUNNING";
  s.restarts = 1;
  s.heartbeat_age_seconds.erase("n1");
  s.ranks = {RankAt("n0", 7, 0.5, 0.2), RankAt("n0", 7, 0.5, 0.2), RankAt("n1", 7, 0.5, 0.4),
             RankAt("n1", 6, 0.5, 0.2)};
  s.dropped_by_reason = {{"malformed", 2}};
  metrics.Publish(s);
  const std::string text = SerializeMetrics(*metrics.registry());
  for (
      const char* line : {
          R"(difftrain_job_state{job="dit",state="RENDEZVOUS"} 0)",
          R"(difftrain_job_state{job="dit",state="RUNNING"} 1)",
          R"(difftrain_job_world_size{job="dit"} 4)",
          R"(difftrain_job_workers_up{job="dit"} 1)",
          R"(difftrain_job_restarts_total{job="dit"} 1)",
          R"(difftrain_job_heartbeat_age_seconds{job="dit",node="n0"} 0.1)",
          R"(difftrain_job_iteration{job="dit"} 6)",
          R"(difftrain_job_samples_per_second{job="dit"} 16)",
          R"(difftrain_job_model_flops_per_second{job="dit"} 16000000000)",
          R"(difftrain_job_straggler_ratio{cp="0",dp="1",job="dit",node="n1",pp="0",rank="2",tp="0"} 2)",
          R"(difftrain_controller_dropped_messages_total{job="dit",reason="malformed"} 2)",
      }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  // A lost daemon's heartbeat series is gone.
  EXPECT_EQ(text.find(R"(node="n1"} 0.2)"), std::string::npos) << text;
  // Ranks that report their FLOP/s (a bucketed step's at its own size): the slowest rank's
  // times the world, not samples/s times the model's FLOPs.
  for (JobSnapshot::Rank& r : s.ranks)
    r.flops_per_second = 3e9;
  metrics.Publish(s);
  EXPECT_NE(SerializeMetrics(*metrics.registry())
                .find(R"(difftrain_job_model_flops_per_second{job="dit"} 12000000000)"),
            std::string::npos);
  const testing::CommandResult lint = testing::PromtoolCheckMetrics(text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;
}

}  // namespace
}  // namespace difftrain::controller
