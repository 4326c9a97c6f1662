// train.epochs (Trainer::ResolveEpochs): the steps of a run that shows the data's every sample
// `epochs` times, from the data as the trainer opens it.
#include <filesystem>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/data/latent_folder.h"
#include "model/data/loader.h"
#include "model/family/family.h"
#include "model/train/trainer.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;

class EpochsTest : public ::testing::Test {
 protected:
  // A latent folder of `count` synthetic samples of the tiny model's shape (seed `seed`).
  std::string Folder(const std::string& name, int64_t count, uint64_t seed = 5) {
    const std::string path = temp_.path() + "/" + name;
    const TrainConfig c = Config();
    const SampleSchema x = FamilyOf(c.model).Samples(c.model);
    const SyntheticDataset source(seed, x.channels, x.height, x.num_classes);
    EXPECT_TRUE(WriteLatentFolder(PrefixDataset(source, count), path, 8).ok());
    return path;
  }
  // The tiny DiT, batch.global 8 (micro 4, two accumulated), `epochs` of the latent folder `data`.
  static TrainConfig Config(const std::string& data = "", int64_t epochs = 0) {
    TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/32);
    c.learn_sigma_loss = false;
    c.data.kind = "latent_folder";
    c.data.path = data;
    c.epochs = epochs;
    c.steps = epochs > 0 ? 0 : c.steps;
    return c;
  }

  TempDir temp_{"epochs_test"};
};

// ceil(epochs × samples / batch.global): 3 epochs of 40 samples in steps of 8 are 15 steps, of 12
// (data.max_samples) 36 samples, so 5 steps (40 samples, the last step's 4 from a fourth epoch).
// The loader's first epochs × S samples then hold each of the data's samples `epochs` times.
TEST_F(EpochsTest, StepsAreTheEpochsSamplesOverTheGlobalBatchRoundedUp) {
  const std::string data = Folder("data", 40);
  TrainConfig c = Config(data, 3);
  ASSERT_TRUE(Trainer::ResolveEpochs(c).ok());
  EXPECT_EQ(c.epoch_samples, 40);
  EXPECT_EQ(c.steps, 15);

  TrainConfig some = Config(data, 3);
  some.data.max_samples = 12;
  ASSERT_TRUE(Trainer::ResolveEpochs(some).ok());
  EXPECT_EQ(some.epoch_samples, 12);
  EXPECT_EQ(some.steps, 5);

  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(data);
  ASSERT_TRUE(folder.ok());
  DataLoaderOptions o;
  o.seed = c.seed;
  o.batch_size = c.global_batch;
  o.prefetch = false;
  const DataLoader loader(**folder, o);
  std::map<int64_t, int> times;
  for (int64_t n = 0; n < c.epochs * c.epoch_samples; ++n)
    ++times[loader.IndexOf(n)];
  ASSERT_EQ(times.size(), 40u);
  for (const auto& [index, seen] : times)
    EXPECT_EQ(seen, 3) << index;

  // Resolved once: given steps, or steps already resolved, are kept.
  TrainConfig again = c;
  again.data.max_samples = 12;
  ASSERT_TRUE(Trainer::ResolveEpochs(again).ok());
  EXPECT_EQ(again.steps, 15);
  TrainConfig given = Config(data);
  given.steps = 7;
  ASSERT_TRUE(Trainer::ResolveEpochs(given).ok());
  EXPECT_EQ(given.steps, 7);
  EXPECT_EQ(given.epoch_samples, 0);
}

// With DreamBooth's prior, half of each step's samples are the data's: 2 epochs of 40 samples in
// steps of 4 of them are 20 steps, whatever the prior's size.
TEST_F(EpochsTest, WithAPriorAStepTakesHalfItsSamplesFromTheData) {
  TrainConfig c = Config(Folder("data", 40), 2);
  c.data.prior_path = Folder("prior", 16, 99);
  ASSERT_TRUE(Trainer::ResolveEpochs(c).ok());
  EXPECT_EQ(c.epoch_samples, 40);
  EXPECT_EQ(c.steps, 20);
}

// Each step reports the passes over the data done: 12 samples (data.max_samples) in steps of 8 are
// 2/3 of an epoch a step; with a prior, a step's 4 samples of 40 are a tenth. Synthetic data
// without an end has no epochs: 0.
TEST_F(EpochsTest, StepsReportThePassesOverTheDataDone) {
  const std::string data = Folder("data", 40);
  TrainConfig some = Config(data, 2);
  some.data.max_samples = 12;
  ASSERT_TRUE(Trainer::ResolveEpochs(some).ok());
  ASSERT_EQ(some.steps, 3);
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(some);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  EXPECT_EQ((*trainer)->epochs_seen(), 0);
  for (int step = 1; step <= 3; ++step) {
    Result<StepStats> stats = (*trainer)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    EXPECT_DOUBLE_EQ(stats->epoch, 8.0 * step / 12) << step;
  }

  TrainConfig prior = Config(data, 1);
  prior.data.prior_path = Folder("prior", 16, 99);
  ASSERT_TRUE(Trainer::ResolveEpochs(prior).ok());
  trainer = Trainer::Create(prior);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  for (int step = 1; step <= 2; ++step) {
    Result<StepStats> stats = (*trainer)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    EXPECT_DOUBLE_EQ(stats->epoch, 4.0 * step / 40) << step;
  }

  TrainConfig synthetic = Config();
  synthetic.data.kind = "synthetic";
  synthetic.steps = 1;
  trainer = Trainer::Create(synthetic);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  Result<StepStats> stats = (*trainer)->Step();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->epoch, 0);
}

// Data without an end has no epochs unless data.max_samples cuts it; data the trainer would
// refuse is refused here, naming train.epochs; and the trainer refuses epochs not resolved.
TEST_F(EpochsTest, DataWithoutEpochsOrThatDoesNotFitIsRefused) {
  TrainConfig synthetic = Config("", 2);
  synthetic.data.kind = "synthetic";
  Status refused = Trainer::ResolveEpochs(synthetic);
  EXPECT_THAT(refused.message(), HasSubstr("train.epochs: data.kind synthetic has a sample at "
                                           "every index and no epochs; give data.max_samples"));
  synthetic.data.max_samples = 20;
  ASSERT_TRUE(Trainer::ResolveEpochs(synthetic).ok());
  EXPECT_EQ(synthetic.steps, 5);

  TrainConfig missing = Config(temp_.path() + "/nowhere", 2);
  refused = Trainer::ResolveEpochs(missing);
  EXPECT_THAT(refused.message(), HasSubstr("train.epochs: data"));
  EXPECT_EQ(missing.steps, 0);

  TrainConfig unresolved = Config(Folder("data", 40), 2);
  Result<std::unique_ptr<Trainer>> created = Trainer::Create(unresolved);
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(created.status().message(), HasSubstr("train.epochs 2: the steps are not resolved"));
  ASSERT_TRUE(Trainer::ResolveEpochs(unresolved).ok());
  EXPECT_TRUE(Trainer::Create(unresolved).ok());
}

}  // namespace
}  // namespace difftrain
