#include "model/data/loader.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "model/tensor/rng.h"

namespace difftrain {
namespace {

// Sample i is C×H×W values i·1000 + k (k the position in the sample), label i mod 7: the
// index of a filled sample can be read back from it.
class IndexDataset : public Dataset {
 public:
  IndexDataset(int64_t size, int C = 2, int H = 3, int W = 4) : size_(size), C_(C), H_(H), W_(W) {}
  int64_t size() const override { return size_; }
  int channels() const override { return C_; }
  int height() const override { return H_; }
  int width() const override { return W_; }
  int num_classes() const override { return 7; }
  Status Get(int64_t index, float* image, int32_t* label) const override {
    if (index == fail_at_) return Errorf("sample {} is unreadable", index);
    for (int64_t k = 0; k < sample_floats(); ++k)
      image[k] = static_cast<float>(index * 1000 + k);
    *label = static_cast<int32_t>(index % 7);
    return Status::Ok();
  }
  int64_t fail_at_ = -1;

 private:
  int64_t size_;
  int C_, H_, W_;
};

struct Filled {
  std::vector<float> images;
  std::vector<int32_t> labels;
  bool operator==(const Filled&) const = default;
};

Filled Fill(DataLoader& loader, int64_t first, int count) {
  Filled out;
  out.images.resize(count * loader.dataset().sample_floats());
  out.labels.resize(count);
  Status status = loader.Fill(first, count, out.images.data(), out.labels.data());
  EXPECT_TRUE(status.ok()) << status.message();
  return out;
}

std::vector<int64_t> Indices(const DataLoader& loader, int64_t first, int64_t count) {
  std::vector<int64_t> indices;
  for (int64_t n = first; n < first + count; ++n)
    indices.push_back(loader.IndexOf(n));
  return indices;
}

DataLoaderOptions Options(uint64_t seed = 7, int batch = 4) {
  DataLoaderOptions options;
  options.seed = seed;
  options.batch_size = batch;
  return options;
}

TEST(DataLoaderTest, SameSeedSameOrderOtherSeedOtherOrder) {
  IndexDataset data(100);
  DataLoader a(data, Options(7)), b(data, Options(7)), c(data, Options(8));
  EXPECT_EQ(Indices(a, 0, 300), Indices(b, 0, 300));
  EXPECT_NE(Indices(a, 0, 100), Indices(c, 0, 100));
  EXPECT_EQ(Fill(a, 13, 50), Fill(b, 13, 50));
}

TEST(DataLoaderTest, EveryEpochIsADifferentPermutation) {
  IndexDataset data(97);
  DataLoader loader(data, Options());
  std::vector<int64_t> identity(97);
  std::iota(identity.begin(), identity.end(), 0);
  std::set<std::vector<int64_t>> orders;
  for (int epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> order = Indices(loader, epoch * 97, 97);
    orders.insert(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, identity) << "epoch " << epoch;
  }
  EXPECT_EQ(orders.size(), 4u);
  EXPECT_EQ(orders.count(identity), 0u);
}

// The documented rule, written out: Fisher–Yates from Rng(seed, kData, epoch). Checkpoints
// resume by sample count, so this must never change.
TEST(DataLoaderTest, PermutationIsFisherYatesOfTheDataStream) {
  IndexDataset data(10);
  DataLoader loader(data, Options(42));
  for (int64_t epoch : {0, 1, 5}) {
    std::vector<int64_t> expected(10);
    std::iota(expected.begin(), expected.end(), 0);
    Rng rng(42, RngStream::kData, epoch);
    for (int64_t i = 9; i > 0; --i)
      std::swap(expected[i], expected[rng.Below(i + 1)]);
    EXPECT_EQ(Indices(loader, epoch * 10, 10), expected) << "epoch " << epoch;
  }
}

TEST(DataLoaderTest, WithoutShuffleIndexIsPositionInEpoch) {
  IndexDataset data(10);
  DataLoaderOptions options = Options();
  options.shuffle = false;
  DataLoader loader(data, options);
  for (int64_t n = 0; n < 35; ++n)
    EXPECT_EQ(loader.IndexOf(n), n % 10);
}

TEST(DataLoaderTest, UnboundedDatasetIsNotShuffled) {
  SyntheticDataset data(3, 1, 2, 10);
  DataLoader loader(data, Options());
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{1} << 40})
    EXPECT_EQ(loader.IndexOf(n), n);
  Filled filled = Fill(loader, 5, 2);
  std::vector<float> image(4);
  int32_t label;
  ASSERT_TRUE(data.Get(6, image.data(), &label).ok());
  EXPECT_EQ(std::vector<float>(filled.images.begin() + 4, filled.images.end()), image);
  EXPECT_EQ(filled.labels[1], label);
}

