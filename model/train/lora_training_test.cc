// LoRA training (model/train/lora_adapters.h) in the Trainer: peft's module matching, only the
// adapters train (every other weight stays bit for bit), the model computes with W0 + s·B·A,
// the adapters' gradients are the chain rule's of the model's, a LoRA overfits a batch, resuming
// is bit-identical, and the job's lora section is checked against the layout and the model;
// DoRA's magnitudes (use_dora) likewise.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/temp_dir.h"
#include "job/job_spec.h"
#include "model/io/checkpoint.h"
#include "model/io/safetensors.h"
#include "model/train/checkpointing.h"
#include "model/train/trainer.h"
#include "model/unet/family.h"
#include "model/unet/unet_testing.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;

TrainConfig TinyLora(int rank = 2, double alpha = 0) {
  TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/32);
  c.optimizer.lr = 1e-2;
  c.seed = 11;
  c.lora.rank = rank;
  c.lora.alpha = alpha;
  c.lora.targets = {"qkv", "attn.proj", "fc2"};
  return c;
}

TrainConfig TinyDora(int rank = 2, double alpha = 0) {
  TrainConfig c = TinyLora(rank, alpha);
  c.lora.use_dora = true;
  return c;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainConfig& c) {
  return std::make_unique<Trainer>(c, testing::SyntheticData(c));
}

std::vector<float> Params(const Trainer& t) {
  return {t.model().params(), t.model().params() + t.model().num_params()};
}

TEST(LoraModulesTest, MatchTargetsAsPeftDoes) {
  TrainConfig c = TinyLora();
  const auto trainer = MakeTrainer(c);
  const TensorTable& table = trainer->model().parameter_table();
  const auto names = [&](std::vector<std::string> targets) {
    LoraConfig config;
    config.rank = 1;
    config.targets = std::move(targets);
    std::vector<std::string> out;
    Result<std::vector<LoraModule>> modules = LoraModulesOf(config, table);
    if (!modules.ok()) return std::vector<std::string>{"error: " + modules.status().message()};
    for (const LoraModule& m : *modules)
      out.push_back(m.name);
    return out;
  };
  // The end of a dotted name, whole components only; weights of two or more dimensions (a
  // convolution's too), never a bias.
  EXPECT_THAT(names({"qkv"}), ::testing::ElementsAre("blocks.0.attn.qkv", "blocks.1.attn.qkv"));
  EXPECT_THAT(names({"1.attn.proj", "x_embedder.proj"}),
              ::testing::ElementsAre("x_embedder.proj", "blocks.1.attn.proj"));
  EXPECT_THAT(names({"blocks.0.mlp.fc1"}), ::testing::ElementsAre("blocks.0.mlp.fc1"));
  EXPECT_THAT(names({"kv", "fc"})[0],
              HasSubstr("error: lora.targets [kv, fc] match no module of the model"));
  EXPECT_THAT(names({"kv"})[0], HasSubstr("x_embedder.proj, t_embedder.mlp.0"));
}

