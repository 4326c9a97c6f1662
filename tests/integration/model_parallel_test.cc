// Tensor, context and pipeline parallelism (with data parallelism and ZeRO-1) are the same
// computation as one process, for each family that admits them (a tiny DiT and a tiny Latte
// of 4 frames): every layout with tp·cp·dp·pp ≤ 8 drawn from tp ∈ {1,2,4}, cp ∈ {1,2},
// dp ∈ {1,2}, pp ∈ {1,2,4}, ZeRO-1 on and off, trains 5 steps with the same loss at every
// step and the same final parameters as one process (1e-5); checkpoints move between
// layouts; the memory plan of `difftrain info` is what the ranks allocate.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/testing/parallel_training.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

constexpr int kMicro = 2;
constexpr int kSteps = 5;

struct Layout {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int micro_batches = 0;  // per step and replica; 0: more than pp (below)
  int world() const { return tp * cp * dp * pp; }
  // By default more micro-batches than stages, so the pipeline has warm-up, steady 1F1B and
  // cool-down phases.
  int accumulation() const { return micro_batches > 0 ? micro_batches : pp == 1 ? 1 : pp + 1; }
  int global() const { return kMicro * dp * accumulation(); }
  std::string yaml() const { return fmt::format("tp: {}, cp: {}, dp: {}, pp: {}", tp, cp, dp, pp); }
  std::string name() const {
    return fmt::format("tp{}_cp{}_dp{}_pp{}_m{}", tp, cp, dp, pp, accumulation());
  }
};

// A family's tiny model: its job section, the same model as `info` flags, and what a
// context-parallel size that does not divide its sequence is told.
struct FamilyCase {
  const char* name;
  const char* model;
  const char* info_flags;
  const char* cp_message;
};

void PrintTo(const FamilyCase& c, std::ostream* os) {
  *os << c.name;
}

// tokens 16 per image or frame (cp 2: 8 each), heads 4 and MLP 128 (tp 4: 1 head each),
// depth 4 (pp 4: 1 block each stage; Latte: a spatial or a temporal block).
const FamilyCase kFamilies[] = {
    {"dit",
     "{name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 4, num_heads: 4, "
     "num_classes: 10}",
     "--model custom --input-size 8 --patch 2 --hidden 32 --depth 4 --heads 4 --num-classes 10",
     "sequence of 16 tokens (4x4 patches) is not divisible by cp 3"},
    {"latte",
     "{name: latte, input_size: 8, patch_size: 2, hidden_size: 32, depth: 4, num_heads: 4, "
     "num_classes: 10, num_frames: 4}",
     "--model latte --input-size 8 --patch 2 --hidden 32 --depth 4 --heads 4 --num-classes 10 "
     "--frames 4",
     "sequence of 16 tokens (4x4 patches per frame) is not divisible by cp 3"},
};

class ModelParallelTest : public testing::ParallelTrainingTest,
                          public ::testing::WithParamInterface<FamilyCase> {
 protected:
  ModelParallelTest() : ParallelTrainingTest(GetParam().model, kMicro) {}

  void ExpectSameAsOneProcess(const Layout& l, bool zero1) {
    const std::string name = l.name() + (zero1 ? "_zero1" : "");
    const std::filesystem::path job = WriteJob(name, l.global(), zero1, kSteps, l.yaml());
    const CommandResult r = RunRanks(job, l.world());
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const std::filesystem::path reference = Reference(l.global(), kSteps);
    ExpectSameLosses(Losses(job.parent_path()), Losses(reference), name);
    EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5) << name;
    // Rank 0 gathers each arena from every tp rank and stage in turn as it writes them.
    EXPECT_LE(MomentDistance(job.parent_path(), reference), 1e-5) << name;
  }
};

// Every layout of the grid but the single process (22 of them, including
// tp=2,cp=2,dp=2; tp=2,dp=2,pp=2; pp=4), each with ZeRO-1 off and on.
TEST_P(ModelParallelTest, EveryLayoutEqualsOneProcess) {
  int layouts = 0;
  for (int pp : {1, 2, 4}) {
    for (int dp : {1, 2}) {
      for (int cp : {1, 2}) {
        for (int tp : {1, 2, 4}) {
          const Layout l{tp, cp, dp, pp};
          if (l.world() > 8 || l.world() == 1) continue;
          ++layouts;
          for (bool zero1 : {false, true})
            ExpectSameAsOneProcess(l, zero1);
        }
      }
    }
  }
  EXPECT_EQ(layouts, 22);
}

// Fewer micro-batches than stages: the warm-up is bounded by the micro-batches.
TEST_P(ModelParallelTest, PipelineWithFewerMicroBatchesThanStages) {
  for (const Layout& l : {Layout{1, 1, 2, 4, 2}, Layout{2, 1, 1, 2, 1}, Layout{1, 2, 1, 4, 3}})
    ExpectSameAsOneProcess(l, true);
}

