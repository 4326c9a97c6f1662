// Data parallelism is the same computation as one process: real `difftrain train` ranks
// over Gloo on loopback, compared step by step and parameter by parameter with a single
// process that trains on the same global batch.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/io/checkpoint.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

constexpr int kMicro = 2;
constexpr int kSteps = 10;

struct Layout {
  int dp = 1;
  int accumulation = 1;
  bool zero1 = false;
};

std::string Name(const Layout& l) {
  return "dp" + std::to_string(l.dp) + "_acc" + std::to_string(l.accumulation) +
         (l.zero1 ? "_zero1" : "");
}

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("data_parallel_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }

  // Writes the job of a run named `name` with global batch `global` and returns its path.
  std::filesystem::path WriteJob(const std::string& name, int global, bool zero1, int steps,
                                 double timeout_seconds = 60) {
    const std::filesystem::path dir = root_ / name;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "job.yaml")
        << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
           "num_heads: 4, num_classes: 10}\n"
        << "batch: {micro: " << kMicro << ", global: " << global << "}\n"
        << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
        << "train: {steps: " << steps << ", log_every: 1, metrics_file: \""
        << (dir / "metrics-{rank}.jsonl").string()
        << "\"}\n"
        // Small buckets: several of them, one padded for ZeRO-1.
        << "parallel: {zero1: " << (zero1 ? "true" : "false")
        << ", bucket_mb: 0.02, timeout_seconds: " << timeout_seconds << "}\n"
        << "checkpoint: {dir: \"" << (dir / "ckpt").string() << "\", keep: 5}\n";
    return dir / "job.yaml";
  }

  // Runs `world` ranks of `job` (all but rank 0 in the background) and returns rank 0's
  // output; the exit code is 0 only when every rank succeeded.
  CommandResult RunRanks(const std::filesystem::path& job, int world,
                         const std::string& extra = "") {
    const std::string store = (job.parent_path() / ("store-" + std::to_string(runs_++))).string();
    auto rank = [&](int r) {
      return "OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) + " train --config " +
             ShellQuote(job.string()) + " --rank " + std::to_string(r) + " --world " +
             std::to_string(world) + " --store " + ShellQuote(store) + " " + extra;
    };
    auto log = [&](int r) { return ShellQuote(store + "-rank" + std::to_string(r) + ".log"); };
    std::string script = "rc=0; ";
    for (int r = 1; r < world; ++r) {
      script += rank(r) + " >" + log(r) + " 2>&1 & p" + std::to_string(r) + "=$!; ";
    }
    script += rank(0) + " || rc=1; ";
    for (int r = 1; r < world; ++r)
      script += "wait $p" + std::to_string(r) + " || rc=1; ";
    // On failure, show what the other ranks said too.
    for (int r = 1; r < world; ++r)
      script += "[ $rc = 0 ] || tail -5 " + log(r) + "; ";
    script += "exit $rc";
    return RunCommand("sh -c " + ShellQuote(script));
  }

  // A single process (no communicator) training on the same global batch.
  std::filesystem::path Reference(int global) {
    const std::string name = "reference_" + std::to_string(global);
    const std::filesystem::path job = WriteJob(name, global, false, kSteps);
    if (!std::filesystem::exists(job.parent_path() / "metrics-0.jsonl")) {
      const CommandResult r = RunCommand("OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) +
                                         " train --config " + ShellQuote(job.string()));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    return job.parent_path();
  }

  static std::vector<double> Losses(const std::filesystem::path& dir) {
    std::vector<double> losses;
    std::ifstream in(dir / "metrics-0.jsonl");
    for (std::string line; std::getline(in, line);) {
      losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return losses;
  }

  // Relative L2 distance of the final model tensors (shard 0 of the newest checkpoint).
  static double ParameterDistance(const std::filesystem::path& a, const std::filesystem::path& b) {
    auto load = [](const std::filesystem::path& dir) {
      io::CheckpointStore store((dir / "ckpt").string(), 5);
      const int64_t step = store.LatestComplete()->value();
      return std::move(store.ReadShard(step, 0, *store.World(step))).value();
    };
    const io::SafetensorsFile fa = load(a), fb = load(b);
    double diff = 0, norm = 0;
    for (const std::string& name : fb.Names()) {
      if (name.rfind("optim.", 0) == 0) continue;
      const io::TensorView* x = fa.Find(name);
      const io::TensorView* y = fb.Find(name);
      EXPECT_NE(x, nullptr) << name;
      if (x == nullptr) return 1;
      std::vector<float> u(x->bytes / 4), v(y->bytes / 4);
      std::memcpy(u.data(), x->data, x->bytes);
      std::memcpy(v.data(), y->data, y->bytes);
      for (size_t i = 0; i < u.size(); ++i) {
        diff += (double(u[i]) - v[i]) * (double(u[i]) - v[i]);
        norm += double(v[i]) * v[i];
      }
    }
    return std::sqrt(diff / norm);
  }

  static void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want,
                               const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << " step " << i + 1;
    }
  }

  std::filesystem::path root_;
  int runs_ = 0;
};

