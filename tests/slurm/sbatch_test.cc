// slurm/difftrain.sbatch on a real Slurm: Debian's slurmctld and two slurmd emulating nodes
// n1 and n2 on this machine (tests/slurm/cluster.sh, a private configuration, munge key and
// ports), driven with sbatch, scontrol and scancel as a user would. Each test starts its own
// cluster and stops it. Where Slurm cannot run (not root, packages not installable) the
// tests are skipped with the reason.
//
// The jobs are a tiny DiT on synthetic data, data parallel over the two nodes (dp=2, one
// CPU rank per node), so the Slurm path is what the tests spend their time on.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/io/checkpoint.h"
#include "tests/testing/checkpoint_tensors.h"
#include "tests/testing/http.h"
#include "tests/testing/memory_job.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::ShellQuote;

const fs::path kSourceDir = DIFFTRAIN_SOURCE_DIR;
const fs::path kSbatch = kSourceDir / "slurm/difftrain.sbatch";
const fs::path kCluster = kSourceDir / "tests/slurm/cluster.sh";
// Clusters of tests running at once pick their free ports one after the other.
constexpr char kPortLock[] = "/tmp/difftrain-slurm-test-ports.lock";
constexpr auto kJobLimit = 180s;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `Key=Value` words of one line (scontrol -o, the job-completion log).
std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return fields;
}

// METRICS HOOK (issue 7): whether TwoNodeJobTrainsToCompletion scrapes the controller's
// and the daemons' /metrics while the job runs (the ports are passed to the daemons either
// way). On: the daemons serve /metrics from their own small HTTP server (common/metrics.h)
// since civetweb's SIGSEGV on the first scrape (DIFFTRAIN_TEST_SCRAPE_METRICS=1 forces it).
constexpr bool kScrapeMetrics = true;
bool ScrapeMetrics() {
  return kScrapeMetrics || std::getenv("DIFFTRAIN_TEST_SCRAPE_METRICS") != nullptr;
}

// A tiny DiT, data parallel over the job's nodes; the nodes and ranks per node come from
// the batch script (--nodes, --devices-per-node).
struct JobSpec {
  int hidden = 32;
  int micro = 2;
  int steps = 1000;
  int log_every = 50;
  int checkpoint_every = 500;
  bool parallel_auto = false;  // `parallel: auto`: the controller chooses the layout
};

class SbatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CommandResult help = testing::RunDifftrain("controller --help");
    if (help.exit_code != 0) {
      GTEST_SKIP() << "`difftrain controller --help` fails (exit " << help.exit_code
                   << "): the controller and worker daemons (issue 6) are not in this build";
    }
    root_ = fs::temp_directory_path() / ("difftrain_slurm_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    // -o: the daemons the script starts must not inherit the lock (a munged left behind by a
    // killed test would hold it for ever); -w: no wait without a deadline.
    const CommandResult started = RunCommand(
        "flock -o -w 300 " + std::string(kPortLock) + " " + ShellQuote(kCluster.string()) +
        " start " + ShellQuote((root_ / "cluster").string()) + " --owner " +
        std::to_string(::getpid()) + cluster_options_);
    if (started.exit_code == 77) GTEST_SKIP() << started.output;
    ASSERT_EQ(started.exit_code, 0) << started.output;
    cluster_started_ = true;
    // Every command of the test (sbatch, scontrol, scancel) and the jobs it submits see
    // this cluster and these settings: sbatch passes the environment on to the job.
    ::setenv("SLURM_CONF", (root_ / "cluster/slurm.conf").c_str(), 1);
    ::setenv("DIFFTRAIN_BIN", DIFFTRAIN_BINARY, 1);
    ::setenv("DIFFTRAIN_PORT", std::to_string(testing::FreePort()).c_str(), 1);
    controller_metrics_port_ = testing::FreePort();
    ::setenv("DIFFTRAIN_METRICS_PORT", std::to_string(controller_metrics_port_).c_str(), 1);
    // The two emulated nodes share this machine: node i's daemon serves port + i.
    worker_metrics_port_ = testing::FreePort(/*count=*/2);
    ::setenv("DIFFTRAIN_WORKER_METRICS_PORT", std::to_string(worker_metrics_port_).c_str(), 1);
    ::setenv("DIFFTRAIN_WORKER_METRICS_PORT_PER_NODE", "1", 1);
    ::setenv("DIFFTRAIN_WORKER_GRACE", "15", 1);
  }

  void TearDown() override {
    if (cluster_started_) {
      const CommandResult stopped = RunCommand(ShellQuote(kCluster.string()) + " stop " +
                                               ShellQuote((root_ / "cluster").string()));
      EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
    }
    if (HasFailure()) {
      std::cerr << "kept " << root_ << " (job outputs, checkpoints, Slurm's logs in cluster/log)\n";
    } else if (!root_.empty()) {
      fs::remove_all(root_);
    }
  }

  // Writes the job file `name`/dit.yaml; its checkpoints go to `name`/ckpt.
  fs::path WriteJob(const std::string& name, const JobSpec& spec) {
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    std::ofstream(dir / "dit.yaml")
        << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: " << spec.hidden
        << ", depth: 2, num_heads: 4, num_classes: 10}\n"
        << "batch: {micro: " << spec.micro << ", global: " << 2 * spec.micro << "}\n"
        << "optimizer: {lr: 0.001}\n"
        << "train: {steps: " << spec.steps << ", log_every: " << spec.log_every << "}\n"
        << (spec.parallel_auto ? "parallel: auto\n" : "parallel: {timeout_seconds: 60}\n")
        << "checkpoint: {dir: " << (dir / "ckpt").string() << ", every: " << spec.checkpoint_every
        << ", keep: 2}\n"
        << "restart: {heartbeat_seconds: 0.2, heartbeat_misses: 25, "
           "rendezvous_timeout_seconds: 60}\n"
        << "metrics: {progress_log_seconds: 1}\n";
    return dir / "dit.yaml";
  }

  fs::path KeysDir(const fs::path& job) const { return job.parent_path() / "keys"; }

  // sbatch as the user runs it (two nodes, one task per node); returns the job id.
  std::string Submit(const fs::path& job, const std::string& extra = "") {
    ::setenv("DIFFTRAIN_KEYS_DIR", KeysDir(job).c_str(), 1);
    const CommandResult r =
        RunCommand("sbatch --parsable --nodes=2 --cpus-per-task=2 --time=10 --output=" +
                   ShellQuote((root_ / "slurm-%j.out").string()) + " " + extra + " " +
                   ShellQuote(kSbatch.string()) + " " + ShellQuote(job.string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::string id = r.output.substr(0, r.output.find_first_not_of("0123456789"));
    EXPECT_FALSE(id.empty()) << r.output;
    return id;
  }

  std::map<std::string, std::string> ShowJob(const std::string& id) {
    return Fields(RunCommand("scontrol show job -o " + id).output);
  }

  std::string Output(const std::string& id) const {
    return ReadFile(root_ / ("slurm-" + id + ".out"));
  }

  // Polls job `id` until it ends (after any requeue), calling `during(state, output)` on
  // each poll; returns its final `scontrol show job` fields.
  std::map<std::string, std::string> WaitForEnd(
      const std::string& id,
      const std::function<void(const std::string&, const std::string&)>& during = {}) {
    static const std::set<std::string> kEnded = {"COMPLETED",     "FAILED",    "CANCELLED",
                                                 "TIMEOUT",       "NODE_FAIL", "BOOT_FAIL",
                                                 "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE"};
    const auto deadline = Clock::now() + kJobLimit;
    std::map<std::string, std::string> job;
    while (Clock::now() < deadline) {
      job = ShowJob(id);
      if (kEnded.contains(job["JobState"])) return job;
      if (during) during(job["JobState"], Output(id));
      std::this_thread::sleep_for(200ms);
    }
    ADD_FAILURE() << "job " << id << " still " << job["JobState"] << " after " << kJobLimit.count()
                  << " s:\n"
                  << Output(id);
    RunCommand("scancel " + id);
    return job;
  }

  // The job's runs in Slurm's job-completion log, oldest first (a requeued job has several).
  std::vector<std::map<std::string, std::string>> Records(const std::string& id) {
    std::vector<std::map<std::string, std::string>> runs;
    std::istringstream log(ReadFile(root_ / "cluster/log/jobcomp.log"));
    for (std::string line; std::getline(log, line);) {
      std::map<std::string, std::string> f = Fields(line);
      if (f["JobId"] == id) runs.push_back(std::move(f));
    }
    return runs;
  }

  // Submits `job` and, while it runs, sends it `signal_command` (scancel …) once rank 0 has
  // logged step `at`. Returns the job id.
  std::string SubmitAndWarn(const fs::path& job, const std::string& extra, int at, int steps,
                            const std::string& scancel_options) {
    const std::string id = Submit(job, extra);
    bool sent = false;
    const std::string mark = "step " + std::to_string(at) + "/" + std::to_string(steps);
    WaitForEnd(id, [&](const std::string& state, const std::string& output) {
      if (!sent && state == "RUNNING" && output.find(mark) != std::string::npos) {
        const CommandResult r = RunCommand("scancel " + scancel_options + " " + id);
        EXPECT_EQ(r.exit_code, 0) << r.output;
        sent = true;
      }
    });
    EXPECT_TRUE(sent) << "the job ended before rank 0 logged '" << mark << "':\n" << Output(id);
    return id;
  }

  // Every tensor of both ranks' shards of the newest complete checkpoint.
  static std::map<std::string, std::string> FinalState(const fs::path& job, int64_t* step) {
    const fs::path dir = job.parent_path() / "ckpt";
    std::map<std::string, std::string> tensors = testing::NewestCheckpointTensors(dir, step);
    if (!tensors.empty()) {
      const Result<int> world = io::CheckpointStore(dir.string(), 0).World(*step);
      EXPECT_TRUE(world.ok() && *world == 2)
          << "checkpoint of step " << *step << " has " << (world.ok() ? *world : -1) << " shards";
    }
    return tensors;
  }

  // An uninterrupted sbatch run of `spec` (the bit-for-bit reference).
  std::map<std::string, std::string> Reference(const JobSpec& spec) {
    const fs::path job = WriteJob("reference", spec);
    const std::string id = Submit(job);
    std::map<std::string, std::string> end = WaitForEnd(id);
    EXPECT_EQ(end["JobState"], "COMPLETED") << Output(id);
    int64_t step = 0;
    std::map<std::string, std::string> state = FinalState(job, &step);
    EXPECT_EQ(step, spec.steps);
    EXPECT_FALSE(state.empty());
    return state;
  }

  // The batch script's own record of a run: "controller exit C, worker daemons exit W: …".
  static void ExpectRecord(const std::string& output, const std::string& run, int code,
                           const std::string& what) {
    const std::string prefix = "(run " + run + "): controller exit " + std::to_string(code) + ",";
    EXPECT_THAT(output, HasSubstr(prefix)) << output;
    EXPECT_THAT(output, HasSubstr(what + "; exit " + std::to_string(code))) << output;
    // The daemons end with the controller's code. A daemon that misses the controller's
    // final shutdown exits 1 after the heartbeat timeout (the shutdown race of issue 6).
    EXPECT_THAT(output, HasSubstr(prefix + " worker daemons exit " + std::to_string(code)))
        << "the worker daemons' exit code differs from the controller's:\n"
        << output;
  }

  // The time of one training step of `spec` on this machine, from a short run of the same
  // layout without Slurm (`difftrain run`: a controller, two daemons, two ranks).
  static double StepSeconds(const fs::path& dir, JobSpec spec) {
    fs::create_directories(dir);
    const fs::path metrics = dir / "metrics-{rank}.jsonl";
    std::ofstream(dir / "calibrate.yaml")
        << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: " << spec.hidden
        << ", depth: 2, num_heads: 4, num_classes: 10}\n"
        << "batch: {micro: " << spec.micro << ", global: " << 2 * spec.micro << "}\n"
        << "train: {steps: 200, log_every: 1000, metrics_file: \"" << metrics.string() << "\"}\n"
        << "cluster: {nodes: 2, devices_per_node: 1}\n";
    const CommandResult r = RunCommand(std::string(DIFFTRAIN_BINARY) + " run " +
                                       ShellQuote((dir / "calibrate.yaml").string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<double> seconds;
    std::istringstream lines(ReadFile(dir / "metrics-0.jsonl"));
    const std::regex field("\"step_seconds\":([0-9.eE+-]+)");
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, field)) seconds.push_back(std::stod(m[1]));
    }
    if (seconds.empty()) return 1e-2;
    std::sort(seconds.begin(), seconds.end());
    return std::max(1e-4, seconds[seconds.size() / 2]);
  }

  fs::path root_;
  std::string cluster_options_;  // more options of `cluster.sh start`
  bool cluster_started_ = false;
  int controller_metrics_port_ = 0, worker_metrics_port_ = 0;
};

