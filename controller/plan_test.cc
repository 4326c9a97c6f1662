// CheckNodeHostMemory: the controller's check, before launching, that a node's memory (or its
// worker daemon's cgroup limit) holds its ranks' arenas.
#include "controller/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/family/family.h"
#include "model/train/trainer.h"

namespace difftrain::controller {
namespace {

using ::testing::HasSubstr;

// A small DiT, two ranks a node over `nodes` nodes, split as `parallel`.
TrainConfig Config(const std::string& parallel, int nodes = 1, const std::string& device = "cpu") {
  const std::string yaml =
      "model: {name: custom, input_size: 16, patch_size: 2, hidden_size: 64, depth: 4, "
      "num_heads: 4, num_classes: 10}\n"
      "batch: {micro: 8, global: 32}\n"
      "parallel: " +
      parallel +
      "\n"
      "train: {device: " +
      device +
      "}\n"
      "cluster: {nodes: " +
      std::to_string(nodes) + ", devices_per_node: 2}\n";
  Result<TrainConfig> c = TrainConfig::FromYamlText(yaml, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

// What ranks `first` and `first` + 1 allocate (PlanMemory, the trainer's own arenas).
int64_t TwoRanks(const TrainConfig& c, const JobPlan& p, int stage0, int stage1) {
  int64_t sum = 0;
  for (int stage : {stage0, stage1}) {
    Result<MemoryBytes> m =
        PlanMemory(c.model, {p.tp, p.cp, p.pp, {}}, stage, c.micro_batch, p.accumulation,
                   c.parallel.zero1, p.dp * p.cp, c.parallel.bucket_elements(), c.recompute);
    EXPECT_TRUE(m.ok()) << m.status().message();
    sum += int64_t(m->total());
  }
  return sum;
}

TEST(CheckNodeHostMemoryTest, ANodeHoldingItsRanksPasses) {
  const TrainConfig c = Config("{dp: 2}");
  const JobPlan p = *MakePlan(c);
  const int64_t need = TwoRanks(c, p, 0, 0);
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", need, "").ok());
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", 0, "").ok()) << "unknown memory: no check";
}

TEST(CheckNodeHostMemoryTest, ANodeShortOfItsRanksArenasNamesNodeRanksAndLimit) {
  const TrainConfig c = Config("{}", 2);  // dp 4
  const Result<JobPlan> made = MakePlan(c);
  ASSERT_TRUE(made.ok()) << made.status().message();
  const JobPlan& p = *made;
  const int64_t need = TwoRanks(c, p, 0, 0);
  const Status s = CheckNodeHostMemory(c, p, 1, "gpu-node-7", need - 1, "/slurm/uid_0/job_9");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("node gpu-node-7 cannot hold its 2 rank(s) 2..3"));
  EXPECT_THAT(s.message(),
              HasSubstr(fmt::format("need {:.2f} GiB of host memory", need / double(1 << 30))));
  EXPECT_THAT(s.message(), HasSubstr("at batch.micro 8"));
  EXPECT_THAT(s.message(), HasSubstr("the memory limit of its worker daemon's cgroup "
                                     "/slurm/uid_0/job_9"));
  const Status machine = CheckNodeHostMemory(c, p, 1, "n1", need - 1, "");
  ASSERT_FALSE(machine.ok());
  EXPECT_THAT(machine.message(), ::testing::Not(HasSubstr("cgroup")));
}

// A LoRA job's ranks hold the adapters' moments and EMA, not the model's: a node that holds
// them passes though it could not hold a whole-model run's, and `validate` says so.
TEST(CheckNodeHostMemoryTest, ALoraJobNeedsItsAdaptersStateOnly) {
  const TrainConfig whole = Config("{dp: 2}");
  TrainConfig c = whole;
  c.lora.rank = 4;
  c.lora.targets = {"qkv", "proj"};
  ASSERT_TRUE(c.Validate(2).ok());
  const JobPlan p = *MakePlan(c);
  int64_t need = 0;
  for (int rank = 0; rank < 2; ++rank) {
    Result<MemoryBytes> m = PlanMemory(c.model, {}, 0, c.micro_batch, p.accumulation, false, 2,
                                       c.parallel.bucket_elements(), c.recompute, c.lora);
    ASSERT_TRUE(m.ok()) << m.status().message();
    need += int64_t(m->total());
  }
  EXPECT_LT(need, TwoRanks(whole, *MakePlan(whole), 0, 0));
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", need, "").ok());
  EXPECT_FALSE(CheckNodeHostMemory(c, p, 0, "n0", need - 1, "").ok());
  EXPECT_LT(p.state_bytes_per_rank, MakePlan(whole)->state_bytes_per_rank);
}

// A textual inversion's ranks hold the frozen model and the vectors' state: less than a LoRA
// job's, as the trainer allocates it.
TEST(CheckNodeHostMemoryTest, ATextualInversionJobNeedsItsVectorsStateOnly) {
  const std::string yaml =
      "model: {name: SD1.5, sample_size: 8, text_dropout: 0}\n"
      "batch: {micro: 1, global: 2}\n"
      "parallel: {dp: 2}\n"
      "train: {device: cpu}\n"
      "cluster: {nodes: 1, devices_per_node: 2}\n";
  Result<TrainConfig> whole = TrainConfig::FromYamlText(yaml, "whole.yaml");
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  Result<TrainConfig> lora = TrainConfig::FromYamlText(yaml + "lora: {rank: 4}\n", "lora.yaml");
  ASSERT_TRUE(lora.ok()) << lora.status().message();
  Result<TrainConfig> inversion = TrainConfig::FromYamlText(
      yaml + "textual_inversion: {token: '<x>', initializer_token: toy, vectors: 2}\n", "ti.yaml");
  ASSERT_TRUE(inversion.ok()) << inversion.status().message();
  const JobPlan p = *MakePlan(*inversion);
  Result<MemoryBytes> m =
      PlanMemory(inversion->model, {}, 0, 1, 1, false, 2, inversion->parallel.bucket_elements(),
                 false, {}, inversion->textual_inversion);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(p.state_bytes_per_rank, int64_t(m->parameters + m->gradients + m->optimizer + m->ema));
  EXPECT_EQ(m->optimizer, 2u * 2 * 768 * sizeof(float));  // two vectors of SD 1.5's 768
  EXPECT_LT(p.state_bytes_per_rank, MakePlan(*lora)->state_bytes_per_rank);
  EXPECT_LT(MakePlan(*lora)->state_bytes_per_rank, MakePlan(*whole)->state_bytes_per_rank);
  EXPECT_THAT(DescribePlan(*inversion, p), HasSubstr("EMA and AdamW of the textual inversion's"));
}

// Under a pipeline the stages hold different arenas; the node needs their sum.
TEST(CheckNodeHostMemoryTest, PipelineStagesAreSummedStageByStage) {
  const TrainConfig c = Config("{pp: 2}");
  const JobPlan p = *MakePlan(c);
  const int64_t need = TwoRanks(c, p, 0, 1);
  ASSERT_NE(TwoRanks(c, p, 0, 0), need) << "the stages should differ for this to test anything";
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", need, "").ok());
  EXPECT_FALSE(CheckNodeHostMemory(c, p, 0, "n0", need - 1, "").ok());
}

// Writing a checkpoint allocates beside the arenas until it is written: under pp, rank 0 gathers
// the whole model and, with ZeRO-1, every rank assembles its shard's whole moments. A job that
// writes checkpoints needs them on the node too, and `validate` says what they are.
TEST(CheckNodeHostMemoryTest, CheckpointBuffersCountWhereCheckpointsAreWritten) {
  TrainConfig c = Config("{pp: 2, zero1: true}", 2);  // dp 2; node 0: ranks 0 and 1 of stage 0
  const JobPlan without = *MakePlan(c);
  EXPECT_EQ(without.checkpoint_bytes_rank0, 0);
  EXPECT_EQ(without.checkpoint_bytes_per_rank, 0);
  EXPECT_THAT(DescribePlan(c, without), ::testing::Not(HasSubstr("checkpoint is written")));
  const int64_t arenas = TwoRanks(c, without, 0, 0);
  EXPECT_TRUE(CheckNodeHostMemory(c, without, 0, "n0", arenas, "").ok());

  c.checkpoint.dir = "/nonexistent/ckpt";
  const JobPlan p = *MakePlan(c);
  const LayoutShape layout{p.tp, p.cp, p.pp, {}};
  const Result<size_t> rank1 = PlanCheckpointMemory(c.model, layout, 0, 0, false, true);
  ASSERT_TRUE(rank1.ok()) << rank1.status().message();
  // Rank 0: its shard's two moments, one whole-model arena (it gathers the four in turn) and
  // stage 1's shard.
  const Result<ModelPartition> stage0 = FamilyOf(c.model).Partition(c.model, layout, 0, 0, 0);
  const Result<ModelPartition> stage1 = FamilyOf(c.model).Partition(c.model, layout, 0, 0, 1);
  const Result<ModelPartition> whole = FamilyOf(c.model).Partition(c.model, {}, 0, 0, 0);
  ASSERT_TRUE(stage0.ok() && stage1.ok() && whole.ok());
  const size_t n0 = stage0->parameters.table.total(), n1 = stage1->parameters.table.total();
  EXPECT_EQ(p.checkpoint_bytes_rank0, int64_t(4 * (2 * n0 + whole->parameters.table.total() + n1)));
  EXPECT_EQ(*rank1, 4 * 2 * n0);
  EXPECT_EQ(p.checkpoint_bytes_per_rank, int64_t(4 * 2 * std::max(n0, n1)));
  const int64_t need = arenas + p.checkpoint_bytes_rank0 + int64_t(*rank1);
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", need, "").ok());
  const Status short_of = CheckNodeHostMemory(c, p, 0, "n0", need - 1, "");
  ASSERT_FALSE(short_of.ok());
  EXPECT_THAT(short_of.message(), HasSubstr("activations and checkpoint buffers need"));
  EXPECT_THAT(
      DescribePlan(c, p),
      HasSubstr(fmt::format(
          "  + while a checkpoint is written: rank 0 {:.1f} MiB, any other rank up to "
          "{:.1f} MiB (rank 0 gathers the whole model's parameters, EMA and AdamW "
          "moments one at a time; each rank its shard's whole AdamW moments; freed once it is "
          "written)\n",
          p.checkpoint_bytes_rank0 / 1048576.0, p.checkpoint_bytes_per_rank / 1048576.0)));
  const nlohmann::json json = p.ToJson(*Topology::Create(p.tp, p.cp, p.dp, p.pp));
  EXPECT_EQ(json["checkpoint_bytes_rank0"], p.checkpoint_bytes_rank0);
  EXPECT_EQ(json["checkpoint_bytes_per_rank"], p.checkpoint_bytes_per_rank);
}

TEST(CheckNodeHostMemoryTest, AJobOnGpusIsNotChecked) {
  const TrainConfig c = Config("{dp: 2}", 1, "cuda");
  const JobPlan p = *MakePlan(c);
  EXPECT_TRUE(CheckNodeHostMemory(c, p, 0, "n0", 1, "").ok());
}

// The plan names the initial weights and says whether this machine checked them.
TEST(DescribePlanTest, NamesTheInitialWeightsAndWhetherTheyWereCheckedHere) {
  TrainConfig c = Config("{dp: 2}");
  const JobPlan p = *MakePlan(c);
  EXPECT_THAT(DescribePlan(c, p), ::testing::Not(HasSubstr("initial weights")));
  c.checkpoint.init_from = "/nonexistent/w.safetensors";
  EXPECT_THAT(DescribePlan(c, p),
              HasSubstr("initial weights: /nonexistent/w.safetensors (not readable here: each "
                        "rank checks it before training; a checkpoint of checkpoint.dir is "
                        "resumed instead)\n"));
  c.checkpoint.init_from = "/";
  EXPECT_THAT(DescribePlan(c, p), HasSubstr("initial weights: / (its tensors match the model;"));
}

}  // namespace
}  // namespace difftrain::controller
