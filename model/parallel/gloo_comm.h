// The Gloo backend of Comm: collectives over TCP between CPU processes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"
#include "model/parallel/store.h"

namespace difftrain::parallel {

// Joins the group as `rank` of `size` and connects to every other member.
//
// `prefix` ("job/attempt/group", its last component the group's name, see GroupName)
// must be fresh for each communicator: all keys this communicator writes live under
// it. `global_ranks[rank]` is this process's global rank; the list names ranks in
// messages. `timeout` bounds the rendezvous and every later op. The device listens on
// `hostname` and advertises it to its peers: the loopback default serves ranks on one
// machine, a multi-node job passes an address of this node that the others can reach.
//
// A rank that does not arrive within `timeout` makes the others fail with an error that
// names the group, "rendezvous" and the missing ranks. `store` must outlive the Comm.
Result<std::unique_ptr<Comm>> CreateGlooComm(Store& store, const std::string& prefix, int rank,
                                             int size, std::vector<int> global_ranks,
                                             std::chrono::milliseconds timeout,
                                             const std::string& hostname = "127.0.0.1");

}  // namespace difftrain::parallel