// `parallel: auto` under sbatch: the batch script passes the allocation to the controller
// (--nodes 2 --devices-per-node 1), which chooses the layout for it, as `difftrain validate`
// does with the same flags, and ships it to the ranks (issue 18: every rank used to re-plan
// from the file, and the controller refused the flags).
TEST_F(SbatchTest, ParallelAutoJobTrainsWithTheLayoutValidateChooses) {
  JobSpec spec{.hidden = 32,
               .micro = 2,
               .steps = 40,
               .log_every = 10,
               .checkpoint_every = 20,
               .parallel_auto = true};
  const fs::path job = WriteJob("auto", spec);
  const CommandResult validated =
      testing::RunDifftrain("validate --nodes 2 --devices-per-node 1 " + ShellQuote(job.string()));
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  std::smatch chosen;
  ASSERT_TRUE(std::regex_search(validated.output, chosen,
                                std::regex("parallel: auto chose tp ([0-9]+) cp ([0-9]+) pp "
                                           "([0-9]+) dp ([0-9]+)")))
      << validated.output;
  const std::string layout = "(tp " + chosen[1].str() + " cp " + chosen[2].str() + " dp " +
                             chosen[4].str() + " pp " + chosen[3].str() + ")";

  const std::string id = Submit(job);
  const auto end = WaitForEnd(id);
  const std::string output = Output(id);
  EXPECT_EQ(end.at("JobState"), "COMPLETED") << output;
  EXPECT_EQ(end.at("ExitCode"), "0:0") << output;
  EXPECT_THAT(output, HasSubstr(layout)) << "the ranks trained another layout than validate's";
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty());
  EXPECT_EQ(step, spec.steps);
}

