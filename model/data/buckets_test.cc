// Aspect-ratio buckets (docs/data.md): a latent folder of samples in several sizes, written and
// read back; the loader's batches, each of one bucket; and what training refuses of them.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/data/bucket_testing.h"
#include "model/data/latent_folder.h"
#include "model/data/loader.h"
#include "model/family/family.h"
#include "model/io/safetensors.h"
#include "model/train/trainer.h"

namespace difftrain {
namespace {

using Json = nlohmann::json;
using testing::BucketedTestDataset;

// 4×8×8 nominal; 8×8, 6×10 and 10×6 buckets; samples 0, 3, 6, … in the first, 1, 4, … in the
// second, every third from 2 in the third, except that 5, 11, 17, … go to the first too.
const std::vector<SampleSize> kBuckets = {{8, 8}, {6, 10}, {10, 6}};
const std::vector<int> kBucketOf = {0, 1, 2, 0, 1, 0};

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> Sample(const Dataset& d, int64_t index) {
  std::vector<float> x(d.SampleFloats(index));
  int32_t label = -1;
  EXPECT_TRUE(d.Get(index, x.data(), &label).ok());
  return x;
}

class BucketedFolderTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  Json Index() const { return Json::parse(ReadText(Path("index.json"))); }
  void SetIndex(const Json& index) { std::ofstream(Path("index.json")) << index.dump(); }
  void ExpectError(const std::string& reason) {
    Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
    ASSERT_FALSE(data.ok());
    EXPECT_NE(data.status().message().find(reason), std::string::npos) << data.status().message();
  }

  TempDir temp_{"buckets_test"};
  std::string dir_ = temp_.path();
  BucketedTestDataset source_{14, 4, 8, kBuckets, kBucketOf, 3};
};

// The folder holds the samples grouped by bucket (the source's order within each), each shard of
// one bucket's size, the index listing the buckets and each shard's.
TEST_F(BucketedFolderTest, WritesEachBucketsSamplesInShardsOfItsSize) {
  ASSERT_TRUE(WriteLatentFolder(source_, dir_, 3).ok());
  const Json index = Index();
  EXPECT_EQ(index["height"], 8);
  EXPECT_EQ(index["width"], 8);
  EXPECT_EQ(index["buckets"], Json::parse(R"([{"height": 8, "width": 8},
      {"height": 6, "width": 10}, {"height": 10, "width": 6}])"));
  // Bucket 0 holds 0, 3, 5, 6, 9, 11, 12 (7 samples: shards of 3, 3, 1); bucket 1 1, 4, 7, 10,
  // 13; bucket 2 2, 8.
  std::vector<int> shard_buckets;
  std::vector<int64_t> counts;
  for (const Json& shard : index["shards"]) {
    shard_buckets.push_back(shard["bucket"]);
    counts.push_back(shard["count"]);
  }
  EXPECT_EQ(shard_buckets, (std::vector<int>{0, 0, 0, 1, 1, 2}));
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 3, 1, 3, 2, 2}));
  Result<io::SafetensorsFile> shard = io::SafetensorsFile::Read(Path("shard-00004.safetensors"));
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->Find("latents")->shape, (std::vector<int64_t>{2, 4, 6, 10}));

  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok()) << data.status().message();
  const Dataset& d = **data;
  EXPECT_TRUE(d.bucketed());
  EXPECT_EQ(d.buckets(), kBuckets);
  const std::vector<int64_t> order = {0, 3, 5, 6, 9, 11, 12, 1, 4, 7, 10, 13, 2, 8};
  ASSERT_EQ(d.size(), static_cast<int64_t>(order.size()));
  for (int64_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d.BucketOf(i), source_.BucketOf(order[i])) << i;
    EXPECT_EQ(d.SampleFloats(i), source_.SampleFloats(order[i])) << i;
    EXPECT_EQ(Sample(d, i), Sample(source_, order[i])) << i;
    PictureGeometry got, want;
    ASSERT_TRUE(d.GetGeometry(i, &got).ok());
    ASSERT_TRUE(source_.GetGeometry(order[i], &want).ok());
    EXPECT_EQ(got, want) << i;
    int32_t label = -1;
    std::vector<float> x(d.SampleFloats(i));
    ASSERT_TRUE(d.Get(i, x.data(), &label).ok());
    EXPECT_EQ(label, order[i] % 3);
  }
}

