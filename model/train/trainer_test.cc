#include "model/train/trainer.h"

#include <climits>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/data/latent_folder.h"
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

// diffusion.noise_offset and input_perturbation as diffusers' train_text_to_image.py applies
// them, on the noise a run without them draws: the noise shifted by one offset a sample and
// channel (a video's frames share it) of about noise_offset's spread, x_t mixed from the noise
// plus a perturbation of about input_perturbation's spread, and the loss's target the offset
// noise without the perturbation.
TEST_F(TrainerTest, NoiseOffsetAndInputPerturbationAsDiffusersAddsThem) {
  auto batch_of = [](const std::string& extras, MicroBatch& batch, double* loss) {
    Result<TrainConfig> c = TrainConfig::FromYamlText(
        "model: {name: latte, input_size: 8, in_channels: 2, num_frames: 2, patch_size: 4,\n"
        "        hidden_size: 16, depth: 2, num_heads: 2, num_classes: 4, learn_sigma: false}\n"
        "diffusion: {" +
            extras + "}\n",
        "job.yaml");
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto trainer = MakeTrainer(*c);
    trainer->model().InitializeRandom(5);
    ASSERT_TRUE(trainer->MakeMicroBatch(0, 64, batch).ok());
    *loss = trainer->ForwardBackward(batch, 1.0f);
    // The loss is the mean square of the output less the noise (offset included).
    double sum = 0;
    for (size_t i = 0; i < batch.noise.size(); ++i) {
      const double d = double(trainer->last_output()[i]) - batch.noise[i];
      sum += d * d;
    }
    EXPECT_NEAR(*loss, sum / double(batch.noise.size()), 1e-6 * *loss) << extras;
  };
  MicroBatch plain, extra;
  double plain_loss = 0, extra_loss = 0;
  batch_of("", plain, &plain_loss);
  batch_of("noise_offset: 0.1, input_perturbation: 0.2", extra, &extra_loss);
  ASSERT_EQ(plain.noise.size(), extra.noise.size());
  EXPECT_TRUE(plain.perturbation.empty());
  ASSERT_EQ(extra.perturbation.size(), extra.noise.size());
  EXPECT_EQ(plain.t, extra.t);
  EXPECT_EQ(plain.x0, extra.x0);

  constexpr int kFrames = 2, kChannels = 2;
  constexpr size_t kPlane = 64, kSample = kFrames * kChannels * kPlane;
  std::vector<double> shifts;
  for (int b = 0; b < 64; ++b) {
    for (int c = 0; c < kChannels; ++c) {
      const size_t first = b * kSample + c * kPlane;
      const double shift = double(extra.noise[first]) - plain.noise[first];
      for (int f = 0; f < kFrames; ++f) {
        for (size_t i = 0; i < kPlane; ++i) {
          const size_t at = b * kSample + (f * kChannels + c) * kPlane + i;
          ASSERT_NEAR(double(extra.noise[at]) - plain.noise[at], shift, 1e-6)
              << "sample " << b << " frame " << f << " channel " << c;
        }
      }
      shifts.push_back(shift);
    }
  }
  double mean = 0, square = 0;
  for (double s : shifts) {
    mean += s / shifts.size();
    square += s * s / shifts.size();
  }
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(square), 0.1, 0.025);

  // x_t less q_sample of the offset noise is √(1 − ᾱ_t) times the perturbation, whose spread is
  // input_perturbation's.
  const GaussianDiffusion diffusion{DiffusionConfig{}};
  std::vector<float> unperturbed(extra.x_t.size());
  diffusion.QSample(unperturbed.data(), extra.x0.data(), extra.noise.data(), extra.t.data(), 64,
                    kSample);
  double spread = 0;
  for (int b = 0; b < 64; ++b) {
    const double s = std::sqrt(1.0 - diffusion.alphas_cumprod()[extra.t[b]]);
    for (size_t i = 0; i < kSample; ++i) {
      const size_t at = b * kSample + i;
      ASSERT_NEAR(double(extra.x_t[at]) - unperturbed[at], s * extra.perturbation[at], 1e-5) << at;
      spread += double(extra.perturbation[at]) * extra.perturbation[at];
    }
  }
  EXPECT_NEAR(std::sqrt(spread / extra.perturbation.size()), 0.2, 0.01);
}

