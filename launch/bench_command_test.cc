// Runs the built `difftrain bench` over a sweep where one configuration runs out of memory
// under the memory limit, one has an impossible layout and one trains: the sweep finishes
// and the table says which is which.
#include <unistd.h>

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

constexpr const char* kTinyModel =
    "--model custom --input-size 8 --patch 2 --hidden 32 --depth 2 --heads 4 --num-classes 10";

TEST(BenchCommandTest, SweepSurvivesOutOfMemoryAndInvalidLayouts) {
  TempDir dir("bench_command_test");
  // Micro-batch 4 fits in 1 GiB of address space (with one OpenMP thread: every thread
  // reserves a stack and a malloc arena). 5000 plans 0.65 GiB of arenas, under the budget, so
  // it runs, and fails to allocate beside the libraries and threads; 65536 plans 8.5 GiB
  // (`difftrain info`), over it, so it is an OOM row without running. tp 3 does not divide
  // the 4 heads.
  const CommandResult r = testing::RunCommand(
      std::string("OMP_NUM_THREADS=1 ") + DIFFTRAIN_BINARY + " bench " + kTinyModel +
      " --micro-batches 4,5000,65536 --layouts dp1,tp3 --warmup 1 --steps 2 "
      "--memory-limit-gib 1 --out " +
      ShellQuote(dir.path()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.path() + "/bench.json");
  const nlohmann::json rows = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << r.output;
  ASSERT_EQ(rows.size(), 6u) << rows.dump(2);
  EXPECT_EQ(rows[0]["outcome"], "ok") << rows.dump(2);
  EXPECT_EQ(rows[0]["measured_steps"], 2);
  EXPECT_GT(rows[0]["samples_per_second_per_device"].get<double>(), 0);
  EXPECT_GT(rows[0]["mfu"].get<double>(), 0);
  for (int i : {1, 2}) {
    EXPECT_EQ(rows[i]["outcome"], "OOM") << rows.dump(2);
    EXPECT_EQ(rows[i]["memory_budget_bytes"].get<double>(), 1.0 * (1 << 30));
  }
  // Micro-batch 5000 ran out of memory for real; 65536 was not run.
  EXPECT_LT(rows[1]["planned_memory_bytes"].get<double>(), 1.0 * (1 << 30));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/config-1/log.txt"));
  EXPECT_GT(rows[2]["planned_memory_bytes"].get<double>(), 8.0 * (1 << 30));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/config-2/log.txt"));
  EXPECT_NE(r.output.find("GiB per rank > budget 1.00 GiB: not run"), std::string::npos)
      << r.output;
  for (int i : {3, 4, 5}) {
    EXPECT_NE(
        rows[i]["outcome"].get<std::string>().find("error: difftrain run: " + dir.path() +
                                                   "/config-" + std::to_string(i) + "/job.yaml:1:"),
        std::string::npos)
        << rows.dump(2);
    EXPECT_NE(rows[i]["outcome"].get<std::string>().find(
                  "model.num_heads: expected a multiple of parallel.tp = 3, found 4"),
              std::string::npos)
        << rows.dump(2);
  }
  // The row's command reproduces it.
  EXPECT_EQ(rows[1]["command"],
            "ulimit -v 1048576; difftrain train --config " + dir.path() + "/config-1/job.yaml");
  // The Markdown table went to stdout, the progress to stderr.
  EXPECT_NE(r.output.find("| cpu | custom 8x8 | fp32 | synthetic | tp 1 cp 1 pp 1 dp 1 | 1 | 1 | "
                          "65536 | 65536 | - | - | - | - | 8.46 | OOM |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("bench: [6/6]"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/bench.csv"));
}

// Stable Diffusion 1.5 in NeMo's form: a micro-batch sweep of the UNet. Its 16 GiB of fp32
// state do not fit a 4 GiB budget at any micro-batch (OOM rows, not run); a small UNet of the
// same family trains and reports samples/s and memory per rank.
TEST(BenchCommandTest, StableDiffusionRowsAndOutOfMemoryRows) {
  TempDir dir("bench_command_test");
  const CommandResult sd = RunDifftrain(
      "bench --model SD1.5 --input-size 8 --micro-batches 1,2 "
      "--memory-limit-gib 4 --out " +
      ShellQuote(dir.path() + "/sd"));
  EXPECT_EQ(sd.exit_code, 1) << sd.output;  // no configuration ran
  std::ifstream in(dir.path() + "/sd/bench.json");
  const nlohmann::json rows = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(rows.is_array() && rows.size() == 2) << sd.output;
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["outcome"], "OOM") << row.dump();
    EXPECT_GT(row["planned_memory_bytes"].get<double>(), 16.0 * (1 << 30)) << row.dump();
    EXPECT_EQ(row["model"], "SD1.5 8x8") << row.dump();
  }
  const std::string job = dir.path() + "/unet.yaml";
  std::ofstream(job) << "model: {name: unet, block_out_channels: [8, 16], layers_per_block: 1, "
                        "attention_head_dim: 2, cross_attention_dim: 8, norm_num_groups: 4, "
                        "down_block_types: [CrossAttnDownBlock2D, DownBlock2D], "
                        "up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8, "
                        "text_length: 5}\n";
  const CommandResult small = testing::RunCommand(
      std::string("OMP_NUM_THREADS=1 ") + DIFFTRAIN_BINARY + " bench --config " + ShellQuote(job) +
      " --micro-batches 2 --recompute --warmup 1 --steps 2 --out " +
      ShellQuote(dir.path() + "/small"));
  ASSERT_EQ(small.exit_code, 0) << small.output;
  std::ifstream small_in(dir.path() + "/small/bench.json");
  const nlohmann::json small_rows = nlohmann::json::parse(small_in, nullptr, false);
  ASSERT_TRUE(small_rows.is_array() && small_rows.size() == 1) << small.output;
  EXPECT_EQ(small_rows[0]["outcome"], "ok") << small_rows.dump(2);
  EXPECT_GT(small_rows[0]["samples_per_second_per_device"].get<double>(), 0);
  EXPECT_GT(small_rows[0]["peak_memory_bytes"].get<double>(),
            small_rows[0]["planned_memory_bytes"].get<double>());
  EXPECT_NE(small_rows[0]["layout"].get<std::string>().find("recompute"), std::string::npos);
}

TEST(BenchCommandTest, MalformedLayoutExitsTwo) {
  const CommandResult r = RunDifftrain(std::string("bench ") + kTinyModel + " --layouts tp2-xx4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--layouts: 'tp2-xx4': expected pieces tpN, cpN, ppN, dpN"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace difftrain
