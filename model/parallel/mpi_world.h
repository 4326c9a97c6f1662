// The MPI world of a rank that `mpirun` or `srun --mpi=pmix` started (docs/jobs.md, "Launching
// with mpirun or srun"): its place in the job, a rendezvous store served over MPI, and the
// MPI backend of Comm (`parallel.backend: mpi`).
//
// MPI is optional in the build. This header compiles everywhere; without MPI, JoinMpiWorld
// says that the mode is not built (model/parallel/mpi_absent.cc), and with it the
// implementation is model/parallel/mpi/.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"
#include "model/parallel/store.h"

namespace difftrain::parallel {

// Whether this difftrain was built with MPI.
bool MpiBuilt();

// Whether an MPI launcher started this process: mpirun (OMPI_COMM_WORLD_SIZE) or
// srun --mpi=pmix (PMIX_RANK).
inline bool StartedByMpiLauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

class MpiWorld {
 public:
  virtual ~MpiWorld() = default;

  // The place of this process in MPI_COMM_WORLD. Local: the ranks on this node (MPI's
  // shared-memory split), whose count is the same on every node of a regular launch.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual int nodes() const = 0;

  // A store served by rank 0's MPI thread to every rank (model/parallel/store.h): Gloo's
  // rendezvous, NCCL's unique id and the communicators' roll calls go through it.
  virtual Store& store() = 0;

  // Rank 0's `text` on every rank (collective over the world; no deadline: MPI_Bcast).
  virtual std::string Broadcast(const std::string& text) = 0;

  // The MPI communicator of a group (comm.h): `prefix` ("job/attempt/group") names it in the
  // store and in messages. Only the members call it; they meet in the store first (the roll
  // call, bounded by `timeout`, names ranks that never come), then MPI makes the
  // communicator. Every op then fails after `timeout` instead of hanging.
  virtual Result<std::unique_ptr<Comm>> CreateComm(const std::string& prefix, int rank, int size,
                                                   std::vector<int> global_ranks,
                                                   std::chrono::milliseconds timeout) = 0;

  // The clean end of a run: every rank waits for the others (at most `timeout`, so that a
  // rank that is gone cannot hold the rest), rank 0 stops serving the store, MPI finalises.
  virtual Status Finalize(std::chrono::milliseconds timeout) = 0;

  // Ends every rank of the job at once (MPI_Abort): what a failed rank does, since MPI runs
  // no more ranks in place of one that failed.
  [[noreturn]] virtual void Abort(int exit_code) = 0;
};

// Initialises MPI (MPI_THREAD_MULTIPLE) and joins the world. Once per process.
Result<std::unique_ptr<MpiWorld>> JoinMpiWorld();

}  // namespace difftrain::parallel
