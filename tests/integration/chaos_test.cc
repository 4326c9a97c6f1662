// The chaos driver: a real controller and real worker daemons under a supervisor (a daemon
// that exits is started again, and so is the controller after exit 75 or a signal), and
// random faults at random moments: kill -9 of a rank, of a daemon, of the controller;
// SIGTERM to the controller; SIGSTOP of a rank; a byte of the newest checkpoint flipped;
// a node's link cut for a while (when network namespaces can be made). Every trial must end
// with exit 0 and every tensor of the final checkpoint equal to an uninterrupted run's.
//
// `make test` runs a few trials; bench/chaos.sh runs hundreds (DIFFTRAIN_CHAOS_TRIALS,
// DIFFTRAIN_CHAOS_SEED) and prints the fault mix and the time to recover from each kind.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/curve.h"
#include "common/temp_dir.h"
#include "model/io/checkpoint.h"
#include "tests/testing/cluster_job.h"
#include "tests/testing/network.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using testing::ChildrenOf;
using testing::ClusterJob;
using testing::ClusterJobSpec;
using testing::Network;
using testing::Process;

enum class Fault {
  kKillRank,
  kKillDaemon,
  kKillController,
  kTermController,
  kStopRank,
  kCorruptCheckpoint,
  kCutLink
};
constexpr Fault kFaults[] = {Fault::kKillRank,       Fault::kKillDaemon, Fault::kKillController,
                             Fault::kTermController, Fault::kStopRank,   Fault::kCorruptCheckpoint,
                             Fault::kCutLink};

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kKillRank:
      return "kill -9 rank";
    case Fault::kKillDaemon:
      return "kill -9 daemon";
    case Fault::kKillController:
      return "kill -9 controller";
    case Fault::kTermController:
      return "SIGTERM controller";
    case Fault::kStopRank:
      return "SIGSTOP rank";
    case Fault::kCorruptCheckpoint:
      return "corrupt newest checkpoint";
    case Fault::kCutLink:
      return "cut a node's link";
  }
  return "?";
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// What a trial saw of one fault: when it came and how long until the job ran again.
struct Injected {
  Fault fault;
  double at_seconds = 0;
  std::optional<double> recovered_seconds;  // until the next "-> RUNNING"; none: no restart
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = (fs::path(dir_.path()) / "keys").string();
    ASSERT_TRUE(WriteNewKeys(keys_).ok());
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
    if (Network::Unavailable().empty()) {
      network_ = std::make_unique<Network>(fs::path(dir_.path()) / "ip.log");
      if (!network_->MakeStar({"c", "n0", "n1"})) network_.reset();
    }
    if (!network_) std::printf("chaos: no network namespaces here; links are not cut\n");
    spec_.steps = 120;
    spec_.parallel = "{zero1: true, timeout_seconds: 4}";
    spec_.restart = "stop_grace_seconds: 3, hang_seconds: 3";
    spec_.max_restarts = 1000;
  }
  std::unique_ptr<ClusterJob> MakeJob(const std::string& name) {
    const std::string endpoint =
        network_ ? Network::Endpoint() : "ipc://" + dir_.path() + "/" + name + ".sock";
    return std::make_unique<ClusterJob>(fs::path(dir_.path()) / name, spec_, endpoint, keys_);
  }
  std::vector<std::string> In(const std::string& host) const {
    return network_ ? network_->Exec(host) : std::vector<std::string>{};
  }

  // The job under a supervisor, with `faults` injected at random moments. Returns the
  // controller's last exit code (0 unless the job failed or the trial ran out of time).
  int Supervise(ClusterJob& job, std::mt19937& random, int faults, std::vector<Injected>* log) {
    const auto start = Clock::now();
    const auto deadline = start + 300s;
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    std::unique_ptr<Process> controller = job.StartController(In("c"));
    std::unique_ptr<Process> workers[2] = {job.StartWorker("n0", In("n0")),
                                           job.StartWorker("n1", In("n1"))};
    std::optional<std::pair<std::string, Clock::time_point>> cut;  // node, restore at
    auto next_fault = Clock::now() + Delay(random);
    int code = -2;
    while (Clock::now() < deadline) {
      // Recovery: a fault is over when the controller log shows the next RUNNING.
      const int running = Count(job, "-> RUNNING");
      for (Injected& i : *log) {
        if (!i.recovered_seconds && i.fault != Fault::kCorruptCheckpoint &&
            running > running_at_[&i - log->data()]) {
          i.recovered_seconds = since() - i.at_seconds;
        }
      }
      if (cut && Clock::now() >= cut->second) {
        EXPECT_TRUE(network_->SetLink(cut->first, true));
        cut.reset();
      }
      if (std::optional<int> exited = controller->TryWait()) {
        code = *exited;
        if (code == 0 || code == 1 || code == 2) break;
        controller = job.StartController(In("c"));  // 75, or killed: a requeue
      }
      // A daemon that exits is started again, even after a success (exit 0): the controller
      // may yet be killed before it exits, and its next run needs daemons (a requeued job
      // gets new ones). Those of a finished job are killed at the end.
      for (int n = 0; n < 2; ++n) {
        if (workers[n]->TryWait()) {
          workers[n] = job.StartWorker("n" + std::to_string(n), In("n" + std::to_string(n)));
        }
      }
      if (faults > 0 && Clock::now() >= next_fault) {
        if (Inject(job, random, *controller, workers, &cut)) {
          --faults;
          log->push_back({last_fault_, since(), std::nullopt});
          running_at_.push_back(running);
        }
        next_fault = Clock::now() + Delay(random);
      }
      std::this_thread::sleep_for(20ms);
    }
    if (cut) {
      EXPECT_TRUE(network_->SetLink(cut->first, true));
    }
    return code;
  }

  static Clock::duration Delay(std::mt19937& random) {
    return std::chrono::milliseconds(std::uniform_int_distribution<int>(300, 3000)(random));
  }

  static int Count(const ClusterJob& job, const std::string& text) {
    const std::string log = testing::ReadWholeFile(job.dir() / "controller.log");
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1))
      ++n;
    return n;
  }

  // One random fault; false when it does not apply now (no ranks running, say).
  bool Inject(ClusterJob& job, std::mt19937& random, Process& controller,
              std::unique_ptr<Process>* workers,
              std::optional<std::pair<std::string, Clock::time_point>>* cut) {
    const int kinds = network_ ? 7 : 6;
    const Fault f = kFaults[std::uniform_int_distribution<int>(0, kinds - 1)(random)];
    const int node = std::uniform_int_distribution<int>(0, 1)(random);
    last_fault_ = f;
    switch (f) {
      case Fault::kKillRank:
      case Fault::kStopRank: {
        const std::vector<pid_t> ranks = ChildrenOf(workers[node]->pid(), "train");
        if (ranks.empty()) return false;
        const pid_t rank =
            ranks[std::uniform_int_distribution<size_t>(0, ranks.size() - 1)(random)];
        return ::kill(rank, f == Fault::kKillRank ? SIGKILL : SIGSTOP) == 0;
      }
      case Fault::kKillDaemon:
        workers[node]->Signal(SIGKILL);
        return true;
      case Fault::kKillController:
        controller.Signal(SIGKILL);
        return true;
      case Fault::kTermController:
        controller.Signal(SIGTERM);
        return true;
      case Fault::kCorruptCheckpoint:
        return CorruptNewest(job, random);
      case Fault::kCutLink: {
        if (*cut) return false;
        const std::string host = "n" + std::to_string(node);
        if (!network_->SetLink(host, false)) return false;
        *cut = {host, Clock::now() + std::chrono::milliseconds(
                                         std::uniform_int_distribution<int>(500, 5000)(random))};
        return true;
      }
    }
    return false;
  }

  // Flips one byte of a shard of the newest complete checkpoint, unless it is the last
  // step's (the job would end on the step before, and the comparison would say nothing).
  bool CorruptNewest(ClusterJob& job, std::mt19937& random) {
    io::CheckpointStore store((job.dir() / "ckpt").string(), 0);
    Result<std::optional<int64_t>> latest = store.LatestComplete();
    if (!latest.ok() || !*latest || **latest >= spec_.steps - 8) return false;
    std::vector<fs::path> shards;
    std::error_code error;
    for (const auto& e : fs::directory_iterator(store.StepDir(**latest), error)) {
      if (e.path().extension() == ".safetensors") shards.push_back(e.path());
    }
    if (shards.empty()) return false;
    const fs::path shard =
        shards[std::uniform_int_distribution<size_t>(0, shards.size() - 1)(random)];
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<int64_t>(fs::file_size(shard, error));
    if (!f || error || size < 1) return false;
    const int64_t at = std::uniform_int_distribution<int64_t>(0, size - 1)(random);
    f.seekg(at);
    char byte = 0;
    f.get(byte);
    f.seekp(at);
    f.put(static_cast<char>(byte ^ 0x5a));
    return static_cast<bool>(f);
  }

  testing::RestoredEnv tmpdir_{"TMPDIR"};  // before dir_, which TMPDIR points into
  TempDir dir_;
  std::string keys_;
  std::unique_ptr<Network> network_;
  ClusterJobSpec spec_;
  Fault last_fault_ = Fault::kKillRank;
  std::vector<int> running_at_;  // "-> RUNNING" lines when each fault came
};

