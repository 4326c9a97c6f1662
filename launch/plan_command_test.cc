// Runs the built `difftrain plan` as a user does, and a job with `parallel: auto` through
// `difftrain validate` and `difftrain run`.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

TEST(PlanCommandTest, ChoosesAFittingLayoutForDiTXLOnEightH100s) {
  const CommandResult r = RunDifftrain(
      "plan --model DiT-XL/2 --image-size 256 --device H100 --devices-per-node 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json plan = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << r.output;
  const double budget = 0.9 * 80.0 * (1 << 30);
  for (const nlohmann::json& l : plan["layouts"]) {
    EXPECT_EQ(l["tp"].get<int>() * l["cp"].get<int>() * l["pp"].get<int>() * l["dp"].get<int>(), 8);
    EXPECT_LE(l["memory_bytes"]["total"].get<double>(), budget);
  }
  const CommandResult human =
      RunDifftrain("plan --model DiT-XL/2 --image-size 256 --device H100 --devices-per-node 8");
  EXPECT_NE(human.output.find("chosen: tp "), std::string::npos) << human.output;
}

// The UNet trains data-parallel: every candidate is dp 8, and a fixed tp is refused by name.
TEST(PlanCommandTest, PlansStableDiffusionDataParallel) {
  const CommandResult r =
      RunDifftrain("plan --model SD1.5 --device H100 --devices-per-node 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json plan = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << r.output;
  ASSERT_FALSE(plan["layouts"].empty()) << r.output;
  for (const nlohmann::json& l : plan["layouts"]) {
    EXPECT_EQ(l["tp"].get<int>() * l["cp"].get<int>() * l["pp"].get<int>(), 1) << l.dump();
    EXPECT_EQ(l["dp"], 8) << l.dump();
    EXPECT_LE(l["memory_bytes"]["total"].get<double>(), 0.9 * 80.0 * (1 << 30));
    EXPECT_NEAR(l["samples_per_second_per_device"].get<double>() * 8,
                l["samples_per_second"].get<double>(),
                1e-6 * l["samples_per_second"].get<double>());
  }
  EXPECT_EQ(plan["device"]["memory_bytes_per_second"], 3.35e12);
  // --memory-tbps sets the bandwidth the UNet's memory-bound kernels are priced at.
  const CommandResult slow =
      RunDifftrain("plan --model SD1.5 --device H100 --devices-per-node 8 --memory-tbps 1 --json");
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  const nlohmann::json slower = nlohmann::json::parse(slow.output, nullptr, false);
  ASSERT_FALSE(slower.is_discarded()) << slow.output;
  EXPECT_EQ(slower["device"]["memory_bytes_per_second"], 1e12);
  EXPECT_LT(slower["layouts"][0]["samples_per_second"].get<double>(),
            plan["layouts"][0]["samples_per_second"].get<double>());
  const CommandResult tp =
      RunDifftrain("plan --model SD1.5 --device H100 --devices-per-node 8 --tp 2");
  EXPECT_EQ(tp.exit_code, 2) << tp.output;
  EXPECT_NE(tp.output.find("tp 2: the unet family trains data-parallel only"), std::string::npos)
      << tp.output;
}

TEST(PlanCommandTest, ImpossibleRequestsExitTwoNamingTheProblem) {
  const std::pair<std::string, std::string> cases[] = {
      {"--model DiT-XL/2 --device H100 --memory-gib 2",
       "DiT-XL/2 does not fit: the smallest layout"},
      {"--model DiT-XL/2 --device H100 --devices-per-node 8 --tp 3",
       "tp 3: expected a divisor of the model's 16 heads"},
      {"--model custom --patch 2 --hidden 64 --depth 2 --heads 5", "num_heads"},
      {"--model DiT-S/2 --device TPU", "--device: unknown device 'TPU'"},
      {"--model DiT-S/2 --tokens 300", "--tokens: expected a square number"},
      {"--model SD1.5 --device H100 --memory-tbps -1", "memory bandwidth must be non-negative"},
      {"--model DiT-S/2 --gpu-step", "--gpu-step plans train.device cuda: give a GPU --device"},
      {"--model DiT-XL/2 --device H100 --devices-per-node 8 --gpu-step --tp 2",
       "tp 2: the GPU step (train.device cuda) trains data-parallel layouts only"},
      {"--model DiT-S/2 --fp8", "--fp8 plans train.device cuda: give a GPU --device (H100"},
      {"--model DiT-XL/2 --device A100 --fp8", "--fp8: the A100 has no FP8 tensor cores"},
      {"--model SD1.5 --device H100 --fp8", "--fp8: the unet family has no FP8 layers"},
      {"--model DiT-XL/2 --device H100 --fp8 --tp 2", "tp 2: the GPU step (train.device cuda)"},
  };
  for (const auto& [flags, message] : cases) {
    const CommandResult r = RunDifftrain("plan " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// --fp8 plans train.precision fp8: the GPU step's layouts (it implies --gpu-step), each with
// the FP8 layers' workspace besides the bf16 step's memory: every block's quantised inputs
// kept for the backward, N·(3·D + M) bytes (N tokens, D the width, M the MLP's), and a
// scratch of 3·N·M + M² (model/cuda/fp8.h, Fp8Linears::WorkspaceBytes). The step time is
// predicted as bf16's until FP8 has been timed on a GPU.
TEST(PlanCommandTest, Fp8PlansTheGpuStepWithTheFp8LayersWorkspace) {
  const std::string flags =
      "plan --model DiT-XL/2 --image-size 256 --device H100 --micro-batch 32 --json ";
  const CommandResult bf16 = RunDifftrain(flags + "--gpu-step");
  const CommandResult fp8 = RunDifftrain(flags + "--fp8");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  const nlohmann::json a = nlohmann::json::parse(bf16.output, nullptr, false);
  const nlohmann::json b = nlohmann::json::parse(fp8.output, nullptr, false);
  ASSERT_FALSE(a.is_discarded() || b.is_discarded()) << bf16.output << fp8.output;
  EXPECT_EQ(a["precision"], "bf16");
  EXPECT_EQ(b["precision"], "fp8");
  EXPECT_EQ(b["gpu_step"], true);
  const nlohmann::json& x = a["layouts"][0];
  const nlohmann::json& y = b["layouts"][0];
  // Data-parallel on one GPU, as the GPU step trains.
  EXPECT_EQ(y["tp"], 1);
  EXPECT_EQ(y["micro_batch"], 32);
  EXPECT_EQ(y["memory_bytes"]["parameters"], x["memory_bytes"]["parameters"]);
  EXPECT_EQ(y["step_seconds"]["total"], x["step_seconds"]["total"]);
#ifdef DIFFTRAIN_HAVE_CUDA
  // DiT-XL/2 at 256 px: 256 tokens a sample, D 1,152, M 4,608, 28 blocks.
  const double n = 32 * 256, d = 1152, m = 4608;
  EXPECT_EQ(y["memory_bytes"]["activations"].get<double>() -
                x["memory_bytes"]["activations"].get<double>(),
            28 * n * (3 * d + m) + 3 * n * m + m * m);
#endif
  const CommandResult human =
      RunDifftrain("plan --model DiT-XL/2 --image-size 256 --device H100 --fp8");
  ASSERT_EQ(human.exit_code, 0) << human.output;
  EXPECT_NE(human.output.find("train.device: cuda, train.precision: fp8)"), std::string::npos)
      << human.output;
}

// A two-step job of `model` (a job's model section) with `parallel: auto` on two CPU ranks:
// `validate` says what the planner chose (`chose` begins it), and the job trains.
void ExpectAutoLayoutTrains(const std::string& model, int global, const std::string& chose) {
  TempDir dir("plan_command_test");
  const std::string job = dir.path() + "/job.yaml";
  std::ofstream(job) << "model: " << model << "\n"
                     << "batch: {global: " << global << "}\n"
                     << "train: {steps: 2, log_every: 1}\n"
                        "parallel: auto\n"
                        "cluster: {nodes: 1, devices_per_node: 2}\n";
  const CommandResult validated = RunDifftrain("validate " + ShellQuote(job));
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_NE(validated.output.find("parallel: auto chose " + chose), std::string::npos)
      << validated.output;
  const CommandResult ran = RunDifftrain("run " + ShellQuote(job));
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
}

TEST(PlanCommandTest, ParallelAutoChoosesALayoutThatTrains) {
  ExpectAutoLayoutTrains(
      "{name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, num_heads: 4, "
      "num_classes: 10}",
      8, "tp ");
}

// A UNet trains data-parallel: dp 2.
TEST(PlanCommandTest, ParallelAutoTrainsAUNetDataParallel) {
  ExpectAutoLayoutTrains(
      "{name: unet, block_out_channels: [4, 8], layers_per_block: 1, attention_head_dim: 2, "
      "cross_attention_dim: 8, norm_num_groups: 2, down_block_types: [CrossAttnDownBlock2D, "
      "DownBlock2D], up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8, "
      "text_length: 5}",
      4, "tp 1 cp 1 pp 1 dp 2");
}

// Issue 18's defect: the launchers (sbatch, the Helm chart) always pass the allocation, which
// `parallel: auto` refused ("set them there instead of --nodes").
TEST(PlanCommandTest, ParallelAutoPlansForTheLaunchersNodes) {
  TempDir dir("plan_command_test");
  const std::string job = dir.path() + "/job.yaml";
  std::ofstream(job) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, "
                        "depth: 2, num_heads: 4, num_classes: 10}\n"
                        "batch: {global: 8}\n"
                        "parallel: auto\n"
                        "cluster: {nodes: 2, devices_per_node: 1}\n";
  const CommandResult validated =
      RunDifftrain("validate --nodes 2 --devices-per-node 2 " + ShellQuote(job));
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_NE(validated.output.find("world 4 = 2 node(s) x 2 device(s)"), std::string::npos)
      << validated.output;
  EXPECT_NE(validated.output.find("parallel: auto chose tp "), std::string::npos)
      << validated.output;
}

}  // namespace
}  // namespace difftrain
