#include "common/topology.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "common/check.h"

namespace difftrain {
namespace {

constexpr std::array<std::string_view, 4> kAxisNames = {"tp", "cp", "dp", "pp"};

// The coordinate fields by axis index, so that loops over axes can read them.
constexpr std::array<int ParallelCoordinates::*, 4> kCoordinateFields = {
    &ParallelCoordinates::tp, &ParallelCoordinates::cp, &ParallelCoordinates::dp,
    &ParallelCoordinates::pp};

// Which axes a group token names, indexed by axis.
using AxisSet = std::array<bool, 4>;
constexpr AxisSet kAllAxes = {true, true, true, true};
// The axes of an order string, fastest-varying first.
using AxisOrder = std::array<int, 4>;

// One axis as it lies in the global rank: ranks one step apart on it are `stride` apart.
struct Axis {
  int axis;
  int size;
  int stride;
};

std::vector<std::string_view> SplitOnDash(std::string_view text) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t dash = text.find('-');
    parts.push_back(text.substr(0, dash));
    if (dash == std::string_view::npos) return parts;
    text.remove_prefix(dash + 1);
  }
}

std::optional<int> AxisNamed(std::string_view name) {
  for (int axis = 0; axis < 4; ++axis) {
    if (kAxisNames[axis] == name) return axis;
  }
  return std::nullopt;
}

// Parses '-'-joined axis names, each named at most once, in the order written. The order
// string and group tokens share this grammar.
Result<std::vector<int>> ParseAxes(std::string_view text) {
  std::vector<int> axes;
  AxisSet seen{};
  for (std::string_view name : SplitOnDash(text)) {
    const std::optional<int> axis = AxisNamed(name);
    if (!axis) return Errorf("'{}' is not one of tp, cp, dp, pp", name);
    if (seen[*axis]) return Errorf("'{}' appears twice", name);
    seen[*axis] = true;
    axes.push_back(*axis);
  }
  return axes;
}

Result<AxisOrder> ParseOrder(std::string_view order) {
  Result<std::vector<int>> axes = ParseAxes(order);
  if (!axes.ok() || axes->size() != 4) {
    return Errorf("order '{}' must name each of tp, cp, dp, pp exactly once", order);
  }
  return AxisOrder{(*axes)[0], (*axes)[1], (*axes)[2], (*axes)[3]};
}

// Megatron resolves a token to a set of axes, so "cp-dp" and "dp-cp" are the same group:
// member order always follows the topology's order, not the token's.
Result<AxisSet> ParseGroupToken(std::string_view token) {
  Result<std::vector<int>> axes = ParseAxes(token);
  if (!axes.ok()) return axes.status().WithContext(fmt::format("group token '{}'", token));
  AxisSet set{};
  for (int axis : *axes) {
    set[axis] = true;
  }
  return set;
}

// The axes of the order, fastest first, each with its stride in the global rank, split into
// those a group varies over (inner) and those that are fixed within a group (outer).
struct GroupAxes {
  std::vector<Axis> inner;
  std::vector<Axis> outer;
};

GroupAxes SplitAxes(const std::array<int, 4>& sizes, const AxisOrder& order_axes,
                    const AxisSet& group) {
  GroupAxes axes;
  int stride = 1;
  for (int axis : order_axes) {
    (group[axis] ? axes.inner : axes.outer).push_back({axis, sizes[axis], stride});
    stride *= sizes[axis];
  }
  return axes;
}

int Volume(const std::vector<Axis>& axes) {
  int volume = 1;
  for (const Axis& axis : axes) {
    volume *= axis.size;
  }
  return volume;
}

// Reads `index` as a mixed-radix number over `axes` (the first axis is the lowest digit) and
// returns the global-rank offset of the coordinates it spells.
int RankOffset(int index, const std::vector<Axis>& axes) {
  int offset = 0;
  for (const Axis& axis : axes) {
    offset += (index % axis.size) * axis.stride;
    index /= axis.size;
  }
  return offset;
}

// The inverse reading: a rank's coordinates on `axes` as one mixed-radix number.
int IndexAlong(const ParallelCoordinates& coordinates, const std::vector<Axis>& axes) {
  int index = 0;
  int radix = 1;
  for (const Axis& axis : axes) {
    index += coordinates.*kCoordinateFields[axis.axis] * radix;
    radix *= axis.size;
  }
  return index;
}

