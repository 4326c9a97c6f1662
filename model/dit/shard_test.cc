// A layout's shards tile the whole model: every element of a tensor split over tp belongs
// to exactly one rank of each stage's tp group, every replicated element to all of them,
// and scattering the whole arena into every shard and gathering it back reproduces it.
#include "model/dit/shard.h"

#include <algorithm>
#include <cstring>

#include <gtest/gtest.h>

#include "model/dit/dit.h"

namespace difftrain {
namespace {

DiTConfig Tiny() {
  DiTConfig c;
  c.input_size = 8;
  c.patch_size = 2;
  c.hidden_size = 32;
  c.depth = 5;
  c.num_heads = 4;
  c.num_classes = 10;
  return c;
}

TEST(DiTShardTest, ShardsTileTheWholeModel) {
  const DiTConfig c = Tiny();
  const size_t n = ShardParameters(c, DiTShard::Whole(c)).table.total();
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3}) {
      std::vector<int> held(n, 0);        // how many ranks hold each element
      std::vector<int> split_held(n, 0);  // of those, ranks holding it as a split tensor
      for (int stage = 0; stage < pp; ++stage) {
        for (int r = 0; r < tp; ++r) {
          const DiTShard s = *DiTShard::Create(c, tp, r, 1, 0, pp, stage);
          const ShardedParameters p = ShardParameters(c, s);
          size_t covered = 0;
          for (const Fragment& f : p.fragments) {
            ASSERT_EQ(f.local, covered) << "fragments are in local order, without gaps";
            covered += f.length;
            for (size_t i = 0; i < f.length; ++i)
              ++held[f.global + i];
          }
          EXPECT_EQ(covered, p.table.total());
          for (size_t k = 0; k < p.table.tensors().size(); ++k) {
            if (!p.split[k]) continue;
            const TensorSpec& t = p.table.tensors()[k];
            for (const Fragment& f : p.fragments) {
              if (f.local >= t.offset && f.local < t.offset + t.numel) {
                for (size_t i = 0; i < f.length; ++i)
                  ++split_held[f.global + i];
              }
            }
          }
        }
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(held[i], split_held[i] > 0 ? 1 : tp) << "tp " << tp << " pp " << pp << " @" << i;
      }
    }
  }
}

TEST(DiTShardTest, ScatterAndGatherOfEveryShardIsTheWholeModel) {
  const DiTConfig c = Tiny();
  DiT whole(c);
  whole.InitializeRandom(5);
  std::vector<float> gathered(whole.num_params(), 0.0f);
  for (int stage = 0; stage < 2; ++stage) {
    for (int r = 0; r < 2; ++r) {
      const ShardedParameters p = ShardParameters(c, *DiTShard::Create(c, 2, r, 1, 0, 2, stage));
      std::vector<float> local(p.table.total());
      for (const Fragment& f : p.fragments)
        std::copy_n(whole.params() + f.global, f.length, local.data() + f.local);
      for (const Fragment& f : p.fragments)
        std::copy_n(local.data() + f.local, f.length, gathered.data() + f.global);
    }
  }
  EXPECT_EQ(0, std::memcmp(gathered.data(), whole.params(), gathered.size() * sizeof(float)));
}

TEST(DiTShardTest, BalancedStagesGiveTheRemainderToTheLastStages) {
  const DiTConfig c = Tiny();  // depth 5
  std::vector<std::pair<int, int>> blocks;
  for (int stage = 0; stage < 3; ++stage) {
    const DiTShard s = *DiTShard::Create(c, 1, 0, 1, 0, 3, stage);
    blocks.emplace_back(s.first_block, s.end_block);
  }
  EXPECT_EQ(blocks, (std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {3, 5}}));
  const DiTShard custom = *DiTShard::Create(c, 1, 0, 1, 0, 2, 1, {4, 1});
  EXPECT_EQ(custom.first_block, 4);
  EXPECT_EQ(custom.end_block, 5);
}

TEST(DiTShardTest, LayoutsThatDoNotDivideAreClearErrors) {
  const DiTConfig c = Tiny();
  EXPECT_NE(
      ValidateParallelLayout(c, 3, 1, 1, {}).message().find("num_heads 4 is not divisible by tp 3"),
      std::string::npos);
  EXPECT_NE(ValidateParallelLayout(c, 1, 3, 1, {}).message().find("16 tokens"), std::string::npos);
  EXPECT_NE(ValidateParallelLayout(c, 1, 1, 6, {}).message().find("depth 5 is smaller than pp 6"),
            std::string::npos);
  EXPECT_NE(ValidateParallelLayout(c, 1, 1, 2, {2, 2}).message().find("add up to 4"),
            std::string::npos);
  EXPECT_TRUE(ValidateParallelLayout(c, 4, 2, 5, {}).ok());
}

}  // namespace
}  // namespace difftrain
