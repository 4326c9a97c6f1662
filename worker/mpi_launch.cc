#include "worker/mpi_launch.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "common/exit_codes.h"
#include "job/job_spec.h"
#include "model/parallel/mpi_world.h"

namespace difftrain::worker {
namespace {

// The job as rank 0 resolved it, with `parallel: auto` chosen for the nodes and ranks per
// node that MPI reports; or, after a '!', why it could not. Sent as one text so that every
// rank trains the same job, or reports the same error.
std::string ResolveOnRankZero(const RankOptions& o, const parallel::MpiWorld& world) {
  std::string yaml;
  Result<TrainConfig> config =
      LoadJob(o.config, {.nodes = world.nodes(), .devices_per_node = world.local_size()}, &yaml);
  if (!config.ok()) return "!" + config.status().message();
  Result<std::string> resolved = ResolvedJobYaml(yaml, *config);
  if (!resolved.ok()) return "!" + resolved.status().WithContext(o.config).message();
  return *resolved;
}

// How long a finished rank waits for the others before it gives up on a clean end.
constexpr std::chrono::minutes kFinishTimeout(5);

}  // namespace

bool IsMpiLaunch(const RankOptions& o) {
  const char* store = std::getenv("STORE");
  return parallel::StartedByMpiLauncher() && !o.store && (store == nullptr || *store == '\0');
}

int RunMpiRank(RankOptions o) {
  Result<std::unique_ptr<parallel::MpiWorld>> joined = parallel::JoinMpiWorld();
  if (!joined.ok()) {
    return ReportBadInput("train", "started by an MPI launcher, but " + joined.status().message());
  }
  parallel::MpiWorld& world = **joined;
  const std::string job = world.Broadcast(world.rank() == 0 ? ResolveOnRankZero(o, world) : "");
  if (job.starts_with("!")) {
    // Every rank has the same error; one says it.
    const int code = world.rank() == 0 ? ReportBadInput("train", job.substr(1)) : kExitBadInput;
    if (!world.Finalize(kFinishTimeout).ok()) world.Abort(code);
    return code;
  }
  o.config_text = job;
  o.mpi = &world;
  const int code = RunRank(o);
  if (code != kExitOk && code != kExitCheckpointed) {
    spdlog::error("rank {} failed (exit {}): ending the MPI job, which has no restarts",
                  world.rank(), code);
    world.Abort(code);
  }
  if (Status s = world.Finalize(kFinishTimeout); !s.ok()) {
    spdlog::error("{}", s.message());
    world.Abort(kExitJobFailed);
  }
  return code;
}

}  // namespace difftrain::worker