TEST_F(BucketedFolderTest, AFolderOfOneSizeHasOneBucketAndNoBucketEntries) {
  SyntheticDataset synthetic(3, 4, 8, 10);
  PrefixDataset one_size(synthetic, 5);
  ASSERT_TRUE(WriteLatentFolder(one_size, dir_, 2).ok());
  EXPECT_FALSE(Index().contains("buckets"));
  EXPECT_FALSE(Index()["shards"][0].contains("bucket"));
  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok());
  EXPECT_FALSE((*data)->bucketed());
  EXPECT_EQ((*data)->buckets(), (std::vector<SampleSize>{{8, 8}}));
}

TEST_F(BucketedFolderTest, IndexErrorsNameTheBucketOrShard) {
  ASSERT_TRUE(WriteLatentFolder(source_, dir_, 3).ok());
  const Json good = Index();
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& i) { i["buckets"] = Json::array(); }, "'buckets' must be a non-empty list"},
      {[](Json& i) {
         i["buckets"][1] = {{"height", 6}};
       },
       "bucket 1: 'width' must be a positive integer"},
      {[](Json& i) { i["buckets"][2] = 7; }, "bucket 2 must be {\"height\""},
      {[](Json& i) { i["shards"][3]["bucket"] = 3; },
       "shard 3: 'bucket' must be a bucket's number in [0, 3), got 3"},
      {[](Json& i) { i["shards"][0].erase("bucket"); },
       "shard 0: 'bucket' must be a bucket's number"},
      // A shard said to be of another bucket than its latents' size.
      {[](Json& i) { i["shards"][3]["bucket"] = 2; },
       "tensor 'latents' is F32 [3,4,6,10], expected F32 [3,4,10,6]"},
      // Without "buckets" the shards must be of the nominal size.
      {[](Json& i) { i.erase("buckets"); },
       "tensor 'latents' is F32 [3,4,6,10], expected F32 [3,4,8,8]"},
  };
  for (const auto& [edit, reason] : cases) {
    Json index = good;
    edit(index);
    SetIndex(index);
    ExpectError(reason);
  }
}

DataLoaderOptions Options(uint64_t seed, int batch, int dp_size = 1, int dp_rank = 0) {
  DataLoaderOptions o;
  o.seed = seed;
  o.batch_size = batch;
  o.dp_size = dp_size;
  o.dp_rank = dp_rank;
  return o;
}

// 43 samples: bucket 0 holds 22 (0, 3, 5, 6, 9, 11, …), bucket 1 14, bucket 2 7.
class BucketedLoaderTest : public ::testing::Test {
 protected:
  BucketedTestDataset data_{43, 2, 8, kBuckets, kBucketOf};
};

TEST_F(BucketedLoaderTest, EveryGlobalBatchIsOfOneBucketAndAnEpochTakesEachSampleOnce) {
  const int G = 4;
  DataLoader loader(data_, Options(5, G));
  // 22 → 20, 14 → 12, 7 → 4: the remainders stay out of the epoch.
  EXPECT_EQ(loader.epoch_samples(), 36);
  std::map<int, int> batches_of_bucket;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t first = epoch * 36; first < (epoch + 1) * 36; first += G) {
      const int bucket = data_.BucketOf(loader.IndexOf(first));
      ++batches_of_bucket[bucket];
      for (int64_t n = first; n < first + G; ++n) {
        EXPECT_EQ(data_.BucketOf(loader.IndexOf(n)), bucket) << n;
        EXPECT_EQ(loader.SizeOf(n), kBuckets[bucket]) << n;
        EXPECT_TRUE(seen.insert(loader.IndexOf(n)).second) << "sample " << n << " twice";
      }
    }
    EXPECT_EQ(seen.size(), 36u);
  }
  EXPECT_EQ(batches_of_bucket, (std::map<int, int>{{0, 15}, {1, 9}, {2, 3}}));
}

TEST_F(BucketedLoaderTest, TheOrderIsTheSeedsAndEachEpochsOwn) {
  DataLoader a(data_, Options(5, 4)), b(data_, Options(5, 4)), other(data_, Options(6, 4));
  std::vector<int64_t> first_epoch, second_epoch, again, other_seed;
  for (int64_t n = 0; n < 36; ++n) {
    first_epoch.push_back(a.IndexOf(n));
    second_epoch.push_back(a.IndexOf(36 + n));
    again.push_back(b.IndexOf(n));
    other_seed.push_back(other.IndexOf(n));
  }
  EXPECT_EQ(first_epoch, again);
  EXPECT_NE(first_epoch, second_epoch);
  EXPECT_NE(first_epoch, other_seed);
  // The batches' buckets are shuffled too, not bucket after bucket.
  std::vector<int> buckets;
  for (int64_t n = 0; n < 36; n += 4)
    buckets.push_back(data_.BucketOf(a.IndexOf(n)));
  EXPECT_FALSE(std::is_sorted(buckets.begin(), buckets.end()));
}