TEST(DataLoaderTest, FillWritesTheSamplesOfTheIndices) {
  IndexDataset data(30);
  DataLoader loader(data, Options());
  const Filled filled = Fill(loader, 40, 8);
  const int64_t floats = data.sample_floats();
  for (int b = 0; b < 8; ++b) {
    const int64_t index = loader.IndexOf(40 + b);
    EXPECT_EQ(filled.images[b * floats], index * 1000.0f);
    EXPECT_EQ(filled.images[b * floats + floats - 1], index * 1000.0f + floats - 1);
    EXPECT_EQ(filled.labels[b], index % 7);
  }
}

TEST(DataLoaderTest, RangeAcrossAnEpochBoundary) {
  IndexDataset data(10);
  DataLoader loader(data, Options());
  std::vector<int64_t> expected = Indices(loader, 7, 3);     // end of epoch 0
  const std::vector<int64_t> next = Indices(loader, 10, 3);  // start of epoch 1
  expected.insert(expected.end(), next.begin(), next.end());
  const Filled filled = Fill(loader, 7, 6);
  for (int b = 0; b < 6; ++b)
    EXPECT_EQ(filled.images[b * data.sample_floats()], expected[b] * 1000.0f) << b;
}

TEST(DataLoaderTest, DataParallelRanksSplitTheGlobalBatch) {
  IndexDataset data(50);
  const int dp = 4, batch = 3;
  DataLoaderOptions options = Options(7, batch);
  options.dp_size = dp;
  DataLoader whole(data, Options(7, batch * dp));
  const int64_t floats = data.sample_floats();
  for (int64_t batch_first : {int64_t{0}, int64_t{36}, int64_t{48}}) {  // 48: across epochs
    const Filled global = Fill(whole, batch_first, batch * dp);
    std::multiset<int64_t> seen;
    for (int r = 0; r < dp; ++r) {
      options.dp_rank = r;
      DataLoader rank(data, options);
      EXPECT_EQ(rank.global_batch(), batch * dp);
      Filled mine{std::vector<float>(batch * floats), std::vector<int32_t>(batch)};
      ASSERT_TRUE(rank.FillRankBatch(batch_first, mine.images.data(), mine.labels.data()).ok());
      EXPECT_TRUE(std::equal(mine.images.begin(), mine.images.end(),
                             global.images.begin() + r * batch * floats));
      for (int64_t n = rank.RankFirstSample(batch_first);
           n < rank.RankFirstSample(batch_first) + batch; ++n)
        seen.insert(rank.IndexOf(n));
    }
    const std::vector<int64_t> all = Indices(whole, batch_first, batch * dp);
    EXPECT_EQ(seen, std::multiset<int64_t>(all.begin(), all.end()));
    EXPECT_EQ(seen.size(), static_cast<size_t>(batch * dp));
  }
}

TEST(DataLoaderTest, ResumingAtSampleKContinuesTheSameSequence) {
  IndexDataset data(23);
  DataLoader first_run(data, Options());
  const Filled from_start = Fill(first_run, 0, 60);
  for (int k : {1, 22, 23, 37}) {
    DataLoader resumed(data, Options());
    const Filled tail = Fill(resumed, k, 60 - k);
    const int64_t floats = data.sample_floats();
    EXPECT_TRUE(
        std::equal(tail.images.begin(), tail.images.end(), from_start.images.begin() + k * floats))
        << k;
    EXPECT_TRUE(std::equal(tail.labels.begin(), tail.labels.end(), from_start.labels.begin() + k))
        << k;
  }
}

