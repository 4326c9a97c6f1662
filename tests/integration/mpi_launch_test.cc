// `difftrain train` under a real `mpirun`, without the controller: dp 4, tp 2 × dp 2 and
// dp 2 × pp 2, with the Gloo and with the MPI communicators, each the same computation as one
// process (losses and final parameters within 1e-5); checkpoints move between the controller's
// launch (`difftrain run`) and mpirun both ways; SIGUSR1 checkpoints and exits 75; a rank
// that dies ends the job.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/mpi_world.h"
#include "tests/testing/http.h"
#include "tests/testing/mpirun.h"
#include "tests/testing/parallel_training.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

constexpr int kMicro = 2;
constexpr int kSteps = 5;

class MpiLaunchTest : public testing::ParallelTrainingTest {
 protected:
  MpiLaunchTest()
      : ParallelTrainingTest(
            "{name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
            "num_heads: 4, num_classes: 10}",
            kMicro) {}

  void SetUp() override {
    if (!parallel::MpiBuilt()) GTEST_SKIP() << "difftrain was built without MPI (no Open MPI)";
    if (RunCommand("command -v mpirun").exit_code != 0) {
      GTEST_SKIP() << "mpirun not found (openmpi-bin, scripts/install-deps.sh)";
    }
    ParallelTrainingTest::SetUp();
  }

  // The command that starts `ranks` ranks of `job` under mpirun.
  std::string Mpirun(const fs::path& job, int ranks, const std::string& extra = "") const {
    return fmt::format("OMP_NUM_THREADS=1 {} -x OMP_NUM_THREADS -np {} {} train --config {} {}",
                       testing::MpirunCommand(mpi_session_.path()), ranks, DIFFTRAIN_BINARY,
                       ShellQuote(job.string()), extra);
  }

  // `difftrain run` of `job` on this machine with `ranks` ranks (one node).
  static CommandResult RunUnderController(const fs::path& job, int ranks) {
    std::ofstream(job, std::ios::app) << "cluster: {nodes: 1, devices_per_node: " << ranks << "}\n";
    return RunCommand("OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) + " run " +
                      ShellQuote(job.string()));
  }

  void ExpectSameAsOneProcess(const std::string& name, const std::string& layout, int global) {
    const fs::path job = WriteJob(name, global, false, kSteps, layout);
    const CommandResult r = RunCommand(Mpirun(job, 4));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const fs::path reference = Reference(global, kSteps);
    ExpectSameLosses(Losses(job.parent_path()), Losses(reference), name);
    EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5) << name;
  }

  TempDir mpi_session_{"ompi"};  // Open MPI's session directory (tests/testing/mpirun.h)
};

TEST_F(MpiLaunchTest, EveryLayoutWithEitherBackendEqualsOneProcess) {
  struct Case {
    std::string name, layout;
    int global;
  };
  for (const char* backend : {"gloo", "mpi"}) {
    for (const Case& c :
         {Case{"dp4", "dp: 4", 4 * kMicro}, Case{"tp2_dp2", "tp: 2, dp: 2", 2 * kMicro},
          Case{"dp2_pp2", "dp: 2, pp: 2", 2 * kMicro * 3}}) {
      ExpectSameAsOneProcess(c.name + "_" + backend,
                             c.layout + ", backend: " + std::string(backend), c.global);
    }
  }
}

