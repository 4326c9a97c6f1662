// The parallel topology: how a job's world of ranks splits into tensor (tp), context (cp),
// data (dp) and pipeline (pp) parallel groups. This is the one owner of that split; the
// controller, the ranks and the CLI all ask it, so they can never disagree.
//
// The layout is Megatron-Core's (RankGenerator in megatron/core/parallel_state.py), so a
// checkpoint or a profile taken with Megatron maps rank for rank onto ours. An order string
// such as "tp-cp-dp-pp" lists the four axes, the first varying fastest across global ranks:
//
//   global = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank))      (order tp-cp-dp-pp)
//
// A group token names one or more axes joined by '-' ("tp", "dp-cp", "tp-pp"). The ranks of
// one group share their coordinates on every other axis and vary over the named ones. See
// docs/parallelism.md.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace difftrain {

inline constexpr std::string_view kDefaultParallelOrder = "tp-cp-dp-pp";

// The group tokens every job builds communicators for, in the order `difftrain topology`
// prints them.
inline constexpr std::array<std::string_view, 7> kParallelGroupTokens = {
    "tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp"};

// A rank's position along each parallel axis.
struct ParallelCoordinates {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;

  bool operator==(const ParallelCoordinates&) const = default;
};

// Groups of global ranks, as Megatron's RankGenerator.get_ranks returns them.
using RankGroups = std::vector<std::vector<int>>;

// The group one rank belongs to for one token, and where the rank sits in it.
struct RankGroup {
  std::vector<int> ranks;
  int group_index = 0;    // position of `ranks` in GetRanks(token)
  int rank_in_group = 0;  // position of the rank in `ranks`
};

class Topology {
 public:
  // Fails when a size is below 1, the world does not fit in an int, or `order` is not a
  // '-'-joined permutation of tp, cp, dp and pp.
  static Result<Topology> Create(int tp, int cp, int dp, int pp,
                                 std::string_view order = kDefaultParallelOrder);

  int tp() const { return sizes_[0]; }
  int cp() const { return sizes_[1]; }
  int dp() const { return sizes_[2]; }
  int pp() const { return sizes_[3]; }
  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }

  // Every group for `token`, with Megatron's membership and member order. Fails on a token
  // that is not a '-'-joined set of distinct axes.
  Result<RankGroups> GetRanks(std::string_view token) const;

  // The group `rank` belongs to for `token`. Fails on a bad token or a rank outside
  // [0, world_size), since ranks often come from a command line or a job spec.
  Result<RankGroup> GroupOf(int rank, std::string_view token) const;

  // Global rank <-> coordinates. Callers pass a rank below world_size and coordinates below
  // the sizes; anything else is a programming error and fails fast.
  ParallelCoordinates CoordinatesOf(int rank) const;
  int RankOf(const ParallelCoordinates& coordinates) const;

 private:
  Topology(std::array<int, 4> sizes, std::array<int, 4> order_axes, std::string order);

  std::array<int, 4> sizes_;       // indexed by axis: 0 tp, 1 cp, 2 dp, 3 pp
  std::array<int, 4> order_axes_;  // the axes of `order_`, fastest-varying first
  int world_size_;
  std::string order_;
};

}  // namespace difftrain
