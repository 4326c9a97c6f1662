#include "model/parallel/comm.h"

#include <fmt/format.h>

#include "common/check.h"

namespace difftrain::parallel {

std::string GroupName(std::string_view token, const std::vector<int>& global_ranks) {
  const size_t n = global_ranks.size();
  bool progression = n > 4;
  for (size_t i = 2; progression && i < n; ++i) {
    progression = global_ranks[i] - global_ranks[i - 1] == global_ranks[1] - global_ranks[0];
  }
  if (progression) {
    return fmt::format("{}[{},{},..,{}]", token, global_ranks[0], global_ranks[1],
                       global_ranks.back());
  }
  return fmt::format("{}[{}]", token, fmt::join(global_ranks, ","));
}

void Comm::CheckReduceScatterBuffers(const float* in, const float* out, size_t n_per_rank) const {
  const float* own = in + static_cast<size_t>(rank()) * n_per_rank;
  const float* in_end = in + static_cast<size_t>(size()) * n_per_rank;
  DT_CHECK(out == own || out + n_per_rank <= in || out >= in_end,
           "{}: reduce_scatter output overlaps the input other than at this rank's chunk", name());
}

void Comm::CheckAllGatherBuffers(const float* in, const float* out, size_t n_per_rank) const {
  const float* own = out + static_cast<size_t>(rank()) * n_per_rank;
  const float* out_end = out + static_cast<size_t>(size()) * n_per_rank;
  DT_CHECK(in == own || in + n_per_rank <= out || in >= out_end,
           "{}: all_gather input overlaps the output other than at this rank's chunk", name());
}

void Comm::CheckRoot(int root) const {
  DT_CHECK(root >= 0 && root < size(), "{}: root {} outside the group", name(), root);
}

void Comm::CheckPeer(int peer) const {
  DT_CHECK(peer >= 0 && peer < size() && peer != rank(), "{}: rank {} cannot exchange with {}",
           name(), rank(), peer);
}

void CheckMembership(int rank, int size, const std::vector<int>& global_ranks,
                     std::chrono::milliseconds timeout) {
  DT_CHECK(size > 0 && rank >= 0 && rank < size, "rank {} of {}", rank, size);
  DT_CHECK(static_cast<int>(global_ranks.size()) == size, "{} global ranks for a group of {}",
           global_ranks.size(), size);
  DT_CHECK(timeout > std::chrono::milliseconds(0), "timeout must be positive");
}

}  // namespace difftrain::parallel
