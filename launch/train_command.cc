// `difftrain train --config JOB.yaml`: training without daemons. One process, or one rank
// of a parallel layout started by hand, by a test or by a worker daemon (--rank/--world/--store,
// or the RANK/WORLD_SIZE/STORE environment variables), or by mpirun / srun --mpi=pmix
// (worker/mpi_launch.h). Resumes from the newest complete checkpoint of checkpoint.dir and
// writes checkpoints as configured. The rank runtime is worker/rank_runtime.h.
#include "common/log.h"
#include "launch/command.h"
#include "model/parallel/mpi_world.h"
#include "worker/mpi_launch.h"
#include "worker/rank_runtime.h"

namespace difftrain::launch {
namespace {

struct TrainFlags {
  worker::RankOptions rank;
  std::string log_level = "info";
};

int RunTrain(const TrainFlags& f) {
  if (Status s = SetupLogging(f.log_level); !s.ok()) return ReportBadInput("train", s.message());
  if (worker::IsMpiLaunch(f.rank)) return worker::RunMpiRank(f.rank);
  return worker::RunRank(f.rank);
}

}  // namespace

DIFFTRAIN_COMMAND(
    kTrain, {"train",
             parallel::MpiBuilt()
                 ? "Train in this process: alone, or as one rank of a parallel layout "
                   "(parallel.tp/cp/dp/pp), also under mpirun or srun --mpi=pmix"
                 : "Train in this process: alone, or as one rank of a parallel layout "
                   "(parallel.tp/cp/dp/pp); the mpirun / srun --mpi=pmix mode is not built "
                   "(no Open MPI at build time)",
             [](CLI::App& app) {
               auto f = std::make_shared<TrainFlags>();
               worker::RankOptions& o = f->rank;
               app.add_option("--config", o.config, "job YAML (docs/job-spec.md)")->required();
               app.add_option("--steps", o.steps, "override train.steps (or train.epochs)");
               app.add_option("--rank", o.rank, "this rank (or RANK)");
               app.add_option("--world", o.world, "number of ranks (or WORLD_SIZE)");
               app.add_option("--store", o.store,
                              "rendezvous directory shared by the ranks (or STORE)");
               app.add_option("--attempt", o.attempt,
                              "restart attempt: communicators of each attempt are "
                              "separate")
                   ->capture_default_str();
               app.add_option("--metrics-port", o.metrics_port,
                              "without a worker daemon (mpirun, srun): serve this rank's "
                              "Prometheus metrics at this port + its local rank");
               app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error|off")
                   ->capture_default_str();
               return [f] { return RunTrain(*f); };
             }});

}  // namespace difftrain::launch
