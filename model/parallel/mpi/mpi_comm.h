// The MPI backend of Comm (`parallel.backend: mpi`): every op is a nonblocking MPI call
// (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv,
// MPI_Ibarrier) started when it is issued, and its Wait tests it until the communicator's
// timeout, so a peer that never comes is an error, not a hang. What MPI cannot do is take a
// started op back: after a timeout the communicator is broken, its buffers may still be
// written, and the rank must end (docs/communication.md, "The MPI backend").
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"
#include "model/parallel/store.h"

namespace difftrain::parallel {

// Joins the group `global_ranks` (ranks of `world`) as `rank` of `size`: the members meet in
// `store` under `prefix` first (the roll call of model/parallel/roll_call.h, which names the
// ranks that do not come within `timeout`), then make the MPI communicator. `store` must
// outlive the Comm.
Result<std::unique_ptr<Comm>> CreateMpiComm(MPI_Comm world, Store& store, const std::string& prefix,
                                            int rank, int size, std::vector<int> global_ranks,
                                            std::chrono::milliseconds timeout);

}  // namespace difftrain::parallel
