// Runs the built `difftrain train` as a user does: bad job files, then train and resume.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/attempt_fence.h"
#include "model/device.h"
#include "model/io/safetensors.h"
#include "model/parallel/store.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

constexpr const char* kTinyJob = R"(model:
  name: custom
  input_size: 8
  patch_size: 2
  hidden_size: 32
  depth: 2
  num_heads: 4
  num_classes: 10
batch:
  micro: 4
  global: 8
train:
  steps: 3
  log_every: 1
)";

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("train_command_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteJob(const std::string& text) {
    const std::filesystem::path job = dir_ / "job.yaml";
    std::ofstream(job) << text;
    return job.string();
  }

  // Writes `text` as the job file and runs `difftrain train` on it.
  CommandResult Train(const std::string& text, const std::string& extra = "") {
    const std::filesystem::path job = dir_ / "job.yaml";
    std::ofstream(job) << text;
    return RunDifftrain("train --config " + ShellQuote(job.string()) + " " + extra);
  }

  std::filesystem::path dir_;
};

TEST_F(TrainCommandTest, UnknownFieldExitsTwoWithLineAndColumn) {
  const CommandResult r = Train(std::string(kTinyJob) + "optimizer:\n  lrr: 0.1\n");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("job.yaml:16:3: optimizer.lrr: unknown field"), std::string::npos)
      << r.output;
}

TEST_F(TrainCommandTest, WrongTypeNamesExpectedAndFound) {
  const CommandResult r = Train(std::string(kTinyJob) + "optimizer:\n  lr: fast\n");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.lr: expected a number, found 'fast'"), std::string::npos)
      << r.output;
}

TEST_F(TrainCommandTest, BatchArithmeticIsShown) {
  std::string job = kTinyJob;
  job.replace(job.find("global: 8"), 9, "global: 10");
  const CommandResult r = Train(job);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("batch.global: expected a multiple of batch.micro"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("found 10"), std::string::npos) << r.output;
}

TEST_F(TrainCommandTest, MissingFileExitsTwo) {
  const CommandResult r = RunDifftrain("train --config /nonexistent/job.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot open '/nonexistent/job.yaml'"), std::string::npos) << r.output;
}