TEST(LoraAdaptersTest, ShapesAreThoseOfPeft) {
  TrainConfig c = TinyLora(3);
  c.lora.targets = {"x_embedder.proj", "blocks.0.attn.qkv"};
  auto trainer = MakeTrainer(c);
  const LoraAdapters& lora = *trainer->lora();
  ASSERT_EQ(lora.table().tensors().size(), 4u);
  // A convolution's A has its kernel, its B is 1×1; a Linear's are matrices.
  EXPECT_EQ(lora.table().Find("x_embedder.proj.lora_A.weight")->shape,
            (std::vector<int64_t>{3, 4, 2, 2}));
  EXPECT_EQ(lora.table().Find("x_embedder.proj.lora_B.weight")->shape,
            (std::vector<int64_t>{32, 3, 1, 1}));
  EXPECT_EQ(lora.table().Find("blocks.0.attn.qkv.lora_A.weight")->shape,
            (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(lora.table().Find("blocks.0.attn.qkv.lora_B.weight")->shape,
            (std::vector<int64_t>{96, 3}));
  EXPECT_EQ(trainer->optimizer_elements(), lora.size());
  // peft's "gaussian": A ~ N(0, (1/r)²), B = 0.
  const TensorSpec& a = *lora.table().Find("blocks.0.attn.qkv.lora_A.weight");
  double sum_squares = 0;
  for (size_t i = 0; i < a.numel; ++i)
    sum_squares += double(lora.params()[a.offset + i]) * lora.params()[a.offset + i];
  EXPECT_NEAR(std::sqrt(sum_squares / a.numel), 1.0 / 3, 0.05);
  const TensorSpec& b = *lora.table().Find("blocks.0.attn.qkv.lora_B.weight");
  for (size_t i = 0; i < b.numel; ++i)
    ASSERT_EQ(lora.params()[b.offset + i], 0.0f);
}

// Only the adapters train: every weight but the targets' stays as it was, bit for bit, and each
// target is W0 + alpha/rank · B·A of the trained adapters. (From random weights: DiT's own
// initialisation zeroes the adaLN gates, which leaves the blocks' weights without gradients.)
TEST(LoraTrainingTest, OnlyTheTargetsChangeAndAsTheirAdaptersSay) {
  const TrainConfig c = TinyLora(2, /*alpha=*/5);
  TrainConfig whole = c;
  whole.lora = {};
  auto plain = MakeTrainer(whole), trainer = MakeTrainer(c);
  ASSERT_EQ(Params(*trainer), Params(*plain)) << "B = 0: the model starts at its own weights";
  trainer->InitializeRandom(5);
  const LoraAdapters& lora = *trainer->lora();
  const std::vector<float> before = Params(*trainer);
  const std::vector<float> base(lora.base(), lora.base() + lora.base_size());
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(trainer->Step().ok());
  const std::vector<float> after = Params(*trainer);
  std::vector<bool> targeted(after.size(), false);
  for (const LoraModule& m : lora.modules()) {
    ASSERT_EQ(
        0, std::memcmp(lora.base() + m.base, base.data() + m.base, m.out * m.in * sizeof(float)));
    double diff = 0, norm = 0, change = 0;
    for (int64_t o = 0; o < m.out; ++o) {
      for (int64_t i = 0; i < m.in; ++i) {
        double product = 0;
        for (int r = 0; r < 2; ++r)
          product += double(lora.params()[m.b + o * 2 + r]) * lora.params()[m.a + r * m.in + i];
        const size_t k = m.weight + o * m.in + i;
        const double want = base[m.base + o * m.in + i] + 2.5 * product;
        diff += (after[k] - want) * (after[k] - want);
        norm += want * want;
        change += (after[k] - before[k]) * (after[k] - before[k]);
        targeted[k] = true;
      }
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-6) << m.name;
    EXPECT_GT(std::sqrt(change / norm), 1e-4) << m.name << " did not train";
  }
  for (size_t k = 0; k < after.size(); ++k) {
    if (!targeted[k]) {
      ASSERT_EQ(after[k], before[k]) << "element " << k;
    }
  }
}

// The adapters' gradients are the chain rule's of the loss: central differences of the loss of
// one fixed batch in A and B (in fp32, so at a few elements with a loose bound; the op itself is
// checked in double in model/cpu/low_rank_test.cc).
TEST(LoraTrainingTest, AdapterGradientsAreTheLossGradients) {
  TrainConfig c = TinyLora(2, 4);
  c.micro_batch = c.global_batch = 4;
  testing::EditDiT(c.model, [](DiTConfig& m) { m.class_dropout_prob = 0; });
  auto trainer = MakeTrainer(c);
  trainer->InitializeRandom(3);  // B drawn too: A's gradients do not vanish
  MicroBatch batch;
  ASSERT_TRUE(trainer->MakeMicroBatch(0, 4, batch).ok());
  LoraAdapters& lora = *trainer->lora();
  const auto loss = [&] {
    lora.Apply(lora.params(), trainer->model().params());
    std::memset(trainer->model().grads(), 0, trainer->model().num_params() * sizeof(float));
    return trainer->ForwardBackward(batch, 1.0f);
  };
  loss();
  lora.Gradients(trainer->model().grads());
  const std::vector<float> analytic(lora.grads(), lora.grads() + lora.size());
  for (const TensorSpec& t : lora.table().tensors()) {
    for (size_t i : {size_t{0}, t.numel / 2, t.numel - 1}) {
      float& x = lora.params()[t.offset + i];
      const float saved = x, h = 1e-2f;
      x = saved + h;
      const double up = loss();
      x = saved - h;
      const double down = loss();
      x = saved;
      const double numeric = (up - down) / (2.0 * h);
      EXPECT_NEAR(analytic[t.offset + i], numeric, 2e-3 * std::abs(numeric) + 2e-5)
          << t.name << "[" << i << "]";
    }
  }
}

// The adapters alone halve a fixed batch's loss in 200 steps.
void ExpectOverfitsAFixedBatch(TrainConfig c) {
  testing::EditDiT(c.model, [](DiTConfig& m) { m.class_dropout_prob = 0; });
  auto trainer = MakeTrainer(c);
  trainer->InitializeRandom(2);
  MicroBatch batch;
  ASSERT_TRUE(trainer->MakeMicroBatch(0, 8, batch).ok());
  const double first = trainer->StepOn(batch).loss;
  double last = first;
  for (int i = 0; i < 200; ++i)
    last = trainer->StepOn(batch).loss;
  EXPECT_LT(last, first / 2) << "loss " << first << " -> " << last;
}

TEST(LoraTrainingTest, OverfitsAFixedBatch) {
  ExpectOverfitsAFixedBatch(TinyLora(4));
}

// A trainer of `c` whose arenas take what PlanMemory says, and what the adapters' moments take.
std::unique_ptr<Trainer> ExpectPlannedMemoryIsTheTrainers(const TrainConfig& c) {
  auto trainer = MakeTrainer(c);
  const Result<MemoryBytes> plan = PlanMemory(c.model, {}, 0, c.micro_batch, c.AccumulationSteps(),
                                              false, 1, size_t{1} << 20, false, c.lora);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  if (!plan.ok()) return trainer;
  const MemoryBytes got = trainer->memory();
  EXPECT_EQ(plan->parameters, got.parameters);
  EXPECT_EQ(plan->gradients, got.gradients);
  EXPECT_EQ(plan->optimizer, got.optimizer);
  EXPECT_EQ(plan->ema, got.ema);
  EXPECT_EQ(got.optimizer, 2 * trainer->lora()->size() * sizeof(float));
  return trainer;
}

// What a LoRA run's arenas take is what PlanMemory (the controller's check of a node, `difftrain
// validate`) says: the adapters' moments and EMA instead of the model's.
TEST(LoraTrainingTest, PlannedMemoryIsTheTrainersArenas) {
  const TrainConfig c = TinyLora(3);
  auto trainer = ExpectPlannedMemoryIsTheTrainers(c);
  const Result<MemoryBytes> plan = PlanMemory(c.model, {}, 0, c.micro_batch, c.AccumulationSteps(),
                                              false, 1, size_t{1} << 20, false, c.lora);
  ASSERT_TRUE(plan.ok());
  const Result<MemoryBytes> whole = PlanMemory(c.model, {}, 0, c.micro_batch, c.AccumulationSteps(),
                                               false, 1, size_t{1} << 20, false);
  ASSERT_TRUE(whole.ok());
  EXPECT_LT(plan->total(), whole->total());
}

// Pages of [data, data + bytes) resident in memory (mincore), and all of them.
std::pair<size_t, size_t> ResidentPages(const void* data, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data) / page * page;
  const size_t pages = (reinterpret_cast<uintptr_t>(data) + bytes - first + page - 1) / page;
  std::vector<unsigned char> in_core(pages);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(first), pages * page, in_core.data()), 0);
  size_t resident = 0;
  for (unsigned char c : in_core)
    resident += c & 1;
  return {resident, pages};
}

