// Faults that used to hang a job, end to end with real daemons and real signals: a rank
// stopped with SIGSTOP while the job stops or runs, a controller killed with kill -9 and
// started again. Each job must end by itself within its deadlines, and a job that goes on
// must end with the parameters of an uninterrupted run, bit for bit.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/curve.h"
#include "common/temp_dir.h"
#include "tests/testing/cluster_job.h"
#include "tests/testing/http.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using testing::ChildrenOf;
using testing::ClusterJob;
using testing::ClusterJobSpec;
using testing::Process;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = (fs::path(dir_.path()) / "keys").string();
    ASSERT_TRUE(WriteNewKeys(keys_).ok());
    // The daemons' work directories (and what a killed one leaves) go with the test's.
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
  }

  std::unique_ptr<ClusterJob> MakeJob(const std::string& name, const ClusterJobSpec& spec) {
    return std::make_unique<ClusterJob>(fs::path(dir_.path()) / name, spec,
                                        "ipc://" + dir_.path() + "/" + name + ".sock", keys_);
  }

  // Runs `spec` without faults; its final checkpoint is what every faulted run must end with.
  std::map<std::string, std::string> Reference(const ClusterJobSpec& spec) {
    std::unique_ptr<ClusterJob> job = MakeJob("reference", spec);
    std::unique_ptr<Process> controller = job->StartController();
    std::vector<std::unique_ptr<Process>> workers;
    for (const std::string& node : job->NodeNames())
      workers.push_back(job->StartWorker(node));
    EXPECT_EQ(controller->Wait(), 0) << job->Logs();
    int64_t step = 0;
    std::map<std::string, std::string> state = job->NewestCheckpoint(&step);
    EXPECT_EQ(step, spec.steps);
    EXPECT_FALSE(state.empty());
    return state;
  }

  testing::RestoredEnv tmpdir_{"TMPDIR"};  // before dir_, which TMPDIR points into
  TempDir dir_;
  std::string keys_;
};