TEST_F(TrainCommandTest, TrainsWritesCheckpointAndResumes) {
  const std::string job =
      std::string(kTinyJob) + "checkpoint:\n  dir: " + (dir_ / "ckpt").string() + "\n  keep: 2\n";
  CommandResult r = Train(job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 3/3"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "ckpt" / "step-00000003" / "manifest.json"));

  r = Train(job, "--steps 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 5/5"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/5"), std::string::npos) << r.output;
}

// train.epochs: `difftrain train` alone resolves them from the data (20 samples, 2 epochs in steps
// of 8: 5 steps), as `difftrain validate` shows; --steps overrides them.
TEST_F(TrainCommandTest, EpochsTrainTheirStepsAndValidateShowsThem) {
  std::string job = kTinyJob;
  job.replace(job.find("  steps: 3\n"), 11, "  epochs: 2\n");
  job += "data:\n  kind: synthetic\n  max_samples: 20\n";
  CommandResult r = Train(job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("for 5 steps (2 epochs of 20 samples)"), std::string::npos) << r.output;
  // The progress line counts the passes: 5 steps of 8 samples are 2 epochs of 20.
  EXPECT_NE(r.output.find("step 5/5  epoch 2.00  loss"), std::string::npos) << r.output;
  r = RunDifftrain("validate " + ShellQuote((dir_ / "job.yaml").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("5 steps (train.epochs 2: 20 samples an epoch, 8 of the data a step)"),
            std::string::npos)
      << r.output;
  r = Train(job, "--steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/2  epoch 0.80"), std::string::npos) << r.output;

  job.replace(job.find("  max_samples: 20\n"), 18, "");
  r = Train(job);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.epochs: data.kind synthetic has a sample at every index"),
            std::string::npos)
      << r.output;
}

// checkpoint.init_from: a job starts from another run's checkpoint directory, in one process
// and under tensor parallelism alike (each rank takes its shard of the same weights), and a
// run that has a checkpoint of its own resumes it instead.
TEST_F(TrainCommandTest, InitFromStartsEveryLayoutFromTheSameWeightsAndResumingWins) {
  const std::string source =
      std::string(kTinyJob) + "checkpoint: {dir: " + (dir_ / "source").string() + "}\n";
  CommandResult r = Train(source, "--steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // Another seed, so that the weights come from the file or the test fails.
  const auto job = [&](const std::string& dir, const std::string& parallel) {
    std::string text = kTinyJob;
    text.replace(text.find("  steps: 3\n"), 11, "  steps: 1\n  seed: 9\n");
    return text + "checkpoint: {dir: " + (dir_ / dir).string() +
           ", init_from: " + (dir_ / "source").string() + "}\n" + parallel;
  };
  r = Train(job("one", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("starting from the weights of " +
                    (dir_ / "source/step-00000002/shard-00000-of-00001.safetensors").string()),
      std::string::npos)
      << r.output;
  const std::string two = WriteJob(job("two", "parallel: {tp: 2, timeout_seconds: 30}\n"));
  const std::string rank = std::string(DIFFTRAIN_BINARY) + " train --config " + ShellQuote(two) +
                           " --world 2 --store " + ShellQuote((dir_ / "store").string());
  r = testing::RunCommand(rank + " --rank 1 > " + ShellQuote((dir_ / "rank1.log").string()) +
                          " 2>&1 & " + rank +
                          " --rank 0 2>&1; code=$?; wait $! || code=$?; exit $code");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  Result<io::SafetensorsFile> from = io::SafetensorsFile::Read(
      (dir_ / "source/step-00000002/shard-00000-of-00001.safetensors").string());
  Result<io::SafetensorsFile> one = io::SafetensorsFile::Read(
      (dir_ / "one/step-00000001/shard-00000-of-00001.safetensors").string());
  Result<io::SafetensorsFile> tp2 = io::SafetensorsFile::Read(
      (dir_ / "two/step-00000001/shard-00000-of-00002.safetensors").string());
  ASSERT_TRUE(from.ok() && one.ok() && tp2.ok());
  // One step from the same weights: the two layouts agree to rounding. The patch embedding
  // moved from the source's weights by the learning rate (AdamW's first step, 1e-4 a weight);
  // the blocks' inner weights, behind adaLN gates still near their zero start, by less.
  for (const std::string& name :
       {std::string("x_embedder.proj.weight"), std::string("blocks.1.attn.qkv.weight"),
        std::string("blocks.0.mlp.fc2.weight"), std::string("ema.final_layer.linear.weight")}) {
    const io::TensorView* s = from->Find(name);
    const io::TensorView* a = one->Find(name);
    const io::TensorView* b = tp2->Find(name);
    ASSERT_TRUE(s != nullptr && a != nullptr && b != nullptr) << name;
    const size_t n = a->bytes / sizeof(float);
    std::vector<float> sv(n), av(n), bv(n);
    std::memcpy(sv.data(), s->data, a->bytes);
    std::memcpy(av.data(), a->data, a->bytes);
    std::memcpy(bv.data(), b->data, a->bytes);
    double moved = 0, apart = 0;
    for (size_t i = 0; i < n; ++i) {
      moved = std::max(moved, double(std::abs(av[i] - sv[i])));
      apart = std::max(apart, double(std::abs(av[i] - bv[i])));
    }
    EXPECT_LT(apart, 1e-6) << name;
    if (name == "x_embedder.proj.weight") {
      EXPECT_NEAR(moved, 1e-4, 1e-6) << name;
    } else {
      EXPECT_GT(moved, 0) << name;
      EXPECT_LT(moved, 1.01e-4) << name;
    }
  }

  // Its own checkpoint is resumed, the file not read again.
  r = Train(job("one", ""), "--steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("starting from the weights"), std::string::npos) << r.output;
}

// The job with `train.device: <device>` and `extra` appended to its train section.
std::string WithDevice(const std::string& device, const std::string& extra = "") {
  std::string job = kTinyJob;
  job.replace(job.find("  log_every: 1\n"), 15, "  log_every: 1\n  device: " + device + "\n");
  return job + extra;
}

// The attempt fence (common/attempt_fence.h): a rank of an attempt that is no longer the
// current one (the store says so) writes its shard but never commits the checkpoint.
TEST_F(TrainCommandTest, ARankOfAnOldAttemptCommitsNoCheckpoint) {
  const std::string store = (dir_ / "store").string();
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string job = std::string(kTinyJob) + "checkpoint:\n  dir: " + ckpt + "\n";
  // What the controller publishes when it launches attempt 1: attempt 0 is history.
  Result<parallel::FileStore> files = parallel::FileStore::Open(store);
  ASSERT_TRUE(files.ok());
  const std::string current = CurrentAttempt("c0ffee", 1);
  ASSERT_TRUE(files->Set(std::string(kCurrentAttemptKey), {current.begin(), current.end()}).ok());
  const std::string env = "DIFFTRAIN_INCARNATION=c0ffee ";
  const CommandResult old =
      testing::RunCommand(env + DIFFTRAIN_BINARY + " train --config " + ShellQuote(WriteJob(job)) +
                          " --rank 0 --world 1 --attempt 0 --store " + ShellQuote(store));
  EXPECT_EQ(old.exit_code, 1) << old.output;
  EXPECT_NE(old.output.find("not committing step 3: attempt 0 (controller c0ffee) is no longer "
                            "the job's current attempt (c0ffee:1)"),
            std::string::npos)
      << old.output;
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/step-00000003/manifest.json"));
  const CommandResult now =
      testing::RunCommand(env + DIFFTRAIN_BINARY + " train --config " + ShellQuote(WriteJob(job)) +
                          " --rank 0 --world 1 --attempt 1 --store " + ShellQuote(store));
  EXPECT_EQ(now.exit_code, 0) << now.output;
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000003/manifest.json"));
}

TEST_F(TrainCommandTest, UnknownDeviceIsNamedWhereItIs) {
  const CommandResult r = Train(WithDevice("tpu"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("job.yaml:15:11: train.device: expected auto, cpu or cuda, found 'tpu'"),
            std::string::npos)
      << r.output;
}

TEST_F(TrainCommandTest, CudaDeviceRefusesLayoutsBeyondDataParallel) {
  const CommandResult r = Train(WithDevice("cuda", "parallel:\n  tp: 2\n"), "--world 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.device cuda trains data-parallel layouts only; parallel.tp > 1 "
                          "runs on the CPU"),
            std::string::npos)
      << r.output;
}

// On a GPU the job trains there; without one (CI) it stops before any work and says why.
TEST_F(TrainCommandTest, CudaDeviceTrainsOnAGpuOrSaysWhyNot) {
  const CommandResult r = Train(WithDevice("cuda"));
  const DeviceInventory inventory = QueryDeviceInventory();
  if (inventory.gpus.empty()) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(inventory.cuda_built ? "train.device cuda: no usable GPU"
                                                 : "train.device cuda: this difftrain was built "
                                                   "without the CUDA backend"),
              std::string::npos)
        << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("computing on GPU 0"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 3/3"), std::string::npos) << r.output;
  }
}

// A worker daemon on a node without GPUs gives its ranks DIFFTRAIN_DEVICE=cpu.
TEST_F(TrainCommandTest, CudaDeviceOnANodeWithoutGpusIsRefused) {
  const std::filesystem::path job = dir_ / "job.yaml";
  std::ofstream(job) << WithDevice("cuda");
  const CommandResult r =
      testing::RunCommand("DIFFTRAIN_DEVICE=cpu " + std::string(DIFFTRAIN_BINARY) +
                          " train --config " + ShellQuote(job.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.device is cuda, but this rank's node has no GPU"),
            std::string::npos)
      << r.output;
}

// A CPU rank that reports metrics measures its MFU peak with sgemm when it starts, unless
// DIFFTRAIN_CPU_PEAK_GFLOPS gives it (ctest sets it for every test: docs/metrics.md); a value
// that is not a positive number stops the rank as bad input (exit 2), naming the variable.
TEST_F(TrainCommandTest, CpuPeakIsMeasuredOrTakenFromTheEnvironment) {
  const std::string job = WriteJob(
      std::string(kTinyJob) + "  metrics_file: " + (dir_ / "metrics-{rank}.jsonl").string() + "\n");
  auto train = [&](const std::string& env) {
    return testing::RunCommand(env + " " + std::string(DIFFTRAIN_BINARY) + " train --config " +
                               ShellQuote(job) + " --steps 1");
  };
  const CommandResult given = train("DIFFTRAIN_CPU_PEAK_GFLOPS=12.5");
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_NE(given.output.find("MFU peak 12.5 GFLOP/s: DIFFTRAIN_CPU_PEAK_GFLOPS"),
            std::string::npos)
      << given.output;
  const CommandResult measured = train("env -u DIFFTRAIN_CPU_PEAK_GFLOPS");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("GFLOP/s: OpenBLAS sgemm 1024^3"), std::string::npos)
      << measured.output;
  const CommandResult bad = train("DIFFTRAIN_CPU_PEAK_GFLOPS=fast");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("DIFFTRAIN_CPU_PEAK_GFLOPS='fast': expected a positive number"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace difftrain