TEST_F(DataParallelTest, EveryLayoutEqualsOneProcess) {
  for (int dp : {1, 2, 4}) {
    for (int accumulation : {1, 2}) {
      for (bool zero1 : {false, true}) {
        const Layout layout{dp, accumulation, zero1};
        const int global = kMicro * dp * accumulation;
        const std::filesystem::path job = WriteJob(Name(layout), global, zero1, kSteps);
        const CommandResult r = RunRanks(job, dp);
        ASSERT_EQ(r.exit_code, 0) << Name(layout) << "\n" << r.output;
        const std::filesystem::path reference = Reference(global);
        ExpectSameLosses(Losses(job.parent_path()), Losses(reference), Name(layout));
        EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5) << Name(layout);
      }
    }
  }
}

TEST_F(DataParallelTest, CheckpointOfOneLayoutResumesInAnother) {
  // Five steps with dp=2 and ZeRO-1, then five more with dp=4 without it, then with dp=1:
  // the same losses and parameters as ten uninterrupted steps of one process.
  const int global = kMicro * 4;
  const std::filesystem::path job = WriteJob("reshard", global, true, kSteps);
  CommandResult r = RunRanks(job, 2, "--steps 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::filesystem::path unsharded = WriteJob("reshard", global, false, kSteps);
  r = RunRanks(unsharded, 4, "--steps 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 5"), std::string::npos) << r.output;
  r = RunRanks(unsharded, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 8"), std::string::npos) << r.output;

  const std::filesystem::path reference = Reference(global);
  ExpectSameLosses(Losses(job.parent_path()), Losses(reference), "resharded");
  EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5);
}

TEST_F(DataParallelTest, KilledRankMakesTheOthersFailWithinTheTimeout) {
  const double timeout = 3;
  const std::filesystem::path job = WriteJob("killed", kMicro * 2, false, 100000, timeout);
  const std::filesystem::path dir = job.parent_path();
  const std::string common = "OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) +
                             " train --config " + ShellQuote(job.string()) + " --world 2 --store " +
                             ShellQuote((dir / "store").string());
  // Rank 1 in the background, its pid in a file; rank 0 in the foreground of this pipe.
  const std::string rank1 =
      "sh -c " +
      ShellQuote(common + " --rank 1 >/dev/null 2>&1 & echo $! > " + (dir / "rank1.pid").string());
  ASSERT_EQ(std::system(rank1.c_str()), 0);
  std::thread killer([&] {
    // Once both ranks train (rank 0 wrote two steps), kill rank 1 mid-run.
    for (int i = 0; i < 600; ++i) {
      std::ifstream metrics(dir / "metrics-0.jsonl");
      int lines = 0;
      for (std::string line; std::getline(metrics, line);)
        ++lines;
      if (lines >= 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    int pid = 0;
    std::ifstream(dir / "rank1.pid") >> pid;
    if (pid > 0) ::kill(pid, SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = RunCommand(common + " --rank 0");
  killer.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dp[0,1]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("missing ranks: 1"), std::string::npos) << r.output;
  // Start-up, two steps, then at most the timeout and its grace period.
  EXPECT_LT(seconds, 30) << r.output;
}

}  // namespace
}  // namespace difftrain
