// The NCCL backend of Comm: collectives between GPUs, one rank per GPU. Compiled only in
// CUDA builds (DIFFTRAIN_HAVE_CUDA).
#pragma once

#ifdef DIFFTRAIN_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"
#include "model/parallel/store.h"

namespace difftrain::parallel {

// Joins the group as `rank` of `size`, like CreateGlooComm (same prefix, store, timeout
// and message rules): after the roll call, rank 0 creates the NCCL unique id and
// publishes it under "<prefix>/nccl/unique_id"; every rank then initialises its NCCL
// communicator without blocking and gives up (ncclCommAbort) when that takes longer than
// `timeout`. Call it with this rank's GPU as the current device.
//
// Buffers given to the ops are device memory on that GPU. Each op first waits for the
// work already queued on `compute_stream` (which produces its inputs), runs on the
// communicator's own stream, and Wait blocks the host until it has finished. An op that
// does not finish within `timeout`, or that NCCL reports failed, aborts the communicator
// and returns an error naming the group, the op and the missing ranks. Sends and
// receives are launched together, as one NCCL group, at the first Wait on any of them or
// at the next collective, so that the two halves of an exchange progress at once.
// Handles (CommWork) must not outlive the communicator.
Result<std::unique_ptr<Comm>> CreateNcclComm(Store& store, const std::string& prefix, int rank,
                                             int size, std::vector<int> global_ranks,
                                             std::chrono::milliseconds timeout,
                                             cudaStream_t compute_stream);

}  // namespace difftrain::parallel

#endif  // DIFFTRAIN_HAVE_CUDA