// optimizer.ema_schedule: diffusers reaches the trainer's average: after the first step it is the
// weights themselves (decay 0), after the second 2/11 of them and 9/11 of the new weights.
TEST_F(TrainerTest, DiffusersEmaScheduleStartsTheAverageAtTheFirstStepsWeights) {
  TrainConfig c = TinyConfig();
  c.optimizer.ema_schedule = "diffusers";
  c.global_batch = c.micro_batch;
  auto trainer = MakeTrainer(c);
  const size_t n = trainer->model().num_params();
  ASSERT_TRUE(trainer->Step().ok());
  const std::vector<float> first = Params(*trainer);
  EXPECT_EQ(std::vector<float>(trainer->ema(), trainer->ema() + n), first);
  ASSERT_TRUE(trainer->Step().ok());
  const std::vector<float> second = Params(*trainer);
  const float d = static_cast<float>(2.0 / 11.0), keep = static_cast<float>(1.0 - 2.0 / 11.0);
  for (size_t i = 0; i < n; ++i)
    ASSERT_FLOAT_EQ(trainer->ema()[i], d * first[i] + keep * second[i]) << i;
}

// data.max_samples: the trainer draws from a seeded random subset of the data, exactly as it
// draws from a folder holding just those samples.
TEST_F(TrainerTest, MaxSamplesTrainsOnASeededSubsetAsOnAFolderOfIt) {
  TrainConfig c = TinyConfig();
  const SampleSchema x = FamilyOf(c.model).Samples(c.model);
  const SyntheticDataset source(5, x.channels, x.height, x.num_classes);
  const std::string all = (dir_ / "all").string(), some = (dir_ / "some").string();
  ASSERT_TRUE(WriteLatentFolder(PrefixDataset(source, 40), all, 8).ok());
  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(all);
  ASSERT_TRUE(folder.ok());
  const std::unique_ptr<Dataset> subset = TakeSubset(std::move(folder).value(), 12, c.seed);
  ASSERT_TRUE(WriteLatentFolder(*subset, some, 8).ok());
  c.data.kind = "latent_folder";
  c.data.path = all;
  c.data.max_samples = 12;
  TrainConfig d = c;
  d.data.path = some;
  d.data.max_samples = 0;
  Result<std::unique_ptr<Trainer>> sampled = Trainer::Create(c), packed = Trainer::Create(d);
  ASSERT_TRUE(sampled.ok()) << sampled.status().message();
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  for (int64_t first = 0; first < 24; first += 4) {  // two epochs of the 12
    MicroBatch a, b;
    ASSERT_TRUE((*sampled)->MakeMicroBatch(first, 4, a).ok());
    ASSERT_TRUE((*packed)->MakeMicroBatch(first, 4, b).ok());
    EXPECT_EQ(a.x0, b.x0) << first;
    EXPECT_EQ(a.y, b.y) << first;
  }
  c.data.max_samples = -1;
  EXPECT_EQ(Trainer::Create(c).status().message(),
            "data.max_samples: expected a count >= 0 (0: all), found -1");
}

// DreamBooth's prior preservation: a job whose data.prior_path names a latent folder of 16
// samples of the class (here synthetic samples of another seed).
class PriorTest : public TrainerTest {
 protected:
  TrainConfig PriorConfig(double weight = 1) {
    TrainConfig c = TinyConfig();
    c.learn_sigma_loss = false;
    c.micro_batch = 4;
    c.global_batch = 8;
    const std::string prior = (dir_ / "prior").string();
    if (!std::filesystem::exists(prior)) {
      const SampleSchema x = FamilyOf(c.model).Samples(c.model);
      const SyntheticDataset source(99, x.channels, x.height, x.num_classes);
      EXPECT_TRUE(WriteLatentFolder(PrefixDataset(source, 16), prior, 5).ok());
    }
    c.data.prior_path = prior;
    c.data.prior_loss_weight = weight;
    return c;
  }
};