// The defect of issue 24: a rank killed (the job restarts), a rank of the new attempt
// stopped with SIGSTOP, then SIGTERM to the controller. The stopped rank never finishes
// its step, the others leave with a collective timeout, and the controller waited for the
// stopped one for ever. Now its daemon kills it restart.stop_grace_seconds after the stop
// and the controller exits 75; the next run resumes and ends where an uninterrupted one does.
TEST_F(FaultTest, StoppedRankDuringACheckpointStopIsKilledAfterTheGraceAndTheJobExits75) {
  ClusterJobSpec spec;
  spec.steps = 400;
  const auto reference = Reference(spec);
  std::unique_ptr<ClusterJob> job = MakeJob("stopped-rank", spec);
  std::unique_ptr<Process> controller = job->StartController();
  std::unique_ptr<Process> workers[2] = {job->StartWorker("n0"), job->StartWorker("n1")};
  ASSERT_TRUE(job->WaitForSteps(6)) << job->Logs();
  const std::vector<pid_t> first = ChildrenOf(workers[1]->pid(), "train");
  ASSERT_EQ(first.size(), 2u);
  ::kill(first[1], SIGKILL);
  const std::vector<pid_t> second = testing::WaitForNewRanks(workers[1]->pid(), 2, first);
  ASSERT_EQ(second.size(), 2u) << job->Logs();
  std::this_thread::sleep_for(1s);
  ::kill(second[0], SIGSTOP);
  std::this_thread::sleep_for(1s);
  const auto stopped_at = Clock::now();
  controller->Signal(SIGTERM);
  // Deadlines: the collective timeout (6 s) for the others, the grace (4 s) for the
  // stopped one, then the reports.
  const int code = controller->Wait(60s);
  const double took = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  for (auto& w : workers)
    w->Wait(30s);
  const std::string log = job->Logs();
  ASSERT_EQ(code, 75) << log;
  EXPECT_LT(took, 20) << log;
  EXPECT_NE(log.find("-> CHECKPOINTED"), std::string::npos) << log;
  EXPECT_NE(log.find("killed with SIGKILL: still running restart.stop_grace_seconds"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("run the job again to resume from the newest complete checkpoint, step"),
            std::string::npos)
      << log;
  int64_t step = 0;
  EXPECT_FALSE(job->NewestCheckpoint(&step).empty());

  // The requeued run resumes and ends bit for bit where the uninterrupted one ended.
  controller = job->StartController();
  workers[0] = job->StartWorker("n0");
  workers[1] = job->StartWorker("n1");
  ASSERT_EQ(controller->Wait(), 0) << job->Logs();
  EXPECT_NE(job->Logs().find("resumed from step " + std::to_string(step)), std::string::npos);
  testing::ExpectIdenticalTensors(job->NewestCheckpoint(&step), reference);
}

// A daemon that stops answering (here: stopped with SIGSTOP) while the ranks checkpoint
// cannot report its ranks' exits. The job used to end FAILED (exit 1); the stop goes on
// without it, and the job ends 75 so that a requeue resumes it.
TEST_F(FaultTest, DaemonLostDuringACheckpointStopStillEnds75) {
  ClusterJobSpec spec;
  spec.steps = 400;
  std::unique_ptr<ClusterJob> job = MakeJob("lost-daemon", spec);
  std::unique_ptr<Process> controller = job->StartController();
  std::unique_ptr<Process> workers[2] = {job->StartWorker("n0"), job->StartWorker("n1")};
  ASSERT_TRUE(job->WaitForSteps(6)) << job->Logs();
  workers[1]->Signal(SIGSTOP);
  controller->Signal(SIGTERM);
  const int code = controller->Wait(60s);
  workers[1]->Signal(SIGCONT);
  for (auto& w : workers)
    w->Wait(30s);
  const std::string log = job->Logs();
  ASSERT_EQ(code, 75) << log;
  EXPECT_NE(log.find("node n1 lost while the ranks checkpointed"), std::string::npos) << log;
}

// A one-rank job has no collective to time out: a rank stopped with SIGSTOP (stuck in I/O
// or in a driver) hangs the job unless the progress watchdog sees its step stand still.
TEST_F(FaultTest, WatchdogRestartsAOneRankJobWhoseRankStopsMoving) {
  ClusterJobSpec spec;
  spec.nodes = 1;
  spec.devices_per_node = 1;
  spec.micro = 2;
  spec.steps = 400;
  spec.restart = "stop_grace_seconds: 4, hang_seconds: 2";
  const int port = testing::FreePort();
  spec.extra = "metrics: {port: " + std::to_string(port) + "}\n";
  const auto reference = Reference(spec);
  std::unique_ptr<ClusterJob> job = MakeJob("hung-rank", spec);
  std::unique_ptr<Process> controller = job->StartController();
  std::unique_ptr<Process> worker = job->StartWorker("n0");
  ASSERT_TRUE(job->WaitForSteps(6)) << job->Logs();
  const std::vector<pid_t> ranks = ChildrenOf(worker->pid(), "train");
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(ranks[0], SIGSTOP);
  ASSERT_TRUE(job->WaitForLog("RUNNING -> RESTARTING")) << job->Logs();
  // The hung rank is named in the metrics too.
  Result<std::string> metrics = testing::HttpGet(port, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status().message();
  EXPECT_NE(metrics->find("difftrain_job_rank_hangs_total{job=\"job\",node=\"n0\",rank=\"0\"} 1"),
            std::string::npos)
      << *metrics;
  ASSERT_EQ(controller->Wait(), 0) << job->Logs();
  const std::string log = job->Logs();
  EXPECT_NE(log.find("rank 0 on node n0 is hung: its step"), std::string::npos) << log;
  EXPECT_NE(log.find("made no progress for"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 1"), std::string::npos) << log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(job->NewestCheckpoint(&step), reference);
}

// A controller killed with kill -9 and started again with the same job (a requeue, a
// restarted pod) finds the daemons that reconnect, and the job resumes from the newest
// complete checkpoint.
TEST_F(FaultTest, KilledControllerStartedAgainResumesWithTheDaemonsThatReconnect) {
  ClusterJobSpec spec;
  spec.steps = 120;
  const auto reference = Reference(spec);
  std::unique_ptr<ClusterJob> job = MakeJob("killed-controller", spec);
  std::unique_ptr<Process> controller = job->StartController();
  std::unique_ptr<Process> workers[2] = {job->StartWorker("n0"), job->StartWorker("n1")};
  ASSERT_TRUE(job->WaitForSteps(10)) << job->Logs();
  controller->Signal(SIGKILL);
  EXPECT_EQ(controller->Wait(), -1);
  std::this_thread::sleep_for(500ms);
  controller = job->StartController();
  ASSERT_EQ(controller->Wait(), 0) << job->Logs();
  for (auto& w : workers)
    EXPECT_EQ(w->Wait(30s), 0);
  const std::string log = job->Logs();
  EXPECT_NE(log.find("a new connection to the controller"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 0"), std::string::npos) << log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(job->NewestCheckpoint(&step), reference);
}

}  // namespace
}  // namespace difftrain
