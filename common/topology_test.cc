#include "common/topology.h"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

namespace difftrain {
namespace {

constexpr std::array<std::string_view, 4> kAxes = {"tp", "cp", "dp", "pp"};

Topology MakeTopology(int tp, int cp, int dp, int pp,
                      std::string_view order = kDefaultParallelOrder) {
  Result<Topology> topology = Topology::Create(tp, cp, dp, pp, order);
  EXPECT_TRUE(topology.ok()) << topology.status().message();
  return std::move(topology).value();
}

RankGroups Ranks(const Topology& topology, std::string_view token) {
  Result<RankGroups> groups = topology.GetRanks(token);
  EXPECT_TRUE(groups.ok()) << groups.status().message();
  return groups.ok() ? std::move(groups).value() : RankGroups{};
}

// All 24 orders of the four axes.
std::vector<std::string> AllOrders() {
  std::vector<std::string> axes = {"cp", "dp", "pp", "tp"};
  std::vector<std::string> orders;
  do {
    orders.push_back(axes[0] + "-" + axes[1] + "-" + axes[2] + "-" + axes[3]);
  } while (std::next_permutation(axes.begin(), axes.end()));
  return orders;
}

// A group token and the axes it names, as bits: 1 tp, 2 cp, 4 dp, 8 pp.
struct Token {
  std::string name;
  int axes;
  bool Names(int axis) const { return (axes & (1 << axis)) != 0; }
};

// The 15 non-empty sets of axes, each named in tp-cp-dp-pp order.
std::vector<Token> AllTokens() {
  std::vector<Token> tokens;
  for (int bits = 1; bits < 16; ++bits) {
    std::vector<std::string_view> names;
    for (int axis = 0; axis < 4; ++axis) {
      if (bits & (1 << axis)) names.push_back(kAxes[axis]);
    }
    tokens.push_back({fmt::format("{}", fmt::join(names, "-")), bits});
  }
  return tokens;
}

// Coordinates by axis index (0 tp, 1 cp, 2 dp, 3 pp); sizes travel in the same struct.
int Coordinate(const ParallelCoordinates& coordinates, int axis) {
  return std::array<int, 4>{coordinates.tp, coordinates.cp, coordinates.dp, coordinates.pp}[axis];
}

// Sizes of the sweeps, one field per axis.
const std::vector<ParallelCoordinates> kSizes = {{1, 1, 1, 1}, {2, 2, 2, 2}, {2, 3, 1, 2},
                                                 {4, 1, 3, 2}, {3, 2, 5, 1}, {1, 4, 2, 3}};

// The example of docs/parallelism.md: tp = cp = dp = pp = 2, default order.
class DefaultOrderTest : public ::testing::Test {
 protected:
  Topology topology_ = MakeTopology(2, 2, 2, 2);
};

TEST_F(DefaultOrderTest, Sizes) {
  EXPECT_EQ(topology_.world_size(), 16);
  EXPECT_EQ(topology_.order(), "tp-cp-dp-pp");
}

TEST_F(DefaultOrderTest, TensorParallelGroups) {
  EXPECT_EQ(Ranks(topology_, "tp"),
            (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
}

TEST_F(DefaultOrderTest, ContextParallelGroups) {
  EXPECT_EQ(Ranks(topology_, "cp"),
            (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
}

TEST_F(DefaultOrderTest, DataParallelGroups) {
  EXPECT_EQ(Ranks(topology_, "dp"),
            (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
}

TEST_F(DefaultOrderTest, PipelineParallelGroups) {
  EXPECT_EQ(Ranks(topology_, "pp"),
            (RankGroups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
}

TEST_F(DefaultOrderTest, CombinedGroups) {
  EXPECT_EQ(Ranks(topology_, "dp-cp"),
            (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(Ranks(topology_, "tp-cp"),
            (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(Ranks(topology_, "tp-pp"),
            (RankGroups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
}

// Megatron maps a token to a set of axes: members follow the topology's order either way.
TEST_F(DefaultOrderTest, TokenOrderDoesNotMatter) {
  EXPECT_EQ(Ranks(topology_, "cp-dp"), Ranks(topology_, "dp-cp"));
  EXPECT_EQ(Ranks(topology_, "pp-tp"), Ranks(topology_, "tp-pp"));
  EXPECT_EQ(Ranks(topology_, "pp-dp-cp-tp"),
            (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}));
}

TEST_F(DefaultOrderTest, RankLayoutFormula) {
  for (int rank = 0; rank < 16; ++rank) {
    const ParallelCoordinates c = topology_.CoordinatesOf(rank);
    EXPECT_EQ(rank, c.tp + 2 * (c.cp + 2 * (c.dp + 2 * c.pp))) << rank;
  }
  EXPECT_EQ(topology_.CoordinatesOf(13), (ParallelCoordinates{.tp = 1, .cp = 0, .dp = 1, .pp = 1}));
}

// The examples in the docstring of Megatron's generate_masked_orthogonal_rank_groups. Megatron
// leaves cp out of those orders; a size-1 axis does not move any rank wherever it sits.
TEST(MegatronDocstringTest, DataParallelGroupsOfTpPpDp) {
  EXPECT_EQ(Ranks(MakeTopology(2, 1, 2, 2, "tp-pp-dp-cp"), "dp"),
            (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(MegatronDocstringTest, DataParallelGroupsOfTpDpPp) {
  const RankGroups groups = Ranks(MakeTopology(2, 1, 3, 4, "tp-dp-pp-cp"), "dp");
  ASSERT_EQ(groups.size(), 8u);
  EXPECT_EQ(groups[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(groups[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(groups[7], (std::vector<int>{19, 21, 23}));
}

// tp-dp-cp-pp with all sizes 2: strides tp 1, dp 2, cp 4, pp 8 (derived by hand).
TEST(NonDefaultOrderTest, TpDpCpPp) {
  const Topology topology = MakeTopology(2, 2, 2, 2, "tp-dp-cp-pp");
  EXPECT_EQ(Ranks(topology, "tp"),
            (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(Ranks(topology, "dp"),
            (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(Ranks(topology, "cp"),
            (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(Ranks(topology, "pp"),
            (RankGroups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(Ranks(topology, "dp-cp"),
            (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(Ranks(topology, "tp-cp"),
            (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}));
  EXPECT_EQ(Ranks(topology, "tp-pp"),
            (RankGroups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(topology.CoordinatesOf(6), (ParallelCoordinates{.tp = 0, .cp = 1, .dp = 1, .pp = 0}));
}

// pp-dp-cp-tp with tp 2, cp 1, dp 3, pp 2: strides pp 1, dp 2, cp 6, tp 6 (derived by hand).
// Unequal sizes catch a swapped size or stride that the all-2 examples cannot.
TEST(NonDefaultOrderTest, PpDpCpTpUnequalSizes) {
  const Topology topology = MakeTopology(2, 1, 3, 2, "pp-dp-cp-tp");
  EXPECT_EQ(Ranks(topology, "tp"), (RankGroups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(Ranks(topology, "cp"),
            (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}}));
  EXPECT_EQ(Ranks(topology, "dp"), (RankGroups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(Ranks(topology, "pp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(Ranks(topology, "dp-cp"), (RankGroups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(Ranks(topology, "tp-cp"),
            (RankGroups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(Ranks(topology, "tp-pp"), (RankGroups{{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5, 10, 11}}));
  EXPECT_EQ(topology.CoordinatesOf(7), (ParallelCoordinates{.tp = 1, .cp = 0, .dp = 0, .pp = 1}));
}

// For every size, order and token: the groups partition the world, each group has the size of
// its axes, and its members agree on every axis the token does not name.
TEST(PropertyTest, GroupsPartitionTheWorld) {
  for (const ParallelCoordinates& s : kSizes) {
    for (const std::string& order : AllOrders()) {
      const Topology topology = MakeTopology(s.tp, s.cp, s.dp, s.pp, order);
      for (const Token& token : AllTokens()) {
        SCOPED_TRACE(fmt::format("{}x{}x{}x{} {} {}", s.tp, s.cp, s.dp, s.pp, order, token.name));
        int group_size = 1;
        for (int axis = 0; axis < 4; ++axis) {
          if (token.Names(axis)) group_size *= Coordinate(s, axis);
        }
        const RankGroups groups = Ranks(topology, token.name);
        EXPECT_EQ(static_cast<int>(groups.size()), topology.world_size() / group_size);
        std::vector<int> seen(topology.world_size(), 0);
        for (const std::vector<int>& group : groups) {
          ASSERT_EQ(static_cast<int>(group.size()), group_size);
          const ParallelCoordinates first = topology.CoordinatesOf(group[0]);
          for (int rank : group) {
            ++seen[rank];
            for (int axis = 0; axis < 4; ++axis) {
              if (token.Names(axis)) continue;
              EXPECT_EQ(Coordinate(topology.CoordinatesOf(rank), axis), Coordinate(first, axis));
            }
          }
        }
        EXPECT_EQ(seen, std::vector<int>(topology.world_size(), 1));
      }
    }
  }
}

TEST(PropertyTest, CoordinatesRoundTrip) {
  for (const ParallelCoordinates& s : kSizes) {
    for (const std::string& order : AllOrders()) {
      const Topology topology = MakeTopology(s.tp, s.cp, s.dp, s.pp, order);
      for (int rank = 0; rank < topology.world_size(); ++rank) {
        const ParallelCoordinates c = topology.CoordinatesOf(rank);
        EXPECT_TRUE(c.tp < s.tp && c.cp < s.cp && c.dp < s.dp && c.pp < s.pp) << rank;
        EXPECT_EQ(topology.RankOf(c), rank) << order;
      }
    }
  }
}

// A rank's position in a one-axis group is its coordinate on that axis, as Megatron's
// get_tensor_model_parallel_rank and friends report it.
TEST(PropertyTest, GroupOfAgreesWithGetRanks) {
  for (const ParallelCoordinates& s : kSizes) {
    for (const std::string& order : AllOrders()) {
      const Topology topology = MakeTopology(s.tp, s.cp, s.dp, s.pp, order);
      for (const Token& token : AllTokens()) {
        const RankGroups groups = Ranks(topology, token.name);
        for (int rank = 0; rank < topology.world_size(); ++rank) {
          Result<RankGroup> group = topology.GroupOf(rank, token.name);
          ASSERT_TRUE(group.ok()) << group.status().message();
          EXPECT_EQ(group->ranks, groups[group->group_index]);
          EXPECT_EQ(group->ranks[group->rank_in_group], rank);
          if (std::has_single_bit(static_cast<unsigned>(token.axes))) {
            const int axis = std::countr_zero(static_cast<unsigned>(token.axes));
            EXPECT_EQ(group->rank_in_group, Coordinate(topology.CoordinatesOf(rank), axis));
          }
        }
      }
    }
  }
}

TEST(TopologyErrorTest, SizesBelowOne) {
  EXPECT_EQ(Topology::Create(0, 1, 1, 1).status().message(), "--tp must be >= 1, got 0");
  EXPECT_EQ(Topology::Create(1, -2, 1, 1).status().message(), "--cp must be >= 1, got -2");
  EXPECT_EQ(Topology::Create(1, 1, 0, 1).status().message(), "--dp must be >= 1, got 0");
  EXPECT_EQ(Topology::Create(1, 1, 1, 0).status().message(), "--pp must be >= 1, got 0");
}

TEST(TopologyErrorTest, WorldTooLarge) {
  const Status status = Topology::Create(65536, 65536, 1, 1).status();
  EXPECT_EQ(status.message(),
            "world size tp·cp·dp·pp = 65536·65536·1·1 is more than 2147483647 ranks");
}

TEST(TopologyErrorTest, OrderNotAPermutation) {
  for (std::string_view order : {"tp-dp-pp", "tp-cp-dp-pp-tp", "tp-cp-dp-dp", "tp-cp-ep-dp-pp",
                                 "tp-cp-dp-xx", "", "tp-cp-dp-pp-", "TP-CP-DP-PP"}) {
    EXPECT_EQ(Topology::Create(1, 1, 1, 1, order).status().message(),
              fmt::format("order '{}' must name each of tp, cp, dp, pp exactly once", order));
  }
}

TEST(TopologyErrorTest, BadGroupTokens) {
  const Topology topology = MakeTopology(2, 2, 2, 2);
  EXPECT_EQ(topology.GetRanks("ep").status().message(),
            "group token 'ep': 'ep' is not one of tp, cp, dp, pp");
  EXPECT_EQ(topology.GetRanks("tp-").status().message(),
            "group token 'tp-': '' is not one of tp, cp, dp, pp");
  EXPECT_EQ(topology.GetRanks("").status().message(),
            "group token '': '' is not one of tp, cp, dp, pp");
  EXPECT_EQ(topology.GetRanks("dp-tp-dp").status().message(),
            "group token 'dp-tp-dp': 'dp' appears twice");
  EXPECT_FALSE(topology.GroupOf(0, "xy").ok());
}

TEST(TopologyErrorTest, GroupOfRankOutsideWorld) {
  const Topology topology = MakeTopology(2, 2, 2, 2);
  EXPECT_EQ(topology.GroupOf(16, "tp").status().message(),
            "rank 16 is outside the world of 16 ranks");
  EXPECT_FALSE(topology.GroupOf(-1, "tp").ok());
}

TEST(TopologyDeathTest, CoordinatesOfRankOutsideWorld) {
  const Topology topology = MakeTopology(2, 1, 1, 1);
  EXPECT_DEATH(topology.CoordinatesOf(2), "rank 2 outside world of 2");
  EXPECT_DEATH(topology.RankOf({.tp = 2}), "tp coordinate 2 outside size 2");
}

}  // namespace
}  // namespace difftrain