// Each micro-batch is the data's samples [first/2, first/2 + B/2), as a run without the prior
// would draw them, then as many of the prior's; an epoch of the prior's draws each of its
// samples once.
TEST_F(PriorTest, HalfOfEachMicroBatchIsTheClasssOwnSamples) {
  Result<std::unique_ptr<Trainer>> with = Trainer::Create(PriorConfig());
  ASSERT_TRUE(with.ok()) << with.status().message();
  TrainConfig plain_config = PriorConfig();
  plain_config.data.prior_path.clear();
  Result<std::unique_ptr<Trainer>> plain = Trainer::Create(plain_config);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  Result<std::unique_ptr<LatentFolderDataset>> folder =
      LatentFolderDataset::Open((dir_ / "prior").string());
  ASSERT_TRUE(folder.ok());
  const size_t n = 4 * 8 * 8;
  std::vector<std::vector<float>> prior_samples(16, std::vector<float>(n));
  for (int i = 0; i < 16; ++i) {
    int32_t label = 0;
    ASSERT_TRUE((*folder)->Get(i, prior_samples[i].data(), &label).ok());
  }
  std::vector<int> drawn(16, 0);
  for (int64_t first = 0; first < 32; first += 4) {
    MicroBatch batch, own;
    ASSERT_TRUE((*with)->MakeMicroBatch(first, 4, batch).ok());
    ASSERT_TRUE((*plain)->MakeMicroBatch(first / 2, 2, own).ok());
    EXPECT_EQ(std::vector<float>(batch.x0.begin(), batch.x0.begin() + 2 * n), own.x0)
        << "micro-batch from " << first;
    EXPECT_EQ(batch.sample_weights, (std::vector<double>{2, 2, 2, 2}));
    for (int b = 2; b < 4; ++b) {
      const std::vector<float> sample(batch.x0.begin() + b * n, batch.x0.begin() + (b + 1) * n);
      const auto at = std::find(prior_samples.begin(), prior_samples.end(), sample);
      ASSERT_NE(at, prior_samples.end()) << "sample " << b << " from " << first;
      ++drawn[at - prior_samples.begin()];
    }
  }
  EXPECT_EQ(drawn, std::vector<int>(16, 1));
}

// The loss is diffusers' train_dreambooth.py's: the data half's MSE plus prior_loss_weight
// times the prior half's, each a mean over its own samples.
TEST_F(PriorTest, LossIsTheDataMeanPlusWeightTimesThePriorMean) {
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(PriorConfig(0.25));
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  (*trainer)->model().InitializeRandom(3);
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 4, batch).ok());
  const double loss = (*trainer)->ForwardBackward(batch, 1.0f);
  const size_t n = 4 * 8 * 8;
  // learn_sigma: the output's first 4 of 8 channels are the noise's prediction.
  auto half_mse = [&](int from) {
    double sum = 0;
    for (int b = from; b < from + 2; ++b) {
      for (size_t i = 0; i < n; ++i) {
        const double d = double((*trainer)->last_output()[b * 2 * n + i]) - batch.noise[b * n + i];
        sum += d * d;
      }
    }
    return sum / double(2 * n);
  };
  EXPECT_NEAR(loss, half_mse(0) + 0.25 * half_mse(2), 1e-6 * loss);
}

TEST_F(PriorTest, BadPriorsAreRefusedNamingTheField) {
  TrainConfig odd = PriorConfig();
  odd.micro_batch = 3;
  odd.global_batch = 6;
  EXPECT_THAT(odd.Validate().message(), ::testing::HasSubstr("batch.micro: with data.prior_path"));
  TrainConfig sigma = PriorConfig();
  sigma.learn_sigma_loss = true;
  EXPECT_THAT(sigma.Validate().message(),
              ::testing::HasSubstr("not with diffusion.learn_sigma_loss"));
  TrainConfig negative = PriorConfig(-1);
  EXPECT_EQ(negative.Validate().message(),
            "data.prior_loss_weight: expected a number >= 0, found -1");
  TrainConfig missing = PriorConfig();
  missing.data.prior_path = (dir_ / "nowhere").string();
  Result<std::unique_ptr<Trainer>> none = Trainer::Create(missing);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr("data.prior_path"));
  // A prior of another sample shape: 2 channels where the model takes 4.
  const std::string small = (dir_ / "small").string();
  const SyntheticDataset source(5, 2, 8, 10);
  ASSERT_TRUE(WriteLatentFolder(PrefixDataset(source, 4), small, 4).ok());
  TrainConfig other = PriorConfig();
  other.data.prior_path = small;
  Result<std::unique_ptr<Trainer>> misfit = Trainer::Create(other);
  ASSERT_FALSE(misfit.ok());
  EXPECT_THAT(misfit.status().message(),
              ::testing::HasSubstr("data.prior_path samples are 1x2x8x8"));
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