// A LoRA run's gradient arena is written only where the adapters' gradients come from (the
// targets') and at the vectors: the frozen weights' pages are never touched, so a LoRA of
// SD 1.5's attention projections does not hold the UNet's whole 3.4 GB gradient arena. A
// UNet of SD's shape, smaller, with adapters of its self-attention's q and v; the pages
// resident after two steps are at most those of the zeroed tensors (each with a partial page
// at either end), and the planned gradients are those tensors' and the adapters'.
TEST(LoraTrainingTest, TheFrozenWeightsGradientPagesAreNeverTouched) {
  TrainConfig c;
  UNetConfig unet = testing::TinyUNetConfig();
  unet.block_out_channels = {32, 64};
  unet.attention_head_dim = {4};
  unet.norm_num_groups = 8;
  c.model = UNetSpec(unet);
  c.micro_batch = c.global_batch = 2;
  c.lora.rank = 2;
  c.lora.targets = {"attn1.to_q", "attn1.to_v"};
  auto trainer = MakeTrainer(c);
  for (int step = 0; step < 2; ++step)
    ASSERT_TRUE(trainer->Step().ok());
  Model& model = trainer->model();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t zeroed = 0, bound = 0;
  for (const TensorSpec& t : model.parameter_table().tensors()) {
    const bool target = t.name.find("attn1.to_q.") != std::string::npos ||
                        t.name.find("attn1.to_v.") != std::string::npos;
    if (!target && t.shape.size() >= 2) continue;
    zeroed += t.numel;
    bound += (t.numel * sizeof(float) + page - 1) / page + 1;
  }
  const auto [resident, pages] = ResidentPages(model.grads(), model.num_params() * sizeof(float));
  std::printf("gradient arena: %zu of %zu pages resident (at most %zu)\n", resident, pages, bound);
  EXPECT_LE(resident, bound);
  EXPECT_LT(resident, pages / 4);
  const Result<MemoryBytes> plan = PlanMemory(c.model, {}, 0, c.micro_batch, c.AccumulationSteps(),
                                              false, 1, size_t{1} << 20, false, c.lora);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->gradients, (zeroed + trainer->lora()->size()) * sizeof(float));
  EXPECT_EQ(trainer->memory().gradients, plan->gradients);
}