// The jobs of the warning tests: long enough for the warning to arrive well before the end.
JobSpec WarnedSpec() {
  return JobSpec{.hidden = 32, .micro = 2, .steps = 1000, .log_every = 50, .checkpoint_every = 500};
}

TEST_F(SbatchTest, TwoNodeJobTrainsToCompletion) {
  // The controller reports the ranks' progress every second (metrics.progress_log_seconds):
  // the job must run for several seconds on this machine, whatever its speed.
  JobSpec spec{.hidden = 32, .micro = 2, .steps = 0, .log_every = 200, .checkpoint_every = 0};
  const double step_seconds = StepSeconds(root_ / "calibrate", spec);
  spec.steps = std::clamp(static_cast<int>(std::ceil(8.0 / step_seconds)), 1000, 50000);
  spec.checkpoint_every = spec.steps / 2;
  const fs::path job = WriteJob("complete", spec);
  const std::string id = Submit(job);

  const std::regex controller_progress("controller: attempt 0 at step ([0-9]+)/" +
                                       std::to_string(spec.steps));
  int progress_step = -1;
  bool keys_checked = false, controller_metrics = false;
  std::set<std::string> worker_metrics;
  const auto end = WaitForEnd(id, [&](const std::string& state, const std::string& output) {
    if (state != "RUNNING") return;
    // Per-rank progress as the controller reports it while the job runs.
    for (std::sregex_iterator it(output.begin(), output.end(), controller_progress), last;
         it != last; ++it) {
      progress_step = std::max(progress_step, std::stoi((*it)[1]));
    }
    // The job's keys: a directory only the user can read, files only the user can read.
    const fs::path keys = KeysDir(job);
    struct stat dir_stat {};
    if (!keys_checked && ::stat(keys.c_str(), &dir_stat) == 0 && fs::exists(keys / "client.key")) {
      EXPECT_EQ(dir_stat.st_mode & 0777, 0700u) << keys;
      for (const char* name : {"controller.key", "client.key"}) {
        struct stat file_stat {};
        ASSERT_EQ(::stat((keys / name).c_str(), &file_stat), 0) << name;
        EXPECT_EQ(file_stat.st_mode & 077, 0u) << name << " is readable by others";
      }
      keys_checked = true;
    }
    // METRICS HOOK (issue 7): /metrics of the controller and of each daemon while it runs.
    if (ScrapeMetrics()) {
      Result<std::string> body = testing::HttpGet(controller_metrics_port_, "/metrics");
      controller_metrics |= body.ok() && body->find("difftrain_job_iteration") != std::string::npos;
      for (int node = 0; node < 2; ++node) {
        body = testing::HttpGet(worker_metrics_port_ + node, "/metrics");
        if (body.ok() && body->find("difftrain_rank_iteration{") != std::string::npos) {
          worker_metrics.insert("n" + std::to_string(node + 1));
        }
      }
    }
  });
  const std::string output = Output(id);
  EXPECT_EQ(end.at("JobState"), "COMPLETED") << output;
  EXPECT_EQ(end.at("ExitCode"), "0:0") << output;
  const auto records = Records(id);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].at("JobState"), "COMPLETED");
  EXPECT_EQ(records[0].at("ExitCode"), "0:0");
  ExpectRecord(output, "0", 0, "SUCCEEDED");
  EXPECT_THAT(output,
              HasSubstr("2 node(s) n1 n2 x 1 rank(s); controller on n1 at tcp://127.0.0.1:"))
      << "n1 and n2 do not resolve: the controller's address is n1's NodeAddr";
  EXPECT_THAT(output, HasSubstr("controller: node n1 registered"));
  EXPECT_THAT(output, HasSubstr("controller: node n2 registered"));
  EXPECT_THAT(output, HasSubstr("(tp 1 cp 1 dp 2 pp 1)"));
  EXPECT_GT(progress_step, 0) << "no progress report from the controller while the job ran ("
                              << spec.steps << " steps of about " << step_seconds << " s each):\n"
                              << output;
  EXPECT_TRUE(keys_checked) << "the keys were never seen while the job ran";
  EXPECT_FALSE(fs::exists(KeysDir(job))) << "the job's keys outlived it";
  if (ScrapeMetrics()) {
    EXPECT_TRUE(controller_metrics) << "the controller's /metrics never showed the job";
    EXPECT_EQ(worker_metrics, (std::set<std::string>{"n1", "n2"}))
        << "daemons whose /metrics showed their rank's iteration";
  } else {
    RecordProperty("metrics", "not scraped: METRICS HOOK (issue 7) is off");
    std::cout << "NOTE: /metrics not scraped (METRICS HOOK, issue 7): checked the controller's "
                 "progress reports\n";
  }

  // The final checkpoint: every rank's shard of the last step.
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty());
  EXPECT_EQ(step, spec.steps);
}

