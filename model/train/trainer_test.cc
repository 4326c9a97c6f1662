#include "model/train/trainer.h"

#include <climits>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/family/family.h"
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
        "diffusion: {frame_noise_correlation: " +
            std::to_string(rho) + "}\n",
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

// Activations larger than the machine's memory are an error naming the job's sizes, not an
// uncaught std::bad_alloc (or, where the kernel overcommits, a process killed mid-fill).
TEST_F(TrainerTest, ActivationsLargerThanTheMachineAreAnError) {
  TrainConfig c = TinyConfig();
  const size_t per_sample = FamilyOf(c.model).ActivationBytes(c.model, {}, 0, 1, 1, false);
  const size_t micro = 2 * PhysicalMemoryBytes() / per_sample + 1;
  ASSERT_LT(micro, size_t(INT_MAX));
  c.micro_batch = c.global_batch = static_cast<int>(micro);
  Result<std::unique_ptr<Trainer>> made = Trainer::Create(c);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(),
              ::testing::HasSubstr("out of host memory creating the trainer"));
  EXPECT_THAT(made.status().message(), ::testing::HasSubstr(fmt::format("batch.micro {}", micro)));
  // What the arenas would take, and what this rank may take.
  Result<MemoryBytes> plan =
      PlanMemory(c.model, {}, 0, c.micro_batch, 1, false, 1, size_t{1} << 20, false);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const size_t total = plan->total();
  EXPECT_THAT(made.status().message(),
              ::testing::HasSubstr(fmt::format("needs {:.2f} GiB of host memory (parameters",
                                               double(total) / (1ull << 30))));
  EXPECT_THAT(made.status().message(),
              ::testing::ContainsRegex("more than the [0-9.]+ GiB (available of this machine's|"
                                       "left of the [0-9.]+ GiB memory limit of this process)"));
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

// Stands in for the device in the tests of the trainer's GPU path, which run on every machine:
// it keeps the micro-batches the trainer hands it, in order, and computes nothing (the real GPU
// steps are checked against the CPU trainer in model/cuda/train_step_test.cc, on a GPU). It
// takes its time over each, as a device would, so that the next micro-batch is made meanwhile.
class RecordingGpuStep final : public GpuStep {
 public:
  RecordingGpuStep(size_t num_params, std::vector<MicroBatch>* fed)
      : fed_(fed), arenas_(4, std::vector<float>(num_params)), gradients_(num_params) {}

  int device() const override { return 0; }
  const std::string& device_name() const override { return name_; }
  Result<std::unique_ptr<parallel::Comm>> JoinGroup(parallel::Store&, const std::string&, int, int,
                                                    std::vector<int>,
                                                    std::chrono::milliseconds) override {
    return Status::Error("a recording step joins no group");
  }
  void UploadState(const float* params, const float* ema, const float* exp_avg,
                   const float* exp_avg_sq) override {
    const float* from[4] = {params, ema, exp_avg, exp_avg_sq};
    for (int i = 0; i < 4; ++i) {
      if (from[i] != nullptr) {
        arenas_[i].assign(from[i], from[i] + arenas_[i].size());
      } else {
        std::fill(arenas_[i].begin(), arenas_[i].end(), 0.0f);
      }
    }
  }
  void DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) override {
    float* to[4] = {params, ema, exp_avg, exp_avg_sq};
    for (int i = 0; i < 4; ++i) {
      if (to[i] != nullptr) std::copy(arenas_[i].begin(), arenas_[i].end(), to[i]);
    }
  }
  void ZeroGradients() override {}
  double ForwardBackward(const MicroBatch& batch, float) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    fed_->push_back(batch);
    return batch.x_t[0];
  }
  float* gradients() override { return gradients_.data(); }
  double OptimizerStep(double, int64_t) override { return 0; }
  MemoryBytes memory() const override { return {}; }

 private:
  const std::string name_ = "recording";
  std::vector<MicroBatch>* fed_;
  std::vector<std::vector<float>> arenas_;  // parameters, EMA, the two moments
  std::vector<float> gradients_;
};

std::unique_ptr<Trainer> MakeGpuTrainer(TrainConfig c, std::vector<MicroBatch>* fed) {
  c.device = "cuda";
  const size_t n = MakeTrainer(TinyConfig())->model().num_params();
  return std::make_unique<Trainer>(c, testing::SyntheticData(c), ParallelOptions{},
                                   std::make_unique<RecordingGpuStep>(n, fed));
}

// What the GPU step is fed equals what MakeMicroBatch makes, for the same samples in the same
// order, though each is made on a helper thread while the one before it computes.
void ExpectFedFrom(const std::vector<MicroBatch>& fed, const std::vector<int64_t>& firsts,
                   Trainer& reference) {
  ASSERT_EQ(fed.size(), firsts.size());
  for (size_t i = 0; i < fed.size(); ++i) {
    MicroBatch want;
    ASSERT_TRUE(reference.MakeMicroBatch(firsts[i], fed[i].size, want).ok());
    EXPECT_EQ(fed[i].x0, want.x0) << "micro-batch " << i << " (sample " << firsts[i] << ")";
    EXPECT_EQ(fed[i].noise, want.noise) << "micro-batch " << i;
    EXPECT_EQ(fed[i].x_t, want.x_t) << "micro-batch " << i;
    EXPECT_EQ(fed[i].t, want.t) << "micro-batch " << i;
    EXPECT_EQ(fed[i].y, want.y) << "micro-batch " << i;
  }
}

TEST_F(TrainerTest, TheGpuStepIsFedTheSameMicroBatchesMadeAhead) {
  TrainConfig c = TinyConfig();  // micro-batches of 4
  c.global_batch = 8;            // two a step
  std::vector<MicroBatch> fed;
  auto gpu = MakeGpuTrainer(c, &fed);
  for (int i = 0; i < 3; ++i) {
    Result<StepStats> stats = gpu->Step();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    EXPECT_DOUBLE_EQ(stats->loss, (double{fed[2 * i].x_t[0]} + fed[2 * i + 1].x_t[0]) / 2);
  }
  EXPECT_EQ(gpu->micro_batches_made_ahead(), 5);  // all but the first
  auto reference = MakeTrainer(c);
  ExpectFedFrom(fed, {0, 4, 8, 12, 16, 20}, *reference);
}

TEST_F(TrainerTest, AfterARestoreTheGpuStepIsFedTheRestoredPosition) {
  TrainConfig c = TinyConfig();
  c.global_batch = 4;  // one micro-batch a step: the next step's is made ahead
  io::CheckpointStore store(dir_.string(), 2);
  auto cpu = MakeTrainer(c);
  ASSERT_TRUE(cpu->Step().ok());
  ASSERT_TRUE(WriteCheckpointShard(*cpu, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(1, 1).ok());

  std::vector<MicroBatch> fed;
  auto gpu = MakeGpuTrainer(c, &fed);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(gpu->Step().ok());  // samples 0 … 11; 12 … 15 made ahead
  Result<std::optional<int64_t>> step = RestoreLatestCheckpoint(*gpu, store);
  ASSERT_TRUE(step.ok()) << step.status().message();
  ASSERT_EQ(step->value_or(-1), 1);
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(gpu->Step().ok());
  ExpectFedFrom(fed, {0, 4, 8, 4, 8}, *cpu);
  // Made ahead: 4 and 8, then 8 again; not the first, nor 4 after the restore (12 was ahead).
  EXPECT_EQ(gpu->micro_batches_made_ahead(), 3);
}

}  // namespace
}  // namespace difftrain
