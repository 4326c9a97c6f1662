// Activation recomputation under tensor, context and pipeline parallelism: recomputing a
// block repeats its forward collectives (the tp all-reduces, the cp gathers) inside
// backward, and the run is still the same computation as one process without it.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/testing/parallel_training.h"

namespace difftrain {
namespace {

constexpr int kMicro = 2;
constexpr int kSteps = 3;

// A DiT and a Latte of 4 frames (whose recomputation workspace serves spatial and temporal
// blocks alike).
class RecomputeParallelTest : public testing::ParallelTrainingTest,
                              public ::testing::WithParamInterface<const char*> {
 protected:
  RecomputeParallelTest() : ParallelTrainingTest(GetParam(), kMicro) {}
};

INSTANTIATE_TEST_SUITE_P(
    Families, RecomputeParallelTest,
    ::testing::Values("{name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 4, "
                      "num_heads: 4, num_classes: 10}",
                      "{name: latte, input_size: 8, patch_size: 2, hidden_size: 32, depth: 4, "
                      "num_heads: 4, num_classes: 10, num_frames: 4}"),
    [](const ::testing::TestParamInfo<const char*>& info) {
      return std::string(info.index == 0 ? "dit" : "latte");
    });

TEST_P(RecomputeParallelTest, TensorContextPipelineWithRecomputeEqualsOneProcess) {
  // tp 2, cp 2, pp 2 with three micro-batches per step (warm-up, 1F1B and cool-down).
  const int global = kMicro * 3;
  const std::filesystem::path job =
      WriteJob("recompute", global, false, kSteps, "tp: 2, cp: 2, pp: 2");
  std::stringstream text;
  text << std::ifstream(job).rdbuf();
  std::string yaml = text.str();
  yaml.replace(yaml.find("train: {"), 8, "train: {recompute: true, ");
  std::ofstream(job) << yaml;
  const testing::CommandResult r = RunRanks(job, 8);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::filesystem::path reference = Reference(global, kSteps);
  ExpectSameLosses(Losses(job.parent_path()), Losses(reference), "recompute");
  EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5);
}

}  // namespace
}  // namespace difftrain