// DIFFTRAIN_LAUNCH=mpi: the batch script runs one `srun --mpi=pmix` step of one task per rank
// instead of the daemons; the ranks resolve the job on rank 0 and train without a controller.
class SbatchMpiTest : public SbatchTest {
 protected:
  void SetUp() override {
    SbatchTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const CommandResult help = testing::RunDifftrain("train --help");
    if (help.output.find("mode is not built") != std::string::npos) {
      GTEST_SKIP() << "difftrain was built without MPI: " << help.output;
    }
    const CommandResult plugins = RunCommand("srun --mpi=list");
    if (plugins.output.find("pmix") == std::string::npos) {
      GTEST_SKIP() << "Slurm's mpi_pmix plugin is not available (slurm-wlm-basic-plugins and "
                      "libpmix2): "
                   << plugins.output;
    }
    ::setenv("DIFFTRAIN_LAUNCH", "mpi", 1);
  }

  // Runs `spec` as one MPI step of two ranks over `nodes` node(s); returns the job's output.
  std::string TrainToCompletion(const std::string& name, int nodes) {
    const JobSpec spec{
        .hidden = 32, .micro = 2, .steps = 40, .log_every = 10, .checkpoint_every = 20};
    const fs::path job = WriteJob(name, spec);
    ::setenv("DIFFTRAIN_CPU_RANKS_PER_NODE", std::to_string(2 / nodes).c_str(), 1);
    const std::string id = Submit(job, "--nodes=" + std::to_string(nodes));
    const auto end = WaitForEnd(id);
    const std::string output = Output(id);
    EXPECT_EQ(end.at("JobState"), "COMPLETED") << output;
    EXPECT_THAT(output, HasSubstr("launched by srun --mpi=pmix, without the controller"));
    EXPECT_THAT(output, HasSubstr("ranks (srun --mpi=pmix) exit 0: SUCCEEDED; exit 0"));
    EXPECT_THAT(output, HasSubstr("(tp 1 cp 1 dp 2 pp 1)"));
    EXPECT_FALSE(fs::exists(KeysDir(job))) << "the MPI launch makes no keys";
    int64_t step = 0;
    EXPECT_FALSE(FinalState(job, &step).empty()) << output;
    EXPECT_EQ(step, spec.steps);
    return output;
  }
};

TEST_F(SbatchMpiTest, TwoTasksOnOneNodeTrainToCompletion) {
  TrainToCompletion("mpi_one_node", 1);
}

// Across the two emulated nodes: each slurmd would make the same PMIx client directory
// /tmp/spmix_appdir_<uid>_<job>.<step> ("File exists"); cluster.sh gives each node its own
// TmpFS ($dir/tmp/%n), under which Slurm's PMIx plugin makes it.
TEST_F(SbatchMpiTest, OneTaskOnEachOfTwoNodesTrainsToCompletion) {
  TrainToCompletion("mpi_two_nodes", 2);
}

TEST_F(SbatchTest, WarnedJobCheckpointsAndItsResubmissionMatchesAnUninterruptedRun) {
  const JobSpec spec = WarnedSpec();
  const auto reference = Reference(spec);
  const fs::path job = WriteJob("warned", spec);

  // The time-limit warning (--signal=B:USR1@…) as scancel sends it: to the batch shell.
  const std::string id =
      SubmitAndWarn(job, "--no-requeue", 100, spec.steps, "--signal=USR1 --batch");
  std::string output = Output(id);
  auto end = ShowJob(id);
  EXPECT_EQ(end["JobState"], "FAILED") << output;
  EXPECT_EQ(end["ExitCode"], "75:0") << output;
  auto records = Records(id);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["ExitCode"], "75:0");
  EXPECT_THAT(output, HasSubstr("SIGUSR1: asking the controller to checkpoint and stop"));
  EXPECT_THAT(output, HasSubstr("RUNNING -> CHECKPOINTED"));
  ExpectRecord(output, "0", 75, "CHECKPOINTED, not finished");
  EXPECT_THAT(output, Not(HasSubstr("requeued")));
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty());
  EXPECT_GE(step, 100);
  ASSERT_LT(step, spec.steps) << "the job finished before the warning reached it";

  // The user submits it again: it resumes from that checkpoint and finishes.
  const std::string again = Submit(job);
  end = WaitForEnd(again);
  output = Output(again);
  EXPECT_EQ(end["JobState"], "COMPLETED") << output;
  EXPECT_EQ(end["ExitCode"], "0:0") << output;
  EXPECT_THAT(output, HasSubstr("resumed from step " + std::to_string(step)));
  ExpectRecord(output, "0", 0, "SUCCEEDED");
  int64_t final_step = 0;
  testing::ExpectIdenticalTensors(FinalState(job, &final_step), reference);
  EXPECT_EQ(final_step, spec.steps);
}

