// Data parallelism is the same computation as one process: real `difftrain train` ranks
// over Gloo on loopback, compared step by step and parameter by parameter with a single
// process that trains on the same global batch.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "model/data/dataset.h"
#include "model/data/latent_folder.h"
#include "tests/testing/parallel_training.h"

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

class DataParallelTest : public testing::ParallelTrainingTest {
 protected:
  DataParallelTest()
      : ParallelTrainingTest(
            "{name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
            "num_heads: 4, num_classes: 10}",
            kMicro) {}

  std::filesystem::path WriteJob(const std::string& name, int global, bool zero1, int steps,
                                 double timeout_seconds = 60) {
    return ParallelTrainingTest::WriteJob(name, global, zero1, steps, "", timeout_seconds);
  }
  std::filesystem::path Reference(int global) {
    return ParallelTrainingTest::Reference(global, kSteps);
  }
  // Two ranks accumulating two micro-batches each against one process on the same global
  // batch, both of the job sections_ gives: the same losses, parameters within 1e-5. Returns
  // the one process's folder.
  std::filesystem::path ExpectTwoRanksEqualOneProcess(const std::string& name) {
    const int global = kMicro * 4;
    const std::filesystem::path reference = Reference(global);
    const std::filesystem::path job = WriteJob(name + "_dp2_acc2", global, false, kSteps);
    const CommandResult r = RunRanks(job, 2);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return reference;
    ExpectSameLosses(Losses(job.parent_path()), Losses(reference), name + " dp2");
    EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5);
    return reference;
  }
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

// LoRA training (model/train/lora_adapters.h): the adapters' gradients averaged over the ranks
// are one process's, and a checkpoint of two ranks resumes on four.
TEST_F(DataParallelTest, LoraEqualsOneProcessAndResumesInAnotherLayout) {
  // At DiT's initialisation only the final layer has gradients (its zeros gate the rest).
  sections_ = "lora: {rank: 2, alpha: 4, targets: [final_layer.linear, adaLN_modulation.1, qkv]}\n";
  const std::filesystem::path reference = ExpectTwoRanksEqualOneProcess("lora");
  ASSERT_FALSE(HasFailure());

  const std::filesystem::path reshard = WriteJob("lora_reshard", kMicro * 4, false, kSteps);
  CommandResult r = RunRanks(reshard, 2, "--steps 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunRanks(reshard, 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 5"), std::string::npos) << r.output;
  EXPECT_LE(ParameterDistance(reshard.parent_path(), reference), 1e-5);
}

// DoRA (lora.use_dora): the magnitudes' gradients are linear in the model's too, so two ranks
// averaging the adapters' are one process.
TEST_F(DataParallelTest, DoraEqualsOneProcess) {
  sections_ =
      "lora: {rank: 2, alpha: 4, use_dora: true, targets: [final_layer.linear, "
      "adaLN_modulation.1, qkv]}\n";
  ExpectTwoRanksEqualOneProcess("dora");
}

// DreamBooth's prior preservation: each rank's micro-batches take their halves from the data and
// from the prior's folder, and the step is one process's.
TEST_F(DataParallelTest, PriorPreservationEqualsOneProcess) {
  const std::filesystem::path prior = root_ / "prior";
  const SyntheticDataset source(99, 4, 8, 10);
  ASSERT_TRUE(WriteLatentFolder(PrefixDataset(source, 12), prior.string(), 5).ok());
  sections_ = "data: {prior_path: \"" + prior.string() +
              "\", prior_loss_weight: 0.5}\ndiffusion: {learn_sigma_loss: false}\n";
  ExpectTwoRanksEqualOneProcess("prior");
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
