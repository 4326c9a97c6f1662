// What a communicator backend knows of its group: its view of the store (every key under the
// group's prefix), its name (the prefix's last component, see GroupName in comm.h), this rank,
// the size, the members' global ranks (for messages) and the timeout of the rendezvous and of
// every op.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "model/parallel/store.h"

namespace difftrain::parallel {

struct GroupMembership {
  GroupMembership(Store& base, const std::string& prefix, int rank, int size,
                  std::vector<int> global_ranks, std::chrono::milliseconds timeout)
      : store(base, prefix),
        name(prefix.substr(prefix.rfind('/') + 1)),
        rank(rank),
        size(size),
        global_ranks(std::move(global_ranks)),
        timeout(timeout) {}

  PrefixStore store;
  const std::string name;
  const int rank;
  const int size;
  const std::vector<int> global_ranks;
  const std::chrono::milliseconds timeout;
};

}  // namespace difftrain::parallel
