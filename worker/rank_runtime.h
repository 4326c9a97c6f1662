// One training rank as a library: its place in the job (rank, world and store from flags or
// the RANK / WORLD_SIZE / STORE environment a worker daemon sets), its communicators, the
// training loop with the collective checkpoint commit and the agreement to stop on a signal,
// and its progress reports. `difftrain train` is a thin command over it (launch/).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace difftrain::parallel {
class MpiWorld;
}

namespace difftrain::worker {

struct RankOptions {
  std::string config;            // the job file (as the controller resolved it, or the user's)
  std::optional<int64_t> steps;  // overrides train.steps
  std::optional<int> rank, world;
  std::optional<std::string> store;  // rendezvous: a directory, or the controller's address
  int attempt = 0;                   // restart attempt: each attempt's communicators are apart
  // Started by mpirun or srun --mpi=pmix (worker/mpi_launch.h): the rank, the world, the GPU
  // (the local rank), the store and `parallel.backend: mpi` come from MPI.
  parallel::MpiWorld* mpi = nullptr;
  std::string config_text;  // the resolved job itself (from rank 0 under MPI); else read `config`
  // Without a worker daemon (the MPI launch): serve this rank's Prometheus metrics at
  // http://HOST:(metrics_port + local rank)/metrics; 0: off.
  int metrics_port = 0;
};

// Trains this rank to the end of the job, or until a signal stops it after a checkpoint.
// Returns the process exit code (common/exit_codes.h); bad input is reported on stderr,
// failures in the log. SIGTERM and SIGUSR1 are taken over for the stop agreement.
int RunRank(const RankOptions& options);

}  // namespace difftrain::worker