TEST_F(BucketedLoaderTest, WithoutShufflingTheBatchesFollowTheBucketsInOrder) {
  DataLoaderOptions o = Options(5, 4);
  o.shuffle = false;
  DataLoader loader(data_, o);
  std::vector<int64_t> order;
  for (int64_t n = 0; n < 36; ++n)
    order.push_back(loader.IndexOf(n));
  const std::vector<int64_t> head = {0, 3, 5, 6, 9, 11, 12, 15};
  EXPECT_TRUE(std::equal(head.begin(), head.end(), order.begin()));
  EXPECT_EQ(order[20], 1);  // bucket 1's first, after bucket 0's 20
  EXPECT_EQ(order[32], 2);  // bucket 2's first
  EXPECT_EQ(loader.IndexOf(36), 0);
}

// Data-parallel ranks fill their slices of one global batch, of one size, as the whole batch
// is filled; samples one after another, each of its bucket's size; flips mirror its rows.
TEST_F(BucketedLoaderTest, RanksFillTheirSlicesOfEachSize) {
  const int dp = 2, per_rank = 3;
  DataLoaderOptions whole_options = Options(9, dp * per_rank);
  whole_options.horizontal_flip = true;
  DataLoader whole(data_, whole_options);
  for (int64_t batch_first = 0; batch_first < 3 * whole.epoch_samples();
       batch_first += dp * per_rank) {
    const SampleSize size = whole.SizeOf(batch_first);
    const int64_t floats = 2 * size.area();
    std::vector<float> all(dp * per_rank * floats);
    std::vector<int32_t> labels(dp * per_rank);
    ASSERT_TRUE(whole.Fill(batch_first, dp * per_rank, all.data(), labels.data()).ok());
    for (int b = 0; b < dp * per_rank; ++b) {
      const std::vector<float> want = Sample(data_, whole.IndexOf(batch_first + b));
      const bool flipped = whole.IsFlipped(batch_first + b);
      for (int64_t k = 0; k < floats; ++k) {
        const int64_t x = k % size.width, source = flipped ? k - x + (size.width - 1 - x) : k;
        ASSERT_EQ(all[b * floats + k], want[source]) << batch_first << " " << b << " " << k;
      }
    }
    for (int r = 0; r < dp; ++r) {
      DataLoaderOptions o = Options(9, per_rank, dp, r);
      o.horizontal_flip = true;
      DataLoader rank(data_, o);
      std::vector<float> mine(per_rank * floats);
      std::vector<int32_t> my_labels(per_rank);
      ASSERT_TRUE(rank.FillRankBatch(batch_first, mine.data(), my_labels.data()).ok());
      EXPECT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + r * per_rank * floats))
          << batch_first << " rank " << r;
    }
  }
}

// What sample n is depends on (seed, n) only: a loader made anew at any global batch (a resumed
// run) continues the sequence, across epochs too.
TEST_F(BucketedLoaderTest, ResumingAtAnyBatchContinuesTheSameSequence) {
  DataLoader run(data_, Options(11, 4));
  std::vector<int64_t> whole;
  for (int64_t n = 0; n < 100; ++n)
    whole.push_back(run.IndexOf(n));
  for (int64_t k : {4, 32, 36, 40, 72}) {
    DataLoader resumed(data_, Options(11, 4));
    for (int64_t n = 99; n >= k; --n)  // backwards: no state carried from earlier samples
      ASSERT_EQ(resumed.IndexOf(n), whole[n]) << "resumed at " << k << ", sample " << n;
  }
}

TEST_F(BucketedLoaderTest, PrefetchGivesTheSameBatches) {
  DataLoaderOptions with = Options(3, 4), without = Options(3, 4);
  without.prefetch = false;
  DataLoader a(data_, with), b(data_, without);
  for (int64_t first = 0; first < 80; first += 4) {
    a.Prefetch(first, 4);
    const int64_t floats = 4 * 2 * a.SizeOf(first).area();
    std::vector<float> x(floats), y(floats);
    std::vector<int32_t> lx(4), ly(4);
    ASSERT_TRUE(a.Fill(first, 4, x.data(), lx.data()).ok());
    ASSERT_TRUE(b.Fill(first, 4, y.data(), ly.data()).ok());
    ASSERT_EQ(x, y) << first;
  }
}

const char kTinyUNet[] = R"({"name": "unet", "block_out_channels": [4, 8],
    "layers_per_block": 1, "attention_head_dim": 2, "cross_attention_dim": 8,
    "norm_num_groups": 2, "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "sample_size": 8,
    "text_length": 5})";