TEST_P(ModelParallelTest, CheckpointOfOneLayoutResumesInAnother) {
  // Two steps at tp=2, pp=2, dp=2 with ZeRO-1, one as a single process, two at tp=2, cp=2,
  // pp=2: the same losses and parameters as five uninterrupted steps of one process.
  const Layout a{2, 1, 2, 2}, c{2, 2, 1, 2};
  const int global = a.global();
  ASSERT_EQ(global % (kMicro * c.pp), 0);
  const std::filesystem::path job = WriteJob("reshard", global, true, kSteps, a.yaml());
  CommandResult r = RunRanks(job, a.world(), "--steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::filesystem::path one = WriteJob("reshard", global, false, kSteps);
  r = RunRanks(one, 1, "--steps 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 2"), std::string::npos) << r.output;
  const std::filesystem::path last = WriteJob("reshard", global, false, kSteps, c.yaml());
  r = RunRanks(last, c.world());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from step 3"), std::string::npos) << r.output;

  const std::filesystem::path reference = Reference(global, kSteps);
  ExpectSameLosses(Losses(job.parent_path()), Losses(reference), "resharded");
  EXPECT_LE(ParameterDistance(job.parent_path(), reference), 1e-5);
  EXPECT_LE(MomentDistance(job.parent_path(), reference), 1e-5);
}

TEST_P(ModelParallelTest, InfoMemoryPlanIsWhatRanksAllocate) {
  const Layout l{2, 2, 1, 2};
  // Two steps, a checkpoint after each: the second step's report has what the first's took.
  const std::filesystem::path job = WriteJob("memory", l.global(), true, 2, l.yaml());
  {
    std::ifstream in(job);
    std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t keep = yaml.find("keep: 5}");
    ASSERT_NE(keep, std::string::npos) << yaml;
    yaml.replace(keep, 8, "keep: 5, every: 1}");
    std::ofstream(job) << yaml;
  }
  const CommandResult r = RunRanks(job, l.world());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CommandResult info = testing::RunDifftrain(
      fmt::format("info {} --tp {} --cp {} --dp {} --pp {} --micro-batch {} --micro-batches {} "
                  "--zero1 --bucket-mb 0.02 --json",
                  GetParam().info_flags, l.tp, l.cp, l.dp, l.pp, kMicro, l.accumulation()));
  ASSERT_EQ(info.exit_code, 0) << info.output;
  const nlohmann::json per_rank = nlohmann::json::parse(info.output)["per_rank"];
  const nlohmann::json& plan = per_rank["stages"];
  for (int rank = 0; rank < l.world(); ++rank) {
    const int stage = rank / (l.tp * l.cp * l.dp);  // order tp-cp-dp-pp
    const nlohmann::json allocated = Metrics(job.parent_path(), rank).at(0)["memory_bytes"];
    for (const char* arena : {"parameters", "gradients", "optimizer", "ema", "activations"}) {
      // ZeRO-1 pieces are ceil(bucket / (dp·cp)): the plan gives rank 0's, the largest.
      if (std::string(arena) == "optimizer") {
        EXPECT_LE(allocated[arena].get<int64_t>(), plan[stage][arena].get<int64_t>()) << rank;
        EXPECT_GE(allocated[arena].get<int64_t>(), plan[stage][arena].get<int64_t>() - 64) << rank;
      } else {
        EXPECT_EQ(allocated[arena], plan[stage][arena]) << "rank " << rank << " " << arena;
      }
    }
    // Rank 0 gathers the whole model one arena at a time (tp, pp), each rank its shard's whole
    // moments (ZeRO-1).
    const nlohmann::json after = Metrics(job.parent_path(), rank).at(1)["memory_bytes"];
    EXPECT_EQ(after["checkpoint"],
              rank == 0 ? per_rank["checkpoint_rank0"] : plan[stage]["checkpoint"])
        << "rank " << rank;
  }
}

TEST_P(ModelParallelTest, LayoutsThatDoNotDivideFailBeforeAnyWork) {
  struct Case {
    std::string layout, message;
  };
  for (const Case& c :
       {Case{"tp: 3", "model.num_heads: expected a multiple of parallel.tp = 3, found 4"},
        Case{"cp: 3", GetParam().cp_message},
        Case{"pp: 5", "model.depth 4 is smaller than pp 5"}}) {
    const std::filesystem::path job = WriteJob("bad", kMicro, false, 1, c.layout);
    const CommandResult r = testing::RunDifftrain("train --config " + ShellQuote(job.string()));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelParallelTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<FamilyCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace difftrain
