// A rank under a memory limit (Slurm's --mem with task/cgroup, a pod's limits.memory, podman
// --memory: a memory cgroup) whose job needs more than the limit stops with an error that
// names the job's sizes and the limit, instead of being OOM-killed without a word while it
// fills its arenas; a job that fits trains under the same limit. Real cgroups: the test makes
// a child of its own memory cgroup (v1 or v2, whichever the kernel gives), sets its limit and
// starts `difftrain train` in it. Where no cgroup can be made (not root, a read-only
// hierarchy, no memory controller) it skips, saying why.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/tensor/host_memory.h"
#include "tests/testing/memory_job.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

constexpr size_t kLimit = size_t(512) << 20;

// A child cgroup of this process's memory cgroup with a limit of `bytes`, removed when done.
class LimitedCgroup {
 public:
  // Empty with `why` set where none can be made here.
  static std::optional<LimitedCgroup> Make(size_t bytes, std::string* why) {
    std::ifstream lines("/proc/self/cgroup");
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      fs::path parent;
      int version = 0;
      if (line.compare(0, a, "0") == 0 && controllers.empty() &&
          fs::exists("/sys/fs/cgroup/cgroup.controllers")) {
        parent = fs::path("/sys/fs/cgroup") / path.substr(1);
        version = 2;
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        parent = fs::path("/sys/fs/cgroup/memory") / path.substr(1);
        version = 1;
      } else {
        continue;
      }
      LimitedCgroup made(parent / ("difftrain-memory-test-" + std::to_string(getpid())));
      std::error_code ec;
      if (!fs::create_directory(made.dir_, ec)) {
        *why = "cannot make the cgroup " + made.dir_.string() + ": " + ec.message();
        made.dir_.clear();
        return std::nullopt;
      }
      // No swap either, so the limit is the memory the process may touch.
      const std::string limit = std::to_string(bytes);
      const bool set = version == 2 ? made.Set("memory.max", limit) &&
                                          (made.Set("memory.swap.max", "0") ||
                                           !fs::exists(made.dir_ / "memory.swap.max"))
                                    : made.Set("memory.limit_in_bytes", limit) &&
                                          (made.Set("memory.memsw.limit_in_bytes", limit) ||
                                           !fs::exists(made.dir_ / "memory.memsw.limit_in_bytes"));
      if (!set) {
        *why = "cannot set the memory limit of " + made.dir_.string();
        return std::nullopt;
      }
      return made;
    }
    *why = "this process is in no memory cgroup this test can find (/proc/self/cgroup)";
    return std::nullopt;
  }

  LimitedCgroup(LimitedCgroup&& other) noexcept : dir_(std::move(other.dir_)) {
    other.dir_.clear();
  }
  ~LimitedCgroup() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove(dir_, ec);  // rmdir: its processes have exited
  }

  // `command` run by a shell that first moves itself into this cgroup.
  // Its cgroup.procs, quoted for a shell.
  std::string procs() const { return testing::ShellQuote((dir_ / "cgroup.procs").string()); }
  std::string Inside(const std::string& command) const {
    return "echo $$ > " + testing::ShellQuote((dir_ / "cgroup.procs").string()) + " && exec " +
           command;
  }

 private:
  explicit LimitedCgroup(fs::path dir) : dir_(std::move(dir)) {}
  bool Set(const std::string& file, const std::string& value) const {
    std::ofstream out(dir_ / file);
    out << value;
    out.flush();
    return static_cast<bool>(out);
  }

  fs::path dir_;
};

class MemoryLimitTest : public ::testing::Test {
 protected:
  // A cgroup of kLimit for each test, or the test skips saying why.
  void SetUp() override {
    std::string why;
    std::optional<LimitedCgroup> made = LimitedCgroup::Make(kLimit, &why);
    if (!made) GTEST_SKIP() << why;
    cgroup_.emplace(std::move(*made));
  }

  // testing::MemoryJobYaml as a file; micro 0: a global batch of 128, no micro-batch.
  std::string Job(int micro, int steps = 1) {
    const std::string path = tmp_.path() + "/job-" + std::to_string(micro) + ".yaml";
    std::ofstream(path) << testing::MemoryJobYaml(
        micro, micro > 0 ? micro : 128, steps,
        tmp_.path() + "/checkpoints-" + std::to_string(micro));
    return path;
  }
  testing::CommandResult Train(int micro) {
    return testing::RunCommand(cgroup_->Inside("env OMP_NUM_THREADS=1 " +
                                               std::string(DIFFTRAIN_BINARY) + " train --config " +
                                               testing::ShellQuote(Job(micro))));
  }

  TempDir tmp_;
  std::optional<LimitedCgroup> cgroup_;
};