// A model skips the gradients of its frozen weights (Model::SkipGradients): `frozen`'s is not
// computed, and the adapters' gradients are bit for bit those of a backward that computes every
// gradient.
void ExpectSkippingChangesNoAdapterGradient(const TrainConfig& c, const std::string& frozen_name) {
  auto trainer = MakeTrainer(c);
  trainer->InitializeRandom(4);
  MicroBatch batch;
  ASSERT_TRUE(trainer->MakeMicroBatch(0, c.micro_batch, batch).ok());
  Model& model = trainer->model();
  LoraAdapters& lora = *trainer->lora();
  const auto step = [&] {
    std::memset(model.grads(), 0, model.num_params() * sizeof(float));
    trainer->ForwardBackward(batch, 1.0f);
    lora.Gradients(model.grads());
    return std::vector<float>(lora.grads(), lora.grads() + lora.size());
  };
  const TensorSpec& frozen = *model.parameter_table().Find(frozen_name);
  const auto frozen_norm = [&] {
    double sum = 0;
    for (size_t i = 0; i < frozen.numel; ++i)
      sum += std::abs(model.grads()[frozen.offset + i]);
    return sum;
  };
  const std::vector<float> skipping = step();
  EXPECT_EQ(frozen_norm(), 0.0) << frozen_name << "'s gradient was computed";
  model.SkipGradients({});
  const std::vector<float> whole = step();
  EXPECT_GT(frozen_norm(), 0.0);
  ASSERT_EQ(skipping.size(), whole.size());
  for (const TensorSpec& t : lora.table().tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      if (skipping[t.offset + i] != whole[t.offset + i]) {
        ADD_FAILURE() << t.name << "[" << i << "]: " << skipping[t.offset + i] << " skipping, "
                      << whole[t.offset + i] << " computing every gradient";
        break;
      }
    }
  }
  double norm = 0;
  for (float g : whole)
    norm += std::abs(g);
  EXPECT_GT(norm, 0.0);
}

// The UNet's attention projections are fused (q, k and v one matrix): a target among frozen
// neighbours keeps the whole matrix's gradient.
TEST(LoraTrainingTest, AUNetSkipsItsFrozenWeightsGradientsAndNothingElse) {
  TrainConfig c;
  Result<ModelSpec> unet = ModelSpecFromJson(
      "unet", nlohmann::json::parse(R"({"name": "unet", "block_out_channels": [4, 8],
        "layers_per_block": 1, "attention_head_dim": 2, "cross_attention_dim": 8,
        "norm_num_groups": 2, "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "sample_size": 8,
        "text_length": 5})"));
  ASSERT_TRUE(unet.ok()) << unet.status().message();
  c.model = *unet;
  c.micro_batch = c.global_batch = 2;
  c.lora.rank = 2;
  c.lora.targets = {"to_q", "to_v", "conv2"};
  ExpectSkippingChangesNoAdapterGradient(c, "conv_in.weight");
}

TEST(LoraTrainingTest, ADiTSkipsItsFrozenWeightsGradientsAndNothingElse) {
  TrainConfig c = TinyLora(2);
  c.lora.targets = {"qkv", "fc2", "final_layer.linear"};
  ExpectSkippingChangesNoAdapterGradient(c, "blocks.0.mlp.fc1.weight");
  ExpectSkippingChangesNoAdapterGradient(c, "y_embedder.embedding_table.weight");
}

