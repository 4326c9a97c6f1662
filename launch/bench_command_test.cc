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
  // reserves a stack and a malloc arena); 65536 does not (8.5 GiB of arenas, `difftrain
  // info`). tp 3 does not divide the 4 heads.
  const CommandResult r = testing::RunCommand(
      std::string("OMP_NUM_THREADS=1 ") + DIFFTRAIN_BINARY + " bench " + kTinyModel +
      " --micro-batches 4,65536 --layouts dp1,tp3 --warmup 1 --steps 2 --memory-limit-gib 1 "
      "--out " +
      ShellQuote(dir.path()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.path() + "/bench.json");
  const nlohmann::json rows = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << r.output;
  ASSERT_EQ(rows.size(), 4u) << rows.dump(2);
  EXPECT_EQ(rows[0]["outcome"], "ok") << rows.dump(2);
  EXPECT_EQ(rows[0]["measured_steps"], 2);
  EXPECT_GT(rows[0]["samples_per_second_per_device"].get<double>(), 0);
  EXPECT_GT(rows[0]["mfu"].get<double>(), 0);
  EXPECT_EQ(rows[1]["outcome"], "OOM") << rows.dump(2);
  for (int i : {2, 3}) {
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
                          "65536 | 65536 | - | - | - | - | OOM |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("bench: [4/4]"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/bench.csv"));
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
