// `difftrain train` under mpirun or srun --mpi=pmix, without the controller (docs/jobs.md,
// "Launching with mpirun or srun"): every rank joins the MPI world, rank 0 resolves the job
// once and sends it to the others, and each trains as under the controller (RunRank). MPI
// restarts nothing: a rank that fails ends the whole job (MPI_Abort); the controller's mode
// is the one with restarts.
#pragma once

#include "worker/rank_runtime.h"

namespace difftrain::worker {

// Whether `difftrain train` with these options is a rank of an MPI launch: an MPI launcher
// started it and no --store / STORE places it otherwise.
bool IsMpiLaunch(const RankOptions& options);

// Runs this rank of an MPI launch to the end and returns the process exit code. A clean end
// (done, or stopped after a checkpoint) waits for every rank; a failure aborts the job.
int RunMpiRank(RankOptions options);

}  // namespace difftrain::worker