TEST_F(MemoryLimitTest, AJobBeyondTheLimitIsAnErrorNotAnOomKill) {
  const testing::CommandResult r = Train(128);
  // RunCommand gives -1 for a process killed by a signal (the OOM killer's SIGKILL).
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("out of host memory creating the trainer: custom with 1x4x32x32 "
                          "samples (frames x channels x height x width) at batch.micro 128"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("GiB of host memory (parameters "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GiB memory limit of this process's cgroup"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("difftrain-memory-test-"), std::string::npos) << r.output;
}

// Launched as a user would (`difftrain run`: controller, worker daemon, rank), all under the
// limit: the worker daemon reports the limit as its node's memory, and the controller fails
// the job before starting a rank, where a rank would fail the same way on every attempt.
TEST_F(MemoryLimitTest, ARunBeyondTheLimitFailsBeforeAnyRankStarts) {
  const testing::CommandResult r = testing::RunCommand(cgroup_->Inside(
      "timeout 120 " + std::string(DIFFTRAIN_BINARY) + " run " + testing::ShellQuote(Job(128))));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("0.5 GiB by the memory limit of cgroup"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("node local-0 cannot hold its 1 rank(s) 0..0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the memory limit of its worker daemon's cgroup"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("final state FAILED, restarts 0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started ranks"), std::string::npos) << r.output;
}

// `parallel: auto` plans for the limit, not the machine: at a global batch of 128 it takes a
// micro-batch whose activations fit 0.5 GiB, where the machine's memory takes all 128 at once.
TEST_F(MemoryLimitTest, ParallelAutoPlansForTheLimit) {
  const std::string job = Job(0);
  std::ofstream(job, std::ios::app) << "parallel: auto\n";
  const testing::CommandResult outside =
      testing::RunCommand(std::string(DIFFTRAIN_BINARY) + " validate " + testing::ShellQuote(job));
  ASSERT_EQ(outside.exit_code, 0) << outside.output;
  if (outside.output.find("global 128 = micro 128 x") == std::string::npos) {
    GTEST_SKIP() << "this machine's own memory does not take micro-batch 128: " << outside.output;
  }
  const testing::CommandResult r = testing::RunCommand(
      cgroup_->Inside("timeout 300 env OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) +
                      " run " + testing::ShellQuote(job)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("final state SUCCEEDED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("global batch 128 = micro "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("global batch 128 = micro 128 x"), std::string::npos) << r.output;
}

// What the checks cannot see: a rank that fits is OOM-killed later, when a process beside it
// in the cgroup takes the memory. The rank gets oom_score_adj 1000 (which may be raised
// without privilege) so that the OOM killer takes it, not the process that asked: the largest
// process is its own choice, which is the rank too, but a second kill, before the first
// victim's memory is freed on a busy machine, would take the next largest. The worker daemon
// says the SIGKILL came from the OOM killer, and the controller's cause says so.
TEST_F(MemoryLimitTest, ARankTheOomKillerKillsIsNamedSo) {
  if (OomKillCount() < 0) GTEST_SKIP() << "this kernel's /proc/vmstat has no oom_kill count";
  const std::string job = Job(32, 100000);
  std::ofstream(job, std::ios::app) << "restart: {max_restarts: 0}\n";
  const std::string log = tmp_.path() + "/run.log";
  // The run in the background; once its rank trains (holding about 350 MiB), 250 MiB more in
  // the 512 MiB cgroup: enough for one kill, the rank's, to make room.
  const std::string script =
      "(timeout 60 " + std::string(DIFFTRAIN_BINARY) + " run " + testing::ShellQuote(job) + " > " +
      log + " 2>&1; echo \"run exit $?\" >> " + log + ") & " +
      "for i in $(seq 600); do grep -q -- '-> RUNNING' " + log + " && break; sleep 0.1; done; " +
      "for p in $(cat " + cgroup_->procs() + "); do [ \"$(tr '\\0' '\\n' < /proc/$p/cmdline | " +
      "sed -n 2p)\" = train ] && echo 1000 > /proc/$p/oom_score_adj; done; " +
      "python3 -c \"import time; b = b'x' * (250 << 20); time.sleep(2)\"; wait; cat " + log;
  const testing::CommandResult r =
      testing::RunCommand(cgroup_->Inside("sh -c " + testing::ShellQuote(script)));
  EXPECT_NE(r.output.find("run exit 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by signal 9 by the kernel's OOM killer (its count rose "
                          "meanwhile): out of host memory; this node's ranks may use the 0.50 "
                          "GiB memory limit of cgroup"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 on node local-0 was killed by signal 9 by the kernel's OOM "
                          "killer"),
            std::string::npos)
      << r.output;
}

TEST_F(MemoryLimitTest, AJobWithinTheLimitTrains) {
  const testing::CommandResult r = Train(16);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace difftrain
