// A network partition, for real: the controller and each worker daemon run in a network
// namespace of their own (`ip netns`), joined by veth pairs to a bridge in a fourth one,
// each with its own address (10.224.0.0/24, which exists only inside these namespaces).
// Cutting a node's link mid-run must make its daemon kill its own ranks, the job restart
// once the node is back, and the job end bit for bit where an uninterrupted run ends.
// Without the rights to make namespaces (not root, no iproute2) the test skips, saying why.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/curve.h"
#include "common/temp_dir.h"
#include "tests/testing/cluster_job.h"
#include "tests/testing/network.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::ChildrenOf;
using testing::ClusterJob;
using testing::ClusterJobSpec;
using testing::Network;
using testing::Process;

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = Network::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    keys_ = (fs::path(dir_.path()) / "keys").string();
    ASSERT_TRUE(WriteNewKeys(keys_).ok());
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
    network_ = std::make_unique<Network>(fs::path(dir_.path()) / "ip.log");
    if (!network_->MakeStar({"c", "n0", "n1"})) {
      GTEST_SKIP() << "cannot make network namespaces here: "
                   << testing::ReadWholeFile(fs::path(dir_.path()) / "ip.log");
    }
  }

  // A job whose controller listens on 10.224.0.1 inside namespace c; `name` names it.
  std::unique_ptr<ClusterJob> MakeJob(const std::string& name, const ClusterJobSpec& spec) {
    return std::make_unique<ClusterJob>(fs::path(dir_.path()) / name, spec, network_->Endpoint(),
                                        keys_);
  }

  testing::RestoredEnv tmpdir_{"TMPDIR"};  // before dir_, which TMPDIR points into
  TempDir dir_;
  std::string keys_;
  std::unique_ptr<Network> network_;
};