// A cluster that enforces memory as sites do (cluster.sh --memory: task/cgroup,
// ConstrainRAMSpace, memory a consumable resource): a job's `--mem` is a cgroup limit.
class SbatchMemoryTest : public SbatchTest {
 protected:
  SbatchMemoryTest() { cluster_options_ = " --memory"; }
};

// `sbatch --mem=512M` of a job whose ranks need 1.2 GiB each: the worker daemons report the
// job's cgroup limit as their nodes' memory, and the controller fails the job before any rank
// starts, naming the node and the limit, instead of ranks OOM-killed attempt after attempt.
TEST_F(SbatchMemoryTest, AJobBeyondItsMemFailsBeforeLaunchNamingTheLimit) {
  const fs::path dir = root_ / "big";
  fs::create_directories(dir);
  std::ofstream(dir / "big.yaml") << testing::MemoryJobYaml(128, 256, 10, (dir / "ckpt").string());
  const std::string id = Submit(dir / "big.yaml", "--mem=512M");
  const auto end = WaitForEnd(id);
  const std::string output = Output(id);
  EXPECT_EQ(end.at("JobState"), "FAILED") << output;
  EXPECT_THAT(output, HasSubstr("0.5 GiB by the memory limit of cgroup /slurm")) << output;
  EXPECT_THAT(output, ::testing::ContainsRegex(
                          "node n[12] cannot hold its 1 rank\\(s\\) [01]\\.\\.[01]: .* need 1\\.17 "
                          "GiB of host memory .* more than the node's 0\\.50 GiB \\(the memory "
                          "limit of its worker daemon's cgroup /slurm"))
      << output;
  EXPECT_THAT(output, HasSubstr("final state FAILED, restarts 0")) << output;
  EXPECT_THAT(output, Not(HasSubstr("started ranks"))) << output;
}

TEST_F(SbatchTest, RequeueableJobRequeuesItselfOnTheWarningAndResumes) {
  const JobSpec spec = WarnedSpec();
  const auto reference = Reference(spec);
  const fs::path job = WriteJob("requeued", spec);

  // The warning to every step and the batch shell (--full): the daemons hear it directly.
  const std::string id = SubmitAndWarn(job, "--requeue", 100, spec.steps, "--signal=USR1 --full");
  const std::string output = Output(id);
  auto end = ShowJob(id);
  EXPECT_EQ(end["JobState"], "COMPLETED") << output;
  EXPECT_EQ(end["ExitCode"], "0:0") << output;
  EXPECT_EQ(end["Restarts"], "1") << output;
  // Run 0 checkpointed (75) and requeued itself; run 1 resumed and finished.
  ExpectRecord(output, "0", 75, "CHECKPOINTED, not finished");
  EXPECT_THAT(output, HasSubstr("exit 75, requeued"));
  EXPECT_THAT(output, HasSubstr("resumed from step"));
  ExpectRecord(output, "1", 0, "SUCCEEDED");
  const auto records = Records(id);
  ASSERT_EQ(records.size(), 2u) << "one record per run";
  EXPECT_EQ(records[0].at("DerivedExitCode"), "75:0") << "the first run's steps exited 75";
  EXPECT_EQ(records[1].at("JobState"), "COMPLETED");
  int64_t step = 0;
  testing::ExpectIdenticalTensors(FinalState(job, &step), reference);
  EXPECT_EQ(step, spec.steps);
}

