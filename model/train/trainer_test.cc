#include "model/train/trainer.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "model/train/checkpointing.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

TrainConfig TinyConfig() {
  TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/32);
  c.optimizer.lr = 1e-3;
  c.seed = 7;
  return c;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainConfig& c) {
  return std::make_unique<Trainer>(c, testing::SyntheticData(c));
}

std::vector<float> Params(const Trainer& t) {
  return {t.model().params(), t.model().params() + t.model().num_params()};
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("trainer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(TrainerTest, OverfitsAFixedBatchTenfold) {
  TrainConfig c = TinyConfig();
  testing::EditDiT(c.model,
                   [](DiTConfig& m) { m.class_dropout_prob = 0; });  // the batch stays fixed
  auto trainer = MakeTrainer(c);
  MicroBatch batch;
  ASSERT_TRUE(trainer->MakeMicroBatch(0, 8, batch).ok());
  const double first = trainer->StepOn(batch).loss;
  double last = first;
  for (int i = 0; i < 300; ++i)
    last = trainer->StepOn(batch).loss;
  EXPECT_LT(last, first / 10) << "loss " << first << " -> " << last;
}

// A video job's frame_noise_correlation reaches the noise q_sample mixes in: the frames of a
// sample correlate by about ρ (independent noise: about 0).
TEST_F(TrainerTest, VideoNoiseCorrelatesItsFramesAsTheJobSays) {
  auto frame_correlation = [](double rho) {
    Result<TrainConfig> c = TrainConfig::FromYamlText(
        "model: {name: latte, input_size: 8, in_channels: 1, num_frames: 2, patch_size: 4,\n"
        "        hidden_size: 16, depth: 2, num_heads: 2, num_classes: 4}\n"
        "diffusion: {frame_noise_correlation: " + std::to_string(rho) + "}\n",
        "job.yaml");
    EXPECT_TRUE(c.ok()) << c.status().message();
    auto trainer = MakeTrainer(*c);
    MicroBatch batch;
    EXPECT_TRUE(trainer->MakeMicroBatch(0, 32, batch).ok());
    constexpr size_t kFrame = 64;  // 1 x 8 x 8
    double cross = 0, first = 0, second = 0;
    for (int b = 0; b < 32; ++b) {
      for (size_t j = 0; j < kFrame; ++j) {
        const double u = batch.noise[b * 2 * kFrame + j], v = batch.noise[(b * 2 + 1) * kFrame + j];
        cross += u * v;
        first += u * u;
        second += v * v;
      }
    }
    return cross / std::sqrt(first * second);
  };
  EXPECT_NEAR(frame_correlation(0.0), 0.0, 0.1);
  EXPECT_NEAR(frame_correlation(0.8), 0.8, 0.1);
}

// The final linear's output features are ordered (ki, kj, channel); channels C..2C-1 are
// the variance. Their weights get gradient from the variational bound only.
double VarianceWeightGradient(bool learn_sigma_loss) {
  TrainConfig c = TinyConfig();
  c.learn_sigma_loss = learn_sigma_loss;
  auto trainer = MakeTrainer(c);
  trainer->model().InitializeRandom(3);  // the reference zero-initialises the final layer
  MicroBatch batch;
  EXPECT_TRUE(trainer->MakeMicroBatch(0, 4, batch).ok());
  std::memset(trainer->model().grads(), 0, trainer->model().num_params() * sizeof(float));
  trainer->ForwardBackward(batch, 1.0f);
  const TensorSpec* w = trainer->model().parameter_table().Find("final_layer.linear.weight");
  const DiTConfig m = DiTConfigOf(c.model);
  const int C = m.in_channels, out = m.out_channels(), D = m.hidden_size;
  double sum = 0;
  for (int f = 0; f < static_cast<int>(w->shape[0]); ++f) {
    if (f % out < C) continue;
    for (int d = 0; d < D; ++d)
      sum += std::abs(trainer->model().grads()[w->offset + f * D + d]);
  }
  return sum;
}

TEST_F(TrainerTest, LearnSigmaLossAloneTrainsTheVarianceChannels) {
  EXPECT_EQ(VarianceWeightGradient(false), 0.0);
  EXPECT_GT(VarianceWeightGradient(true), 0.0);
}

TEST_F(TrainerTest, ResumeIsBitIdentical) {
  const TrainConfig c = TinyConfig();
  auto straight = MakeTrainer(c);
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(straight->Step().ok());

  io::CheckpointStore store(dir_.string(), 2);
  auto first_half = MakeTrainer(c);
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(first_half->Step().ok());
  ASSERT_TRUE(WriteCheckpointShard(*first_half, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(10, 1).ok());

  auto resumed = MakeTrainer(c);
  Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(*resumed, store);
  ASSERT_TRUE(step.ok()) << step.status().message();
  ASSERT_EQ(step->value_or(-1), 10);
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(resumed->Step().ok());

  EXPECT_EQ(resumed->step(), 20);
  EXPECT_EQ(resumed->samples_seen(), straight->samples_seen());
  const size_t bytes = straight->model().num_params() * sizeof(float);
  EXPECT_EQ(0, std::memcmp(straight->model().params(), resumed->model().params(), bytes));
  EXPECT_EQ(0, std::memcmp(straight->ema(), resumed->ema(), bytes));
}

TEST_F(TrainerTest, AccumulationMatchesOneLargeMicroBatch) {
  TrainConfig accumulate = TinyConfig();  // micro 4 x 2 steps
  TrainConfig whole = TinyConfig();
  whole.micro_batch = 8;
  auto a = MakeTrainer(accumulate), b = MakeTrainer(whole);
  for (int i = 0; i < 5; ++i) {
    const double la = a->Step()->loss, lb = b->Step()->loss;
    EXPECT_NEAR(la, lb, 1e-5 * std::abs(lb)) << "step " << i;
  }
  EXPECT_LT(RelativeL2(Params(*a), Params(*b)), 1e-5);
}

TEST_F(TrainerTest, RestoringAnotherModelNamesTheDifference) {
  io::CheckpointStore store(dir_.string(), 2);
  TrainConfig c = TinyConfig();
  auto trainer = MakeTrainer(c);
  ASSERT_TRUE(trainer->Step().ok());
  ASSERT_TRUE(WriteCheckpointShard(*trainer, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(1, 1).ok());

  testing::EditDiT(c.model, [](DiTConfig& m) { m.hidden_size = 64; });
  auto other = MakeTrainer(c);
  Result<std::optional<int64_t>> restored = RestoreLatestCheckpoint(*other, store);
  ASSERT_FALSE(restored.ok());
  EXPECT_NE(restored.status().message().find("checkpoint is of model"), std::string::npos)
      << restored.status().message();
  EXPECT_NE(restored.status().message().find("shard-00000-of-00001.safetensors"), std::string::npos)
      << restored.status().message();
}

TEST_F(TrainerTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  io::CheckpointStore store(dir_.string(), 3);
  const TrainConfig c = TinyConfig();
  auto trainer = MakeTrainer(c);
  for (int step = 1; step <= 2; ++step) {
    ASSERT_TRUE(trainer->Step().ok());
    ASSERT_TRUE(WriteCheckpointShard(*trainer, store, 0, 1).ok());
    ASSERT_TRUE(store.Commit(step, 1).ok());
  }
  // Flip one byte in the middle of the newest shard's data.
  const std::filesystem::path shard =
      std::filesystem::path(store.StepDir(2)) / "shard-00000-of-00001.safetensors";
  std::FILE* f = std::fopen(shard.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(std::filesystem::file_size(shard) / 2), SEEK_SET);
  const int byte = std::fgetc(f);
  std::fseek(f, -1, SEEK_CUR);
  std::fputc(byte ^ 0xFF, f);
  std::fclose(f);

  auto resumed = MakeTrainer(c);
  Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(*resumed, store);
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_EQ(step->value_or(-1), 1);
  EXPECT_EQ(resumed->step(), 1);
}

}  // namespace
}  // namespace difftrain