// Megatron's generate_masked_orthogonal_rank_groups: group `group_index` counts through the
// coordinates on the outer axes, and its members count through those on the inner axes, the
// fastest axis first in both.
std::vector<int> GroupMembers(int group_index, const GroupAxes& axes) {
  const int base = RankOffset(group_index, axes.outer);
  std::vector<int> ranks(Volume(axes.inner));
  for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
    ranks[i] = base + RankOffset(i, axes.inner);
  }
  return ranks;
}

}  // namespace

Result<Topology> Topology::Create(int tp, int cp, int dp, int pp, std::string_view order) {
  const std::array<int, 4> sizes = {tp, cp, dp, pp};
  int64_t world_size = 1;
  for (int axis = 0; axis < 4; ++axis) {
    // Named as the flags users set them with.
    if (sizes[axis] < 1) return Errorf("--{} must be >= 1, got {}", kAxisNames[axis], sizes[axis]);
    // Checked at every step, so the product never overflows before the check sees it.
    world_size *= sizes[axis];
    if (world_size > std::numeric_limits<int>::max()) {
      return Errorf("world size tp·cp·dp·pp = {}·{}·{}·{} is more than {} ranks", tp, cp, dp, pp,
                    std::numeric_limits<int>::max());
    }
  }
  DT_ASSIGN_OR_RETURN(const AxisOrder order_axes, ParseOrder(order));
  return Topology(sizes, order_axes, std::string(order));
}

Topology::Topology(std::array<int, 4> sizes, std::array<int, 4> order_axes, std::string order)
    : sizes_(sizes),
      order_axes_(order_axes),
      world_size_(sizes[0] * sizes[1] * sizes[2] * sizes[3]),
      order_(std::move(order)) {}

Result<RankGroups> Topology::GetRanks(std::string_view token) const {
  DT_ASSIGN_OR_RETURN(const AxisSet set, ParseGroupToken(token));
  const GroupAxes axes = SplitAxes(sizes_, order_axes_, set);
  RankGroups groups(Volume(axes.outer));
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    groups[g] = GroupMembers(g, axes);
  }
  return groups;
}

Result<RankGroup> Topology::GroupOf(int rank, std::string_view token) const {
  DT_ASSIGN_OR_RETURN(const AxisSet set, ParseGroupToken(token));
  if (rank < 0 || rank >= world_size_) {
    return Errorf("rank {} is outside the world of {} ranks", rank, world_size_);
  }
  const ParallelCoordinates coordinates = CoordinatesOf(rank);
  const GroupAxes axes = SplitAxes(sizes_, order_axes_, set);
  RankGroup group;
  group.group_index = IndexAlong(coordinates, axes.outer);
  group.rank_in_group = IndexAlong(coordinates, axes.inner);
  group.ranks = GroupMembers(group.group_index, axes);
  // Holds because IndexAlong and RankOffset read the same mixed-radix layout both ways.
  DT_CHECK(group.ranks[group.rank_in_group] == rank, "rank {} misplaced in its {} group", rank,
           token);
  return group;
}

ParallelCoordinates Topology::CoordinatesOf(int rank) const {
  DT_CHECK(rank >= 0 && rank < world_size_, "rank {} outside world of {}", rank, world_size_);
  ParallelCoordinates coordinates;
  for (const Axis& axis : SplitAxes(sizes_, order_axes_, kAllAxes).inner) {
    coordinates.*kCoordinateFields[axis.axis] = (rank / axis.stride) % axis.size;
  }
  return coordinates;
}

int Topology::RankOf(const ParallelCoordinates& coordinates) const {
  for (int axis = 0; axis < 4; ++axis) {
    const int coordinate = coordinates.*kCoordinateFields[axis];
    DT_CHECK(coordinate >= 0 && coordinate < sizes_[axis], "{} coordinate {} outside size {}",
             kAxisNames[axis], coordinate, sizes_[axis]);
  }
  // Over all axes in order, the mixed-radix radix of each axis is exactly its stride.
  return IndexAlong(coordinates, SplitAxes(sizes_, order_axes_, kAllAxes).inner);
}

}  // namespace difftrain
