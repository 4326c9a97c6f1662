// What the MPI pieces share: fail-fast MPI calls, and waiting for a nonblocking request with a
// deadline (MPI's own waits have none).
#pragma once

#include <mpi.h>

#include <chrono>

#include "common/check.h"

namespace difftrain::parallel {

using MpiClock = std::chrono::steady_clock;

// MPI's return codes: MPI_ERRORS_ARE_FATAL aborts first by default, so a code other than
// MPI_SUCCESS here is a broken invariant.
#define DT_MPI(call)                                                        \
  do {                                                                      \
    const int dt_mpi_rc = (call);                                           \
    DT_CHECK(dt_mpi_rc == MPI_SUCCESS, "{} returned {}", #call, dt_mpi_rc); \
  } while (0)

// Tests `request` until it completes (true; the request is then MPI_REQUEST_NULL) or
// `deadline` passes (false; the request is still pending). Open MPI progresses nonblocking
// collectives only inside MPI calls, so this polls: spinning at first, for latency, then
// sleeping between tests so that a long wait leaves the core to the computation.
bool WaitUntil(MPI_Request& request, MpiClock::time_point deadline);

}  // namespace difftrain::parallel
