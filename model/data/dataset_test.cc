#include "model/data/dataset.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

// A bounded dataset of `n` samples whose single value is the index.
class Numbered : public Dataset {
 public:
  explicit Numbered(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int channels() const override { return 1; }
  int height() const override { return 1; }
  int width() const override { return 1; }
  int num_classes() const override { return 0; }
  Status Get(int64_t index, float* image, int32_t* label) const override {
    *image = static_cast<float>(index);
    *label = 0;
    return Status::Ok();
  }

 private:
  int64_t n_;
};

std::vector<int64_t> Chosen(int64_t n, int64_t count, uint64_t seed) {
  std::unique_ptr<Dataset> subset = TakeSubset(std::make_unique<Numbered>(n), count, seed);
  std::vector<int64_t> values;
  for (int64_t i = 0; i < subset->size(); ++i) {
    float v = 0;
    int32_t label = 0;
    EXPECT_TRUE(subset->Get(i, &v, &label).ok());
    values.push_back(static_cast<int64_t>(v));
  }
  return values;
}

TEST(TakeSubsetTest, DrawsDistinctIndicesInOrderFromTheSeed) {
  const std::vector<int64_t> a = Chosen(1000, 50, 3);
  ASSERT_EQ(a.size(), 50u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());  // distinct
  EXPECT_EQ(Chosen(1000, 50, 3), a);                           // the seed's
  EXPECT_NE(Chosen(1000, 50, 4), a);
  // Spread over the whole dataset, not its first samples (a folder sorted by class).
  EXPECT_GT(a.back(), 500);
  EXPECT_LT(a.front(), 500);
}

TEST(TakeSubsetTest, AllOfASmallerDatasetAndThePrefixOfAnUnboundedOne) {
  auto small = std::make_unique<Numbered>(10);
  const Dataset* raw = small.get();
  EXPECT_EQ(TakeSubset(std::move(small), 10, 0).get(), raw);  // itself
  std::unique_ptr<Dataset> prefix =
      TakeSubset(std::make_unique<SyntheticDataset>(1, 2, 4, 10), 6, 0);
  EXPECT_EQ(prefix->size(), 6);
  const SyntheticDataset synthetic(1, 2, 4, 10);
  std::vector<float> got(32), want(32);
  int32_t label_got = 0, label_want = 0;
  ASSERT_TRUE(prefix->Get(5, got.data(), &label_got).ok());
  ASSERT_TRUE(synthetic.Get(5, want.data(), &label_want).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(label_got, label_want);
}

}  // namespace
}  // namespace difftrain