// The batch script alone, with stand-ins for srun and scontrol that record what they are
// asked: what a real cluster would run that this machine cannot (pyxis containers, GPUs,
// nodes whose names do not resolve), and the exit-code mapping. Needs no Slurm and no root.
class SbatchScriptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("difftrain_sbatch_script_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "bin");
    fs::create_directories(root_ / "jobs");
    std::ofstream(root_ / "jobs/dit.yaml") << "model: {name: DiT-XL/2}\n";
    // srun: one line per call, each argument after a '|', appended in one write (the
    // controller and worker steps run at once); the controller step exits with
    // $FAKE_CONTROLLER_EXIT, the worker step with $FAKE_WORKERS_EXIT, the MPI launch's ranks
    // with $FAKE_RANKS_EXIT; the keys step sends the
    // batch script the warning signal when $FAKE_WARN_DURING_KEYS is set.
    Script("srun", R"(line=$(printf '|%s' "$@" ''); echo "$line" >>"$LOG/srun"
case " $* " in
  *" keys "*) [[ -z $FAKE_WARN_DURING_KEYS ]] || kill -USR1 "$PPID" ;;
  *" controller "*) exit "${FAKE_CONTROLLER_EXIT:-0}" ;;
  *" worker "*) exit "${FAKE_WORKERS_EXIT:-0}" ;;
  *" train "*) exit "${FAKE_RANKS_EXIT:-0}" ;;
esac)");
    Script("scontrol", R"(echo "$*" >>"$LOG/scontrol"
case "$1 $2" in
  "show hostnames") printf 'gpu07\ngpu08\n' ;;
  "show node") echo "NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=$4" ;;
  "show job") echo "JobId=$4 Requeue=${FAKE_REQUEUE:-0} Restarts=0" ;;
esac)");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  void Script(const std::string& name, const std::string& body) {
    std::ofstream(root_ / "bin" / name) << "#!/bin/bash\n" << body << "\n";
    fs::permissions(root_ / "bin" / name, fs::perms::owner_all);
  }

  // Runs the batch script as slurmstepd would on the first node of a two-node job with
  // eight GPUs per node; returns its exit code.
  int RunBatch(const std::string& env, const std::string& args) {
    const CommandResult r = RunCommand(
        "cd " + ShellQuote(root_.string()) + " && env -i PATH=" + (root_ / "bin").string() +
        ":/usr/bin:/bin HOME=" + root_.string() + " LOG=" + root_.string() +
        " SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='gpu[07-08]'"
        " SLURM_GPUS_PER_NODE=h100:8 SLURM_CPUS_ON_NODE=64 SLURM_SUBMIT_DIR=" +
        root_.string() + " " + env + " bash " + ShellQuote(kSbatch.string()) + " jobs/dit.yaml " +
        args);
    output_ = r.output;
    return r.exit_code;
  }

  std::vector<std::string> SrunCalls() const {
    std::vector<std::string> calls;
    std::istringstream lines(ReadFile(root_ / "srun"));
    for (std::string line; std::getline(lines, line);)
      calls.push_back(line);
    return calls;
  }

  fs::path root_;
  std::string output_;
};

TEST_F(SbatchScriptTest, ContainerOptionsGpusAndTheControllerAddressReachEveryStep) {
  ASSERT_EQ(RunBatch("",
                     "--container-image=reg/difftrain:1 --container-mounts=/data:/data "
                     "--container-workdir=/w"),
            0)
      << output_;
  const std::vector<std::string> calls = SrunCalls();
  ASSERT_EQ(calls.size(), 3u) << output_;
  // The keys first; then the controller and the workers, started together.
  auto call_of = [&](const std::string& word) {
    for (const std::string& call : calls)
      if (call.find("|" + word) != std::string::npos) return call;
    return std::string();
  };
  const std::string keys = (root_ / ".difftrain/slurm-keys/42").string();
  const std::string jobs = (root_ / "jobs").string();
  for (const std::string& call : calls) {
    EXPECT_THAT(call, HasSubstr("|--overlap|"));
    EXPECT_THAT(call, HasSubstr("|--container-workdir=/w|--container-image=reg/difftrain:1|"
                                "--container-mounts=/data:/data," +
                                jobs + ":" + jobs + ":ro," + keys + ":" + keys + "|"));
  }
  EXPECT_THAT(calls[0], HasSubstr("|--nodelist=gpu07|difftrain|keys|--out|" + keys + "|"));
  // gpu07 does not resolve: the workers use its NodeAddr.
  EXPECT_THAT(call_of("controller|"),
              HasSubstr("|--nodes=1|--ntasks=1|--nodelist=gpu07|difftrain|controller|" + jobs +
                        "/dit.yaml|--bind|tcp://0.0.0.0:29400|--keys|" + keys +
                        "|--nodes|2|--devices-per-node|8|--metrics-port|9400|"));
  EXPECT_THAT(call_of("/bin/sh|"),
              HasSubstr("|--nodes=2|--ntasks=2|--ntasks-per-node=1|--cpus-per-task=64|"
                        "/bin/sh|-c|"));
  EXPECT_THAT(call_of("/bin/sh|"),
              HasSubstr("worker --node \"$SLURMD_NODENAME\" \"$@\" --metrics-port "
                        "$((9401 + 0 * SLURM_NODEID))|difftrain|--controller|"
                        "tcp://10.0.0.7:29400|--keys|" +
                        keys + "|--devices|8|"));
  EXPECT_THAT(output_, HasSubstr("controller exit 0, worker daemons exit 0: SUCCEEDED; exit 0"));
  EXPECT_FALSE(fs::exists(keys)) << "the keys outlived the job";
}