TEST_F(ChaosTest, RandomFaultsEndBitIdenticalToAnUninterruptedRun) {
  const int trials = EnvInt("DIFFTRAIN_CHAOS_TRIALS", 2);
  const unsigned seed = static_cast<unsigned>(
      EnvInt("DIFFTRAIN_CHAOS_SEED", static_cast<int>(std::random_device{}() & 0x7fffffff)));
  std::printf("chaos: %d trials, seed %u\n", trials, seed);
  std::mt19937 random(seed);

  std::map<std::string, std::string> reference;
  {
    std::unique_ptr<ClusterJob> job = MakeJob("reference");
    std::unique_ptr<Process> controller = job->StartController(In("c"));
    std::unique_ptr<Process> w0 = job->StartWorker("n0", In("n0"));
    std::unique_ptr<Process> w1 = job->StartWorker("n1", In("n1"));
    ASSERT_EQ(controller->Wait(), 0) << job->Logs();
    int64_t step = 0;
    reference = job->NewestCheckpoint(&step);
    ASSERT_EQ(step, spec_.steps);
  }
  std::map<std::string, std::vector<double>> recovery;  // by fault kind
  std::map<std::string, int> injected;
  int passed = 0;
  for (int t = 0; t < trials; ++t) {
    std::unique_ptr<ClusterJob> job = MakeJob(fmt::format("trial-{}", t));
    std::vector<Injected> faults;
    running_at_.clear();
    const auto start = Clock::now();
    const int code =
        Supervise(*job, random, std::uniform_int_distribution<int>(1, 3)(random), &faults);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    int64_t step = 0;
    const auto final_state = job->NewestCheckpoint(&step);
    const bool identical = code == 0 && final_state == reference;
    std::string what;
    for (const Injected& i : faults) {
      what += fmt::format("{}{} at {:.1f} s", what.empty() ? "" : ", ", FaultName(i.fault),
                          i.at_seconds);
      if (i.recovered_seconds)
        what += fmt::format(" (running again after {:.1f} s)", *i.recovered_seconds);
      ++injected[FaultName(i.fault)];
      if (i.recovered_seconds) recovery[FaultName(i.fault)].push_back(*i.recovered_seconds);
    }
    std::printf("chaos trial %d: %s; exit %d, %s, %.1f s\n", t, what.c_str(), code,
                identical ? "bit-identical" : "DIFFERS", seconds);
    std::fflush(stdout);
    EXPECT_EQ(code, 0) << "trial " << t << " (seed " << seed << "): " << what << "\n"
                       << job->Logs();
    if (code == 0) testing::ExpectIdenticalTensors(final_state, reference);
    if (identical) {
      ++passed;
      std::error_code ignored;
      fs::remove_all(job->dir(), ignored);  // a long run keeps only the failures
    }
  }
  std::printf("chaos: %d of %d trials exit 0 and bit-identical (seed %u)\n", passed, trials, seed);
  std::printf("| fault | injected | recovered | median s | max s |\n|---|---|---|---|---|\n");
  for (const auto& [name, n] : injected) {
    std::vector<double> r = recovery[name];
    std::sort(r.begin(), r.end());
    std::printf("| %s | %d | %zu | %s | %s |\n", name.c_str(), n, r.size(),
                r.empty() ? "-" : fmt::format("{:.1f}", r[r.size() / 2]).c_str(),
                r.empty() ? "-" : fmt::format("{:.1f}", r.back()).c_str());
  }
}

}  // namespace
}  // namespace difftrain
