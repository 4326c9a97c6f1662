// `--config JOB.yaml` beside `--model NAME`: every model-choosing subcommand takes the job's
// model section, and gives what the named config with the same fields gives.
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

nlohmann::json Json(const CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output, nullptr, false);
}

TEST(InfoCommandTest, TheJobsModelSectionIsTheSameModelAsTheFlags) {
  TempDir tmp("info");
  const std::string job = tmp.path() + "/job.yaml";
  std::ofstream(job) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32,\n"
                        "        depth: 2, num_heads: 4, num_classes: 10}\n"
                        "batch: {micro: 2}\n";
  const nlohmann::json from_job = Json(RunDifftrain("info --json --config " + ShellQuote(job)));
  const nlohmann::json from_flags = Json(RunDifftrain(
      "info --json --model custom --input-size 8 --patch 2 --hidden 32 --depth 2 --heads 4 "
      "--num-classes 10"));
  EXPECT_EQ(from_job["family"], "dit");
  EXPECT_EQ(from_job["config"], from_flags["config"]);
  EXPECT_EQ(from_job["parameters"], from_flags["parameters"]);
  EXPECT_EQ(from_job["forward_gmacs_per_sample"], from_flags["forward_gmacs_per_sample"]);
  EXPECT_EQ(from_job["sample"], (nlohmann::json{1, 4, 8, 8}));

  const CommandResult dump = RunDifftrain("debug-dump --batch 1 --config " + ShellQuote(job) +
                                          " --out " + ShellQuote(tmp.path() + "/dump.safetensors"));
  EXPECT_EQ(dump.exit_code, 0) << dump.output;
}

TEST(InfoCommandTest, AllListsTheNamedConfigsOfTheFamily) {
  const nlohmann::json all = Json(RunDifftrain("info --all --json --model DiT-B/4"));
  ASSERT_TRUE(all.is_array());
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(all[0]["model"], "DiT-S/2");
}

TEST(InfoCommandTest, AnUnknownFieldOrModelIsBadInputNamingIt) {
  TempDir tmp("info");
  const std::string job = tmp.path() + "/job.yaml";
  std::ofstream(job) << "model: {name: DiT-S/8, num_frames: 16}\n";
  const CommandResult field = RunDifftrain("info --config " + ShellQuote(job));
  EXPECT_EQ(field.exit_code, 2) << field.output;
  EXPECT_NE(field.output.find("model.num_frames: unknown field"), std::string::npos)
      << field.output;
  const CommandResult model = RunDifftrain("info --model DiT-M/3");
  EXPECT_EQ(model.exit_code, 2);
  EXPECT_NE(model.output.find("unknown model 'DiT-M/3'"), std::string::npos) << model.output;
}

}  // namespace
}  // namespace difftrain