TEST(LoraCheckpointTest, ResumeIsBitIdentical) {
  const TempDir dir("lora_training_test");
  TrainConfig c = TinyLora(3, 6);
  // At DiT's initialisation only the final layer has gradients (its zeros gate everything).
  c.lora.targets = {"final_layer.linear", "adaLN_modulation.1", "qkv"};
  auto straight = MakeTrainer(c);
  const std::vector<float> initial = Params(*straight);
  for (int i = 0; i < 8; ++i)
    ASSERT_TRUE(straight->Step().ok());
  ASSERT_NE(Params(*straight), initial);

  io::CheckpointStore store(dir.path(), 2);
  auto first_half = MakeTrainer(c);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(first_half->Step().ok());
  ASSERT_TRUE(WriteCheckpointShard(*first_half, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(4, 1).ok());

  auto resumed = MakeTrainer(c);
  Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(*resumed, store);
  ASSERT_TRUE(step.ok()) << step.status().message();
  ASSERT_EQ(step->value_or(-1), 4);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(resumed->Step().ok());
  EXPECT_EQ(Params(*resumed), Params(*straight));
  const size_t n = straight->lora()->size();
  EXPECT_EQ(0, std::memcmp(straight->lora()->params(), resumed->lora()->params(), n * 4));
  EXPECT_EQ(0, std::memcmp(straight->ema(), resumed->ema(), n * 4));

  // The checkpoint's model tensors are the fused weights (what sampling reads), its EMA the
  // adapters' EMA fused; a run of another rank, or of the whole model, does not resume it.
  Result<io::SafetensorsFile> shard = store.ReadShard(4, 0, 1);
  ASSERT_TRUE(shard.ok());
  const LoraModule& m = first_half->lora()->modules()[0];
  std::vector<float> fused(m.out * m.in);
  ASSERT_TRUE(shard->CopyF32(m.name + ".weight", m.shape, fused.data()).ok());
  EXPECT_EQ(0,
            std::memcmp(fused.data(), first_half->model().params() + m.weight, fused.size() * 4));
  EXPECT_NE(shard->Find("lora.base." + m.name + ".weight"), nullptr);
  EXPECT_NE(shard->Find("ema.lora." + m.name + ".lora_B.weight"), nullptr);
  TrainConfig other = c;
  other.lora.rank = 2;
  auto mismatched = MakeTrainer(other);
  Result<std::optional<int64_t>> refused = RestoreLatestCheckpoint(*mismatched, store);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint trained LoRA adapters"));
  other.lora = {};
  auto whole = MakeTrainer(other);
  refused = RestoreLatestCheckpoint(*whole, store);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("but this run trains the whole model"));
}

