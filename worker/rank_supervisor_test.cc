#include "worker/rank_supervisor.h"

#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "worker/rank_metrics.h"

namespace difftrain::worker {
namespace {

using std::chrono::milliseconds;

// A rank that is a shell script (the daemon starts `difftrain train` the same way).
std::vector<std::string> Shell(const std::string& script) {
  return {"/bin/sh", "-c", script};
}

// Runs the daemon's loop (read the pipes, reap) until `done` holds or 20 s have passed.
std::vector<RankExit> Pump(RankSupervisor& ranks, const std::function<bool()>& done) {
  std::vector<RankExit> exits;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    ranks.ReadProgress();
    for (const RankExit& e : ranks.Reap())
      exits.push_back(e);
    if (done()) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return exits;
}

std::vector<RankExit> UntilAllExited(RankSupervisor& ranks) {
  return Pump(ranks, [&] { return ranks.empty(); });
}

// The step the rank last reported, -2 when none.
int64_t StepOf(const RankSupervisor& ranks, int rank) {
  for (const nlohmann::json& r : ranks.Progress())
    if (r["rank"] == rank) return r["step"].get<int64_t>();
  return -2;
}

TEST(RankSupervisorTest, ExitCodesAndSignalsAreReportedPerRank) {
  RankSupervisor ranks("n0", nullptr);
  ASSERT_TRUE(ranks.Start(0, Shell("exit 0"), {}).ok());
  ASSERT_TRUE(ranks.Start(4, Shell("exit 7"), {}).ok());
  ASSERT_TRUE(ranks.Start(5, Shell("kill -TERM $$"), {}).ok());
  EXPECT_EQ(ranks.List(), "0,4,5");
  std::vector<RankExit> exits = UntilAllExited(ranks);
  ASSERT_EQ(exits.size(), 3u);
  std::sort(exits.begin(), exits.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_EQ(exits[0].signal, 0);
  EXPECT_EQ(exits[1].exit_code, 7);
  EXPECT_EQ(exits[1].signal, 0);
  EXPECT_EQ(exits[2].exit_code, 0);
  EXPECT_EQ(exits[2].signal, SIGTERM);
  for (const RankExit& e : exits)
    EXPECT_FALSE(e.oom_killed) << e.rank;
  EXPECT_EQ(ranks.List(), "");
}

TEST(RankSupervisorTest, TheEnvironmentIsInheritedWithTheRanksVariablesOnTop) {
  ASSERT_EQ(::setenv("DIFFTRAIN_TEST_INHERITED", "4", 1), 0);
  ASSERT_EQ(::setenv("RANK", "9", 1), 0);  // the daemon's own, replaced
  RankSupervisor ranks("n0", nullptr);
  ASSERT_TRUE(
      ranks
          .Start(3,
                 Shell("[ \"$DIFFTRAIN_PROGRESS_FD\" = 3 ] || exit 99; "
                       "[ \"$(tr '\\0' '\\n' < /proc/$$/environ | grep -c '^RANK=')\" = 1 ] "
                       "|| exit 98; "
                       "exit $((RANK * 10 + DIFFTRAIN_TEST_INHERITED))"),
                 {{"RANK", "3"}})
          .ok());
  const std::vector<RankExit> exits = UntilAllExited(ranks);
  ::unsetenv("DIFFTRAIN_TEST_INHERITED");
  ::unsetenv("RANK");
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit_code, 34);
}

TEST(RankSupervisorTest, AProgramThatCannotRunEndsWith127AndNoneIsRefused) {
  RankSupervisor ranks("n0", nullptr);
  ASSERT_TRUE(ranks.Start(2, {"/nonexistent/difftrain", "train"}, {}).ok());
  const std::vector<RankExit> exits = UntilAllExited(ranks);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 2);
  EXPECT_EQ(exits[0].exit_code, 127);