TEST_F(PartitionTest, CutNodeKillsItsRanksAndTheJobRestartsWhenItIsBackToTheSameParameters) {
  ClusterJobSpec spec;
  spec.steps = 160;
  // Reference first, on the same network (the numbers do not depend on it).
  std::map<std::string, std::string> reference;
  {
    std::unique_ptr<ClusterJob> job = MakeJob("reference", spec);
    std::unique_ptr<Process> controller = job->StartController(network_->Exec("c"));
    std::unique_ptr<Process> w0 = job->StartWorker("n0", network_->Exec("n0"));
    std::unique_ptr<Process> w1 = job->StartWorker("n1", network_->Exec("n1"));
    ASSERT_EQ(controller->Wait(), 0) << job->Logs();
    int64_t step = 0;
    reference = job->NewestCheckpoint(&step);
    ASSERT_EQ(step, spec.steps);
  }
  std::unique_ptr<ClusterJob> job = MakeJob("partition", spec);
  std::unique_ptr<Process> controller = job->StartController(network_->Exec("c"));
  std::unique_ptr<Process> w0 = job->StartWorker("n0", network_->Exec("n0"));
  std::unique_ptr<Process> w1 = job->StartWorker("n1", network_->Exec("n1"));
  ASSERT_TRUE(job->WaitForSteps(10)) << job->Logs();
  const std::vector<pid_t> cut_ranks = ChildrenOf(w1->pid(), "train");
  ASSERT_EQ(cut_ranks.size(), 2u);
  ASSERT_TRUE(network_->SetLink("n1", false));
  // The controller loses n1 (2 s of silence) and stops the other ranks; n1's daemon hears
  // nothing for as long, kills its own ranks and exits 1 ...
  EXPECT_EQ(w1->Wait(30s), 1) << job->Logs();
  for (pid_t r : cut_ranks) {
    for (int i = 0; i < 200 && ::kill(r, 0) == 0; ++i)
      std::this_thread::sleep_for(10ms);
    EXPECT_NE(::kill(r, 0), 0) << "rank " << r << " outlived its partitioned daemon";
  }
  EXPECT_TRUE(job->WaitForLog("node n1 lost")) << job->Logs();
  // ... its supervisor starts it again, still cut off; the job waits for it ...
  w1 = job->StartWorker("n1", network_->Exec("n1"));
  std::this_thread::sleep_for(2s);
  // ... and goes on once the link is back.
  ASSERT_TRUE(network_->SetLink("n1", true));
  ASSERT_EQ(controller->Wait(), 0) << job->Logs();
  const std::string log = job->Logs();
  EXPECT_NE(log.find("the controller has been silent"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 1"), std::string::npos) << log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(job->NewestCheckpoint(&step), reference);
}

// The wall-clock time of the first (or last) log line holding `text`: spdlog's prefix
// "[2026-11-24 23:59:01.123]", which sorts as text; empty when there is none.
std::string TimeOfLine(const std::string& log, const std::string& text, bool last = false) {
  const size_t at = last ? log.rfind(text) : log.find(text);
  if (at == std::string::npos) return "";
  const size_t newline = log.rfind('\n', at);
  const size_t line = newline == std::string::npos ? 0 : newline + 1;
  if (log.compare(line, 1, "[") != 0) return "";
  return log.substr(line + 1, 23);
}

// A one-node job with a spare daemon: cutting the node's link makes the job restart on the
// spare, without waiting for the node. The cut node's ranks train on (alone, they need no
// peer) until their daemon notices the silence, so the controller holds the new attempt
// until then: the old attempt commits no checkpoint after the new one started.
TEST_F(PartitionTest, CutNodeIsReplacedByASpareAndItsRanksCommitNothingAfterTheNewAttempt) {
  ClusterJobSpec spec;
  spec.nodes = 1;
  spec.steps = 400;
  spec.parallel = "{timeout_seconds: 6}";
  spec.global = 2;
  std::map<std::string, std::string> reference;
  {
    std::unique_ptr<ClusterJob> job = MakeJob("reference", spec);
    std::unique_ptr<Process> controller = job->StartController(network_->Exec("c"));
    std::unique_ptr<Process> w0 = job->StartWorker("n0", network_->Exec("n0"));
    ASSERT_EQ(controller->Wait(), 0) << job->Logs();
    int64_t step = 0;
    reference = job->NewestCheckpoint(&step);
    ASSERT_EQ(step, spec.steps);
  }
  std::unique_ptr<ClusterJob> job = MakeJob("spare", spec);
  std::unique_ptr<Process> controller = job->StartController(network_->Exec("c"));
  std::unique_ptr<Process> w0 = job->StartWorker("n0", network_->Exec("n0"));
  ASSERT_TRUE(job->WaitForLog("-> RENDEZVOUS")) << job->Logs();
  std::unique_ptr<Process> spare = job->StartWorker("n1", network_->Exec("n1"));
  ASSERT_TRUE(job->WaitForSteps(8)) << job->Logs();
  ASSERT_TRUE(network_->SetLink("n0", false));
  EXPECT_EQ(w0->Wait(30s), 1) << job->Logs();
  ASSERT_EQ(controller->Wait(), 0) << job->Logs();
  ASSERT_TRUE(network_->SetLink("n0", true));
  const std::string controller_log = testing::ReadWholeFile(job->dir() / "controller.log");
  const std::string n0_log = testing::ReadWholeFile(job->dir() / "worker-n0.log");
  EXPECT_NE(controller_log.find("ranks launched on n1"), std::string::npos) << controller_log;
  EXPECT_NE(controller_log.find("no new attempt for"), std::string::npos) << controller_log;
  const std::string launched = TimeOfLine(controller_log, "ranks launched on n1");
  const std::string committed = TimeOfLine(n0_log, "written to", /*last=*/true);
  ASSERT_FALSE(launched.empty());
  ASSERT_FALSE(committed.empty()) << n0_log;
  EXPECT_LT(committed, launched) << "the cut node's ranks committed a checkpoint after the new "
                                    "attempt started\n"
                                 << controller_log << n0_log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(job->NewestCheckpoint(&step), reference);
}

}  // namespace
}  // namespace difftrain