// Each step trains one bucket's batch at its size, and reports that size and the FLOPs of a
// sample of it (the model resized there), not the nominal size's.
TEST(BucketedTrainingTest, StepsReportTheirBucketsSizeAndFlops) {
  TrainConfig config;
  config.model = *ModelSpecFromJson("unet", Json::parse(kTinyUNet));
  config.global_batch = config.micro_batch = 4;
  config.steps = 12;
  Trainer trainer(config, std::make_unique<BucketedTestDataset>(43, 4, 8, kBuckets, kBucketOf));
  const ModelFamily& family = FamilyOf(config.model);
  const BucketedTestDataset data(43, 4, 8, kBuckets, kBucketOf);  // the trainer's samples
  DataLoader loader(data, Options(config.seed, 4));
  std::set<std::pair<int, int>> seen;
  for (int64_t step = 0; step < 12; ++step) {
    Result<StepStats> stats = trainer.Step();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    const SampleSize want = loader.SizeOf(4 * step);
    EXPECT_EQ(stats->sample_size, want) << step;
    EXPECT_TRUE(std::isfinite(stats->loss)) << step;
    const double flops = family.Cost(*family.Resized(config.model, want.height, want.width))
                             .training_flops_per_sample();
    EXPECT_EQ(stats->flops_per_sample, flops) << step;
    seen.insert({want.height, want.width});
  }
  EXPECT_EQ(seen.size(), 3u);  // every bucket's batches trained
  EXPECT_LT(
      FamilyOf(config.model).Cost(*family.Resized(config.model, 6, 10)).forward_macs_per_sample,
      FamilyOf(config.model).Cost(config.model).forward_macs_per_sample);
}

// train.epochs over buckets: an epoch is the whole global batches the buckets fill. Of 43
// samples, buckets of 22, 14 and 7 fill 5, 3 and 1 batches of 4: 36 samples, so 2 epochs are 18
// steps.
TEST_F(BucketedFolderTest, AnEpochOfBucketsIsTheirWholeGlobalBatches) {
  ASSERT_TRUE(WriteLatentFolder(BucketedTestDataset(43, 4, 8, kBuckets, kBucketOf), dir_, 8).ok());
  TrainConfig config;
  config.model = *ModelSpecFromJson("unet", Json::parse(kTinyUNet));
  config.global_batch = config.micro_batch = 4;
  config.data.kind = "latent_folder";
  config.data.path = dir_;
  config.epochs = 2;
  config.steps = 0;
  ASSERT_TRUE(Trainer::ResolveEpochs(config).ok());
  EXPECT_EQ(config.epoch_samples, 36);
  EXPECT_EQ(config.steps, 18);
}

// A bucket too small for a global batch is left out; with none large enough there is nothing to
// train on, and training says so. A family that trains at its own size only refuses buckets by
// name, and so does the GPU step.
TEST(BucketedTrainingTest, RefusesWhatCannotTrainOnBuckets) {
  const BucketedTestDataset data(43, 4, 8, kBuckets, kBucketOf);
  TrainConfig config;
  config.model = *ModelSpecFromJson("unet", Json::parse(kTinyUNet));
  config.global_batch = config.micro_batch = 8;
  EXPECT_TRUE(CheckBucketsFitTraining(data, config, "latent_folder").ok());

  config.global_batch = config.micro_batch = 23;
  Status refused = CheckBucketsFitTraining(data, config, "latent_folder");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("no aspect-ratio bucket of the latent_folder holds a global "
                                   "batch (batch.global 23)"),
            std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("the largest bucket holds 22 samples"), std::string::npos);

  config.global_batch = config.micro_batch = 8;
  config.device = "cuda";
  refused = CheckBucketsFitTraining(data, config, "latent_folder");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("train.device cuda does not take yet"), std::string::npos)
      << refused.message();

  // A UNet of two levels halves once: 10×7 latents cannot be halved.
  config.device = "cpu";
  const BucketedTestDataset odd(12, 4, 8, {{8, 8}, {10, 7}}, {0, 1});
  refused = CheckBucketsFitTraining(odd, config, "latent_folder");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("latent_folder bucket 1 (10x7 latents, 6 samples)"),
            std::string::npos)
      << refused.message();

  config.model = *ModelSpecFromRequest({.name = "DiT-S/2", .input_size = 8});
  refused = CheckBucketsFitTraining(data, config, "latent_folder");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("the dit family runs at its model's size only"),
            std::string::npos)
      << refused.message();
}

}  // namespace
}  // namespace difftrain