  const Status none = ranks.Start(1, {}, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("rank 1: no program"), std::string::npos) << none.message();
  EXPECT_TRUE(ranks.empty());
}

TEST(RankSupervisorTest, ProgressIsTheLastObjectLineAndCountsInTheMetrics) {
  RankMetrics metrics;
  metrics.SetJob("dit", "n0");
  RankSupervisor ranks("n0", &metrics);
  // Lines that are not JSON or not objects around two steps; the rank then closes its pipe
  // and waits to be killed.
  ASSERT_TRUE(ranks
                  .Start(1,
                         Shell("echo 'not json' >&3; echo '[1]' >&3; "
                               "echo '{\"step\": 4, \"loss\": 0.5}' >&3; "
                               "echo '{\"step\": 5, \"loss\": 0.25, \"step_seconds\": 2}' >&3; "
                               "echo '[2]' >&3; echo 7 >&3; exec 3>&-; exec sleep 60"),
                         {})
                  .ok());
  Pump(ranks, [&] { return ranks.ProgressFds().empty(); });
  const nlohmann::json progress = ranks.Progress();
  ASSERT_EQ(progress.size(), 1u) << progress.dump();
  EXPECT_EQ(progress[0]["step"], 5);
  EXPECT_EQ(progress[0]["loss"], 0.25);
  EXPECT_EQ(progress[0]["step_seconds"], 2.0);
  EXPECT_EQ(progress[0]["samples_per_second"], 0.0);  // not reported: 0
  EXPECT_GT(progress[0]["pid"].get<int>(), 0);
  std::string text = SerializeMetrics(*metrics.registry());
  EXPECT_NE(text.find(R"(difftrain_worker_ranks_running{job="dit",node="n0"} 1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("difftrain_rank_loss{"), std::string::npos) << text;

  ranks.KillLeft("the test is over", spdlog::level::info);
  const std::vector<RankExit> exits = UntilAllExited(ranks);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGKILL);
  EXPECT_FALSE(exits[0].oom_killed);  // this daemon sent it
  text = SerializeMetrics(*metrics.registry());
  EXPECT_NE(text.find(R"(difftrain_worker_ranks_running{job="dit",node="n0"} 0)"),
            std::string::npos)
      << text;
}

TEST(RankSupervisorTest, WhatARankWroteJustBeforeItExitedIsRead) {
  // Reaped before its pipe was ever read: Reap reads it first. The progress itself goes
  // with the rank, so the metrics are what can see it.
  RankMetrics metrics;
  metrics.SetJob("dit", "n0");
  RankSupervisor watched("n0", &metrics);
  ASSERT_TRUE(watched.Start(6, Shell("echo '{\"step\": 3, \"loss\": 0.125}' >&3"), {}).ok());
  std::vector<RankExit> exits;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (exits.empty() && std::chrono::steady_clock::now() < deadline) {
    exits = watched.Reap();  // no ReadProgress
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(exits.size(), 1u);
  const std::string text = SerializeMetrics(*metrics.registry());
  EXPECT_NE(text.find(R"(difftrain_rank_iteration{)"), std::string::npos) << text;
  EXPECT_NE(text.find("} 0.125"), std::string::npos) << text;
}

TEST(RankSupervisorTest, AnOverlongUnfinishedLineIsDroppedAndLaterLinesStillCount) {
  RankSupervisor ranks("n0", nullptr);
  // 5,000 bytes without a newline, then (a moment later) a line of its own.
  ASSERT_TRUE(ranks
                  .Start(0,
                         Shell("head -c 5000 /dev/zero | tr '\\0' x >&3; sleep 0.5; "
                               "echo '{\"step\": 8}' >&3; exec sleep 60"),
                         {})
                  .ok());
  Pump(ranks, [&] { return StepOf(ranks, 0) == 8; });
  EXPECT_EQ(StepOf(ranks, 0), 8) << "the unfinished line was kept and swallowed the next";
  ranks.KillLeft("the test is over", spdlog::level::info);
  UntilAllExited(ranks);
}

TEST(RankSupervisorTest, KillAllLeavesNoProcessAndReportsNothing) {
  RankSupervisor ranks("n0", nullptr);
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(ranks.Start(r, Shell("echo '{\"step\": 0}' >&3; exec sleep 60"), {}).ok());
  Pump(ranks, [&] { return ranks.Progress().size() == 3; });
  std::vector<pid_t> pids;
  for (const nlohmann::json& r : ranks.Progress())
    pids.push_back(r["pid"].get<pid_t>());
  ASSERT_EQ(pids.size(), 3u);
  const auto before = std::chrono::steady_clock::now();
  ranks.KillAll();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(5));
  EXPECT_TRUE(ranks.empty());
  EXPECT_TRUE(ranks.Reap().empty());
  for (pid_t pid : pids) {
    EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(RankSupervisorTest, ARankLeadsItsOwnProcessGroup) {
  RankSupervisor ranks("n0", nullptr);
  ASSERT_TRUE(
      ranks.Start(0, Shell("[ \"$(cut -d' ' -f5 /proc/$$/stat)\" = \"$$\" ] && exit 0; exit 1"), {})
          .ok());
  const std::vector<RankExit> exits = UntilAllExited(ranks);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit_code, 0) << "a terminal's Ctrl-C would reach the rank directly";
}

}  // namespace
}  // namespace difftrain::worker
