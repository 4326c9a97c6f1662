// Test support for "a parallel run is the same computation as one process": real
// `difftrain train` ranks over Gloo on loopback, their per-step losses and final
// checkpoints compared with a single process that trains on the same global batch.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/io/checkpoint.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {

class ParallelTrainingTest : public ::testing::Test {
 protected:
  // `model` is the job's model section, `micro` its micro-batch.
  ParallelTrainingTest(std::string model, int micro) : model_(std::move(model)), micro_(micro) {}

  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("parallel_training_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }

  // Writes the job of a run named `name` with global batch `global` and returns its path;
  // `layout` adds fields to the parallel section ("tp: 2, pp: 2").
  std::filesystem::path WriteJob(const std::string& name, int global, bool zero1, int steps,
                                 const std::string& layout = "", double timeout_seconds = 60) {
    const std::filesystem::path dir = root_ / name;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "job.yaml")
        << "model: " << model_ << "\n"
        << "batch: {micro: " << micro_ << ", global: " << global << "}\n"
        << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
        << "train: {steps: " << steps << ", log_every: 1, metrics_file: \""
        << (dir / "metrics-{rank}.jsonl").string()
        << "\"}\n"
        // Small buckets: several of them, one padded for ZeRO-1.
        << "parallel: {" << (layout.empty() ? "" : layout + ", ")
        << "zero1: " << (zero1 ? "true" : "false")
        << ", bucket_mb: 0.02, timeout_seconds: " << timeout_seconds << "}\n"
        << "checkpoint: {dir: \"" << (dir / "ckpt").string() << "\", keep: 5}\n"
        << sections_;
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

  // A single process (no communicator) training `steps` steps on the same global batch.
  std::filesystem::path Reference(int global, int steps) {
    const std::string name =
        "reference_" + std::to_string(global) + (sections_.empty() ? "" : "_sections");
    const std::filesystem::path dir = root_ / name;
    if (!std::filesystem::exists(dir / "metrics-0.jsonl")) {
      const std::filesystem::path job = WriteJob(name, global, false, steps);
      const CommandResult r = RunCommand("OMP_NUM_THREADS=1 " + std::string(DIFFTRAIN_BINARY) +
                                         " train --config " + ShellQuote(job.string()));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    return dir;
  }

  // The JSON lines of one rank's metrics file.
  static std::vector<nlohmann::json> Metrics(const std::filesystem::path& dir, int rank = 0) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir / ("metrics-" + std::to_string(rank) + ".jsonl"));
    for (std::string line; std::getline(in, line);)
      lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  static std::vector<double> Losses(const std::filesystem::path& dir) {
    std::vector<double> losses;
    for (const nlohmann::json& line : Metrics(dir))
      losses.push_back(line["loss"].get<double>());
    return losses;
  }

  // Relative L2 distance of the final model tensors and their EMA (shard 0 of the newest
  // checkpoint).
  static double ParameterDistance(const std::filesystem::path& a, const std::filesystem::path& b) {
    return Distance(a, b, [](const std::string& name) { return name.rfind("optim.", 0) != 0; });
  }
  // The larger relative L2 distance of the two final AdamW moments of the whole model.
  static double MomentDistance(const std::filesystem::path& a, const std::filesystem::path& b) {
    double most = 0;
    for (const char* moment : {"optim.exp_avg", "optim.exp_avg_sq"})
      most = std::max(most, Distance(a, b, [&](const std::string& name) { return name == moment; }));
    return most;
  }
  // Relative L2 distance of the tensors of b's that `which` takes, concatenated (1: a lacks one).
  template <typename Which>
  static double Distance(const std::filesystem::path& a, const std::filesystem::path& b,
                         Which which) {
    auto load = [](const std::filesystem::path& dir) {
      io::CheckpointStore store((dir / "ckpt").string(), 5);
      const int64_t step = store.LatestComplete()->value();
      return std::move(store.ReadShard(step, 0, *store.World(step))).value();
    };
    const io::SafetensorsFile fa = load(a), fb = load(b);
    double diff = 0, norm = 0;
    for (const std::string& name : fb.Names()) {
      if (!which(name)) continue;
      const io::TensorView* x = fa.Find(name);
      const io::TensorView* y = fb.Find(name);
      EXPECT_NE(x, nullptr) << name;
      if (x == nullptr || x->bytes != y->bytes) return 1;
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
  // More sections of every job written after it is set ("lora: {rank: 2}\n"), the reference's
  // too.
  std::string sections_;

 private:
  std::string model_;
  int micro_;
  int runs_ = 0;
};

}  // namespace difftrain::testing