// The job's lora section: parsed, and refused where it does not apply, naming why.
TEST(LoraJobTest, TheSectionIsReadAndCheckedAgainstTheRun) {
  const std::string model =
      "model: {name: custom, input_size: 8, patch_size: 2, in_channels: 4, hidden_size: 32, "
      "depth: 2, num_heads: 4, num_classes: 10}\n";
  const auto parse = [&](const std::string& more) {
    return TrainConfig::FromYamlText(model + "train: {device: cpu}\n" + more, "job.yaml");
  };
  Result<TrainConfig> c = parse("lora: {rank: 8, alpha: 16, targets: [qkv, proj]}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->lora.rank, 8);
  EXPECT_EQ(c->lora.scale(), 2.0);
  EXPECT_EQ(c->ToJson()["lora"]["targets"], nlohmann::json({"qkv", "proj"}));
  EXPECT_THAT(parse("lora: {rank: 4}\n").status().message(),
              HasSubstr("lora.targets [to_q, to_k, to_v, to_out.0] match no module"));
  EXPECT_THAT(parse("lora: {alpha: 4, targets: [qkv]}\n").status().message(),
              HasSubstr("lora.rank: required"));
  EXPECT_THAT(parse("lora: {rank: 4, targets: qkv}\n").status().message(),
              HasSubstr("lora.targets: expected a list of names"));
  EXPECT_THAT(parse("lora: {rank: 4, targets: [qkv], dropout: 0.1}\n").status().message(),
              HasSubstr("dropout"));
  EXPECT_THAT(parse("lora: {rank: 4, targets: [qkv]}\nparallel: {tp: 2}\n").status().message(),
              HasSubstr("not with parallel.tp > 1"));
  EXPECT_THAT(
      parse("lora: {rank: 4, targets: [qkv]}\nparallel: {zero1: true}\n").status().message(),
      HasSubstr("not with parallel.zero1"));
  Result<TrainConfig> gpu = TrainConfig::FromYamlText(
      model + "train: {device: cuda}\nlora: {rank: 4, targets: [qkv]}\n", "job.yaml");
  EXPECT_THAT(gpu.status().message(), HasSubstr("not with train.device cuda"));
  Result<TrainConfig> automatic = TrainConfig::FromYamlText(
      model + "lora: {rank: 4, targets: [qkv]}\nparallel: auto\n", "job.yaml");
  ASSERT_TRUE(automatic.ok()) << automatic.status().message();
  EXPECT_THAT(ResolveJob(*automatic, PlanDevice{}).message(),
              HasSubstr("a lora job names its layout"));
}

// Each row of W0 + scale·B·A, in double: its norm, and the row.
struct DoraRows {
  std::vector<double> v, norms;
};
DoraRows RowsOf(const LoraAdapters& lora, const LoraModule& m, const float* params) {
  DoraRows d{std::vector<double>(m.out * m.in), std::vector<double>(m.out)};
  for (int64_t o = 0; o < m.out; ++o) {
    double norm = 0;
    for (int64_t i = 0; i < m.in; ++i) {
      double product = 0;
      for (int r = 0; r < lora.config().rank; ++r)
        product += double(params[m.b + o * lora.config().rank + r]) * params[m.a + r * m.in + i];
      const double v = lora.base()[m.base + o * m.in + i] + lora.scale() * product;
      d.v[o * m.in + i] = v;
      norm += v * v;
    }
    d.norms[o] = std::sqrt(norm);
  }
  return d;
}

// DoRA: each module has peft's magnitude vector, which starts at the norms of W0's rows, so the
// model starts at its own weights bit for bit; it trains, and every target is then
// m / ‖V‖ ⊙ V of its adapters (V = W0 + alpha/rank · B·A), every other weight as it was.
TEST(DoraTrainingTest, StartsAtTheModelAndEachTargetIsItsMagnitudeTimesItsDirection) {
  const TrainConfig c = TinyDora(2, /*alpha=*/5);
  TrainConfig whole = c;
  whole.lora = {};
  auto plain = MakeTrainer(whole), trainer = MakeTrainer(c);
  ASSERT_EQ(Params(*trainer), Params(*plain)) << "m = ‖W0‖, B = 0: W = W0";
  const LoraAdapters& lora = *trainer->lora();
  for (const LoraModule& m : lora.modules()) {
    const TensorSpec* t = lora.table().Find(m.name + ".lora_magnitude_vector");
    ASSERT_NE(t, nullptr) << m.name;
    EXPECT_EQ(t->shape, std::vector<int64_t>{m.out});
    EXPECT_EQ(t->offset, m.magnitude);
    const DoraRows rows = RowsOf(lora, m, lora.params());
    for (int64_t o = 0; o < m.out; ++o)
      EXPECT_NEAR(lora.params()[m.magnitude + o], rows.norms[o], 1e-6 * rows.norms[o]);
  }
  trainer->InitializeRandom(5);
  const std::vector<float> before = Params(*trainer);
  const std::vector<float> adapters(lora.params(), lora.params() + lora.size());
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(trainer->Step().ok());
  const std::vector<float> after = Params(*trainer);
  std::vector<bool> targeted(after.size(), false);
  for (const LoraModule& m : lora.modules()) {
    const DoraRows rows = RowsOf(lora, m, lora.params());
    double diff = 0, norm = 0, moved = 0, magnitudes = 0;
    for (int64_t o = 0; o < m.out; ++o) {
      const double magnitude = lora.params()[m.magnitude + o];
      moved += std::abs(magnitude - adapters[m.magnitude + o]);
      magnitudes += std::abs(magnitude);
      for (int64_t i = 0; i < m.in; ++i) {
        const size_t k = m.weight + o * m.in + i;
        const double want = magnitude / rows.norms[o] * rows.v[o * m.in + i];
        diff += (after[k] - want) * (after[k] - want);
        norm += want * want;
        targeted[k] = true;
      }
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-6) << m.name;
    EXPECT_GT(moved / magnitudes, 1e-5) << m.name << "'s magnitudes did not train";
  }
  for (size_t k = 0; k < after.size(); ++k) {
    if (!targeted[k]) {
      ASSERT_EQ(after[k], before[k]) << "element " << k;
    }
  }
}

TEST(DoraTrainingTest, OverfitsAFixedBatch) {
  ExpectOverfitsAFixedBatch(TinyDora(4));
}

// The planner counts the magnitudes (in the adapters' arena, their moments and EMA) as the
// trainer holds them.
TEST(DoraTrainingTest, PlannedMemoryIsTheTrainersArenas) {
  auto trainer = ExpectPlannedMemoryIsTheTrainers(TinyDora(3));
  size_t magnitudes = 0;
  for (const LoraModule& m : trainer->lora()->modules())
    magnitudes += m.out;
  const Result<LoraElements> lora =
      CountLoraElements(TinyLora(3).lora, trainer->model().parameter_table());
  ASSERT_TRUE(lora.ok());
  EXPECT_EQ(trainer->lora()->size(), lora->adapters + magnitudes);
}

// A LoRA checkpoint's EMA is the model with the EMA's adapters fused, made in a copy of the
// adapted weights alone (not of the whole model: SD 1.5's 3.4 GB), which is freed once the shard
// is written. Every EMA tensor is what fusing the EMA's adapters into a copy of the whole model
// gives, bit for bit.
TEST(LoraCheckpointTest, TheEmaIsFusedInACopyOfTheAdaptedWeightsAlone) {
  const TempDir dir("lora_training_test");
  TrainConfig c = TinyLora(3, 6);
  c.lora.targets = {"final_layer.linear", "adaLN_modulation.1", "qkv"};
  c.optimizer.ema_decay = 0.5;  // an EMA apart from the adapters after a few steps
  auto trainer = MakeTrainer(c);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(trainer->Step().ok());
  io::SafetensorsWriter unwritten;
  ASSERT_TRUE(trainer->AddToCheckpoint(unwritten).ok());
  EXPECT_EQ(trainer->checkpoint_bytes(), trainer->lora()->model_base_size() * sizeof(float));
  EXPECT_EQ(trainer->lora()->model_base_size(), trainer->lora()->base_size());  // no text encoder
  EXPECT_LT(trainer->lora()->base_size(), trainer->model().num_params());
  // What the plan counts for rank 0 to write a checkpoint (PlanCheckpointMemory).
  const Result<size_t> planned = PlanCheckpointMemory(c.model, {}, 0, 0, true, false, c.lora);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  EXPECT_EQ(*planned, trainer->checkpoint_bytes());
  trainer->ReleaseCheckpoint();
  EXPECT_EQ(trainer->checkpoint_bytes(), 0u);
  EXPECT_EQ(trainer->checkpoint_peak_bytes(), *planned);

  io::CheckpointStore store(dir.path(), 2);
  ASSERT_TRUE(WriteCheckpointShard(*trainer, store, 0, 1).ok());
  EXPECT_EQ(trainer->checkpoint_bytes(), 0u);
  ASSERT_TRUE(store.Commit(3, 1).ok());
  Result<io::SafetensorsFile> shard = store.ReadShard(3, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  std::vector<float> expected = Params(*trainer);
  trainer->lora()->Apply(trainer->ema(), expected.data());
  size_t differ = 0;  // adapted weights whose EMA is not the model's
  for (const TensorSpec& t : trainer->model().global_parameter_table().tensors()) {
    std::vector<float> ema(t.numel);
    ASSERT_TRUE(shard->CopyF32("ema." + t.name, t.shape, ema.data()).ok()) << t.name;
    EXPECT_EQ(0, std::memcmp(ema.data(), expected.data() + t.offset, t.numel * 4)) << t.name;
    differ += std::memcmp(ema.data(), trainer->model().params() + t.offset, t.numel * 4) != 0;
  }
  EXPECT_GT(differ, 0u);
}

// A DoRA run resumes bit for bit, its magnitudes and their EMA in the checkpoint under peft's
// names; a plain LoRA run of the same rank does not resume it.
TEST(DoraTrainingTest, ResumeIsBitIdentical) {
  const TempDir dir("dora_training_test");
  TrainConfig c = TinyDora(3, 6);
  c.lora.targets = {"final_layer.linear", "adaLN_modulation.1", "qkv"};
  auto straight = MakeTrainer(c);
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(straight->Step().ok());
  io::CheckpointStore store(dir.path(), 2);
  auto first_half = MakeTrainer(c);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(first_half->Step().ok());
  ASSERT_TRUE(WriteCheckpointShard(*first_half, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(3, 1).ok());
  auto resumed = MakeTrainer(c);
  Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(*resumed, store);
  ASSERT_TRUE(step.ok()) << step.status().message();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(resumed->Step().ok());
  EXPECT_EQ(Params(*resumed), Params(*straight));
  const size_t n = straight->lora()->size();
  EXPECT_EQ(0, std::memcmp(straight->lora()->params(), resumed->lora()->params(), n * 4));
  EXPECT_EQ(0, std::memcmp(straight->ema(), resumed->ema(), n * 4));
  Result<io::SafetensorsFile> shard = store.ReadShard(3, 0, 1);
  ASSERT_TRUE(shard.ok());
  const std::string magnitude = "final_layer.linear.lora_magnitude_vector";
  EXPECT_NE(shard->Find("lora." + magnitude), nullptr);
  EXPECT_NE(shard->Find("ema.lora." + magnitude), nullptr);
  EXPECT_THAT(shard->metadata().at("lora"), HasSubstr("\"use_dora\":true"));
  TrainConfig plain = c;
  plain.lora.use_dora = false;
  auto lora = MakeTrainer(plain);
  Result<std::optional<int64_t>> refused = RestoreLatestCheckpoint(*lora, store);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("checkpoint trained LoRA adapters"));
}

// Pretrained weights (checkpoint.init_from) become the frozen ones, the magnitudes their rows'
// norms (in the EMA too): the run starts at those weights bit for bit.
TEST(DoraTrainingTest, PretrainedWeightsSetTheMagnitudes) {
  const TempDir dir("dora_training_test");
  TrainConfig whole = TinyLora();
  whole.lora = {};
  whole.seed = 4;
  auto source = MakeTrainer(whole);
  source->InitializeRandom(9);
  const TensorTable& global = source->model().global_parameter_table();
  io::SafetensorsWriter w;
  for (const TensorSpec& t : global.tensors())
    w.AddF32(t.name, t.shape, source->model().params() + t.offset);
  const std::string path = dir.path() + "/w.safetensors";
  ASSERT_TRUE(w.WriteAtomic(path).ok());
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok());

  auto trainer = MakeTrainer(TinyDora());
  ASSERT_NE(Params(*trainer), Params(*source));
  ASSERT_TRUE(trainer->InitializeFrom(*file).ok());
  EXPECT_EQ(Params(*trainer), Params(*source));
  const LoraAdapters& lora = *trainer->lora();
  EXPECT_EQ(0, std::memcmp(trainer->ema(), lora.params(), lora.size() * sizeof(float)));
  ASSERT_TRUE(trainer->Step().ok());
  EXPECT_NE(Params(*trainer), Params(*source));
}

TEST(DoraJobTest, UseDoraIsReadAndCarriedOnlyWhenSet) {
  const std::string job =
      "model: {name: custom, input_size: 8, patch_size: 2, in_channels: 4, hidden_size: 32, "
      "depth: 2, num_heads: 4, num_classes: 10}\ntrain: {device: cpu}\n";
  Result<TrainConfig> dora =
      TrainConfig::FromYamlText(job + "lora: {rank: 4, targets: [qkv], use_dora: true}\n", "j");
  ASSERT_TRUE(dora.ok()) << dora.status().message();
  EXPECT_TRUE(dora->lora.use_dora);
  EXPECT_EQ(dora->ToJson()["lora"]["use_dora"], true);
  Result<TrainConfig> lora =
      TrainConfig::FromYamlText(job + "lora: {rank: 4, targets: [qkv]}\n", "j");
  ASSERT_TRUE(lora.ok());
  // A plain LoRA's JSON (its checkpoints' metadata) is what it was before DoRA.
  EXPECT_FALSE(lora->ToJson()["lora"].contains("use_dora"));
  LoraConfig rankless;
  rankless.use_dora = true;
  EXPECT_THAT(rankless.Validate().message(), HasSubstr("DoRA needs lora.rank"));
  EXPECT_THAT(TrainConfig::FromYamlText(job + "lora: {rank: 4, targets: [qkv], use_dora: 2}\n", "j")
                  .status()
                  .message(),
              HasSubstr("use_dora"));
}

// rsLoRA (Kalajdzievski 2023; peft's use_rslora): the product scaled by alpha / √rank, the
// job's key read and carried only when set, and refused without a rank.
TEST(RsLoraTest, ScalesByAlphaOverTheRootOfTheRank) {
  LoraConfig c;
  c.rank = 4;
  c.alpha = 8;
  EXPECT_EQ(c.scale(), 2.0);
  c.use_rslora = true;
  EXPECT_EQ(c.scale(), 4.0);
  c.alpha = 0;  // the rank: √rank
  EXPECT_EQ(c.scale(), 2.0);
  EXPECT_EQ(c.ToJson()["use_rslora"], true);
  c.rank = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("rsLoRA needs lora.rank"));
  const std::string job =
      "model: {name: custom, input_size: 8, patch_size: 2, in_channels: 4, hidden_size: 32, "
      "depth: 2, num_heads: 4, num_classes: 10}\ntrain: {device: cpu}\n";
  Result<TrainConfig> rs = TrainConfig::FromYamlText(
      job + "lora: {rank: 9, alpha: 6, targets: [qkv], use_rslora: true}\n", "j");
  ASSERT_TRUE(rs.ok()) << rs.status().message();
  EXPECT_EQ(rs->lora.scale(), 2.0);
  EXPECT_FALSE(TinyLora().lora.ToJson().contains("use_rslora"));
  // The trainer's adapters scale by it: the model is W0 + 2 · B·A (OnlyTheTargetsChange… for
  // the rest).
  TrainConfig t = TinyLora(4, 4);
  t.lora.use_rslora = true;
  auto trainer = MakeTrainer(t);
  EXPECT_EQ(trainer->lora()->scale(), 2.0);
}

}  // namespace
}  // namespace difftrain