// DIFFTRAIN_LAUNCH=mpi: no keys, no daemons, one srun --mpi=pmix step of one task per GPU,
// whose exit code is the job's.
TEST_F(SbatchScriptTest, MpiLaunchIsOnePmixStepOfTheRanks) {
  ASSERT_EQ(RunBatch("DIFFTRAIN_LAUNCH=mpi FAKE_RANKS_EXIT=75 DIFFTRAIN_REQUEUE=0", ""), 75)
      << output_;
  const std::vector<std::string> calls = SrunCalls();
  ASSERT_EQ(calls.size(), 1u) << output_;
  EXPECT_THAT(calls[0], HasSubstr("|--overlap|--kill-on-bad-exit=0|--mpi=pmix|--nodes=2|"
                                  "--ntasks=16|--ntasks-per-node=8|--cpus-per-task=8|/bin/sh|-c|"
                                  "exec \"$0\" train \"$@\" --metrics-port "
                                  "$((9401 + 0 * 8 * SLURM_NODEID))|difftrain|--config|"));
  EXPECT_THAT(calls[0], HasSubstr("/jobs/dit.yaml|"));
  EXPECT_THAT(output_, HasSubstr("launched by srun --mpi=pmix, without the controller"));
  EXPECT_THAT(output_,
              HasSubstr("ranks (srun --mpi=pmix) exit 75: CHECKPOINTED, not finished; exit 75"));
  EXPECT_FALSE(fs::exists(root_ / ".difftrain/slurm-keys")) << "the MPI launch makes no keys";

  EXPECT_EQ(RunBatch("DIFFTRAIN_LAUNCH=ssh", ""), 2) << output_;
  EXPECT_THAT(output_, HasSubstr("DIFFTRAIN_LAUNCH='ssh': expected daemons or mpi"));
}

TEST_F(SbatchScriptTest, CheckpointedJobRequeuesItselfOnlyWhenRequeueable) {
  EXPECT_EQ(RunBatch("FAKE_CONTROLLER_EXIT=75 FAKE_WORKERS_EXIT=75 FAKE_REQUEUE=1", ""), 75)
      << output_;
  EXPECT_THAT(output_, HasSubstr("CHECKPOINTED, not finished; exit 75, requeued"));
  EXPECT_THAT(ReadFile(root_ / "scontrol"), HasSubstr("requeue 42"));
  fs::remove(root_ / "scontrol");

  EXPECT_EQ(RunBatch("FAKE_CONTROLLER_EXIT=75 FAKE_WORKERS_EXIT=75 FAKE_REQUEUE=0", ""), 75)
      << output_;
  EXPECT_THAT(output_, HasSubstr("CHECKPOINTED, not finished; exit 75\n"));
  EXPECT_THAT(ReadFile(root_ / "scontrol"), Not(HasSubstr("requeue")));
  fs::remove(root_ / "scontrol");

  // DIFFTRAIN_REQUEUE overrides the job's flag.
  EXPECT_EQ(RunBatch("FAKE_CONTROLLER_EXIT=75 FAKE_REQUEUE=1 DIFFTRAIN_REQUEUE=0", ""), 75);
  EXPECT_THAT(ReadFile(root_ / "scontrol"), Not(HasSubstr("requeue")));

  // A warning before the daemons start ends the run at once, unfinished.
  fs::remove(root_ / "srun");
  EXPECT_EQ(RunBatch("FAKE_WARN_DURING_KEYS=1", ""), 75) << output_;
  EXPECT_THAT(output_, HasSubstr("warned before the daemons started"));
  EXPECT_EQ(SrunCalls().size(), 1u) << "only the keys step ran";

  EXPECT_EQ(RunBatch("FAKE_CONTROLLER_EXIT=1 FAKE_WORKERS_EXIT=1", ""), 1) << output_;
  EXPECT_THAT(output_, HasSubstr("controller exit 1, worker daemons exit 1: FAILED; exit 1"));
  EXPECT_EQ(RunBatch("", "--bogus"), 2);
  EXPECT_THAT(output_, HasSubstr("unknown option '--bogus'"));
}

}  // namespace
}  // namespace difftrain