TEST(DataLoaderTest, PrefetchGivesTheSameBatches) {
  IndexDataset data(37);
  DataLoaderOptions with = Options(9, 5), without = Options(9, 5);
  with.horizontal_flip = without.horizontal_flip = true;
  without.prefetch = false;
  DataLoader prefetching(data, with), synchronous(data, without);
  const int64_t floats = data.sample_floats();
  Filled a{std::vector<float>(5 * floats), std::vector<int32_t>(5)}, b = a;
  for (int64_t step = 0; step < 40; ++step) {
    ASSERT_TRUE(prefetching.FillRankBatch(step * 5, a.images.data(), a.labels.data()).ok());
    ASSERT_TRUE(synchronous.FillRankBatch(step * 5, b.images.data(), b.labels.data()).ok());
    ASSERT_EQ(a, b) << "step " << step;
  }
}

TEST(DataLoaderTest, FillIgnoresAPrefetchOfAnotherRange) {
  IndexDataset data(37);
  DataLoaderOptions without = Options();
  without.prefetch = false;
  DataLoader prefetching(data, Options()), synchronous(data, without);
  prefetching.Prefetch(10, 4);
  EXPECT_EQ(Fill(prefetching, 11, 4), Fill(synchronous, 11, 4));
  EXPECT_EQ(Fill(prefetching, 10, 4), Fill(synchronous, 10, 4));
  prefetching.Prefetch(3, 2);
  prefetching.Prefetch(50, 6);  // replaces the request or follows it
  EXPECT_EQ(Fill(prefetching, 50, 6), Fill(synchronous, 50, 6));
  EXPECT_EQ(Fill(prefetching, 3, 2), Fill(synchronous, 3, 2));
}

TEST(DataLoaderTest, FlipsAreDeterministicAndMirrorRows) {
  IndexDataset data(20);
  DataLoaderOptions options = Options(5);
  options.horizontal_flip = true;
  DataLoader a(data, options), b(data, options);
  int flipped = 0;
  for (int64_t n = 0; n < 10000; ++n) {
    ASSERT_EQ(a.IsFlipped(n), b.IsFlipped(n));
    flipped += a.IsFlipped(n);
  }
  EXPECT_NEAR(flipped, 5000, 250);

  options.horizontal_flip = false;
  DataLoader plain(data, options);
  const int W = data.width();
  const int64_t floats = data.sample_floats();
  const Filled mirrored = Fill(a, 0, 20), straight = Fill(plain, 0, 20);
  for (int64_t n = 0; n < 20; ++n) {
    EXPECT_FALSE(plain.IsFlipped(n));
    for (int64_t k = 0; k < floats; ++k) {
      const int64_t x = k % W, source = a.IsFlipped(n) ? k - x + (W - 1 - x) : k;
      ASSERT_EQ(mirrored.images[n * floats + k], straight.images[n * floats + source])
          << n << " " << k;
    }
  }
  EXPECT_EQ(mirrored.labels, straight.labels);
}

TEST(DataLoaderTest, ReadErrorsNameTheSample) {
  IndexDataset data(10);
  data.fail_at_ = 4;
  DataLoaderOptions options = Options();
  options.shuffle = false;
  for (bool prefetch : {false, true}) {
    options.prefetch = prefetch;
    DataLoader loader(data, options);
    std::vector<float> images(3 * data.sample_floats());
    std::vector<int32_t> labels(3);
    loader.Prefetch(13, 3);
    Status status = loader.Fill(13, 3, images.data(), labels.data());
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.message(), "reading sample 14 (dataset index 4): sample 4 is unreadable");
  }
}

}  // namespace
}  // namespace difftrain