// Two steps under the controller, two under mpirun (MPI communicators), one more under the
// controller: the same losses and parameters as five uninterrupted steps of one process.
TEST_F(MpiLaunchTest, CheckpointsMoveBetweenTheControllerAndMpirun) {
  const int global = 2 * kMicro;
  const fs::path job = WriteJob("handover", global, true, 2, "dp: 2");
  CommandResult r = RunUnderController(job, 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  WriteJob("handover", global, true, 4, "dp: 2, backend: mpi");
  r = RunCommand(Mpirun(job, 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  WriteJob("handover", global, true, kSteps, "dp: 2");
  r = RunUnderController(job, 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 4"), std::string::npos) << r.output;
  const fs::path reference = Reference(global, kSteps);
  ExpectSameLosses(Losses(job.parent_path()), Losses(reference), "handed over");
  EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5);
}

// Without a daemon each rank serves its own Prometheus metrics (--metrics-port P: P + local
// rank). mpirun passes SIGUSR1 on to every rank: they agree on a step, write a checkpoint and
// exit 75, which mpirun returns.
TEST_F(MpiLaunchTest, RanksServeMetricsAndSigusrOneCheckpointsAndExits75) {
  const fs::path job = WriteJob("signal", 2 * kMicro, false, 100000, "dp: 2, backend: mpi");
  const fs::path log = job.parent_path() / "mpirun.log";
  const fs::path go = job.parent_path() / "go";
  const int port = testing::FreePort();
  CommandResult r;
  std::thread launch([&] {
    // mpirun in the background; SIGUSR1 to it once the test has seen both ranks' metrics.
    const std::string script = fmt::format(
        "{} >{} 2>&1 & pid=$!; for i in $(seq 1200); do [ -e {} ] && break; sleep 0.1; done; "
        "kill -USR1 $pid; wait $pid",
        Mpirun(job, 2, fmt::format("--metrics-port {}", port)), ShellQuote(log.string()),
        ShellQuote(go.string()));
    r = RunCommand("bash -c " + ShellQuote(script));
  });
  std::set<int> serving;
  for (int i = 0; i < 600 && serving.size() < 2; ++i) {
    for (int local_rank : {0, 1}) {
      Result<std::string> body = testing::HttpGet(port + local_rank, "/metrics");
      if (body.ok() && body->find(fmt::format("difftrain_rank_iteration{{")) != std::string::npos &&
          body->find(fmt::format("rank=\"{}\"", local_rank)) != std::string::npos) {
        serving.insert(local_rank);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ofstream(go) << "go\n";
  launch.join();
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(serving, (std::set<int>{0, 1})) << "ranks whose /metrics showed their iteration\n"
                                            << output;
  EXPECT_EQ(r.exit_code, 75) << output;
  EXPECT_NE(output.find("stopped by signal 10 after step"), std::string::npos) << output;
  io::CheckpointStore store((job.parent_path() / "ckpt").string(), 5);
  Result<std::optional<int64_t>> latest = store.LatestComplete();
  ASSERT_TRUE(latest.ok() && latest->has_value()) << output;
}

// MPI has no restarts: one rank killed ends every rank, and mpirun says which.
TEST_F(MpiLaunchTest, ARankThatDiesEndsTheJob) {
  const fs::path job = WriteJob("killed", 2 * kMicro, false, 100000, "dp: 2, backend: mpi");
  const std::string script = fmt::format(
      "timeout 120 env {} & pid=$!; "
      "for i in $(seq 600); do [ -s {} ] && break; sleep 0.1; done; "
      "kill -9 $(pgrep -P $(pgrep -P $pid) | tail -1); wait $pid",
      Mpirun(job, 2), ShellQuote((job.parent_path() / "metrics-1.jsonl").string()));
  const CommandResult r = RunCommand("bash -c " + ShellQuote(script));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "mpirun went on after a rank died\n" << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

// `parallel: auto` is chosen once, by rank 0, for the nodes and ranks per node MPI reports
// (1 × 2 here; the file's cluster section says 1 × 1, which could not run on 2 ranks).
TEST_F(MpiLaunchTest, ParallelAutoIsChosenForTheMpiWorld) {
  const fs::path dir = root_ / "auto";
  fs::create_directories(dir);
  std::ofstream(dir / "job.yaml")
      << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
         "num_heads: 4, num_classes: 10}\n"
      << "batch: {micro: 2, global: 4}\n"
      << "train: {steps: 2, log_every: 1}\n"
      << "parallel: auto\n"
      << "cluster: {nodes: 1, devices_per_node: 1}\n";
  const CommandResult r = RunCommand(Mpirun(dir / "job.yaml", 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on 2 rank(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 2 steps"), std::string::npos) << r.output;
}

// Rank 0 reads and resolves the job; a bad one is reported once, and every rank exits 2.
TEST_F(MpiLaunchTest, ABadJobIsReportedOnceByRankZero) {
  const fs::path job = WriteJob("bad", 3, false, 1, "dp: 2");
  const CommandResult r = RunCommand(Mpirun(job, 2));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string message = "batch.global: expected a multiple of batch.micro";
  const size_t first = r.output.find(message);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(message, first + 1), std::string::npos) << r.output;
}

TEST_F(MpiLaunchTest, TheMpiBackendNeedsAnMpiLaunch) {
  const fs::path job = WriteJob("no_mpirun", kMicro, false, 1, "backend: mpi");
  const CommandResult r =
      testing::RunDifftrain("train --config " + ShellQuote(job.string()) + " --world 1 --store " +
                            ShellQuote((job.parent_path() / "store").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.backend mpi needs ranks started by mpirun"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace difftrain
