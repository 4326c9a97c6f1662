#include "worker/rank_runtime.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <spdlog/spdlog.h>

#include "common/attempt_fence.h"
#include "common/exit_codes.h"
#include "common/metrics.h"
#include "common/topology.h"
#include "job/job_spec.h"
#include "model/parallel/gloo_comm.h"
#include "model/parallel/mpi_world.h"
#include "model/parallel/store.h"
#include "model/parallel/timed_comm.h"
#include "model/train/checkpointing.h"
#include "model/train/gpu_step.h"
#include "model/train/peak_flops.h"
#include "worker/rank_metrics.h"
#include "worker/rank_reporter.h"
#include "worker/store_client.h"

namespace difftrain::worker {
namespace {

// A flag, else the environment variable, else the default.
template <typename T>
Result<T> FlagOrEnv(const std::optional<T>& flag, const char* env, T fallback) {
  if (flag) return *flag;
  const char* value = std::getenv(env);
  if (value == nullptr || *value == '\0') return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(value);
  } else {
    char* end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (*end != '\0') return Errorf("environment variable {}='{}' is not an integer", env, value);
    return static_cast<T>(parsed);
  }
}

// The GPU a rank with train.device cuda computes on: its worker daemon's (DIFFTRAIN_DEVICE
// cuda:J), else `fallback` (GPU 0, or the local rank under MPI).
Result<int> GpuIndex(int fallback) {
  const char* device = std::getenv("DIFFTRAIN_DEVICE");
  if (device == nullptr || *device == '\0') return fallback;
  const std::string value = device;
  if (value == "cpu") {
    return Errorf("train.device is cuda, but this rank's node has no GPU (DIFFTRAIN_DEVICE=cpu)");
  }
  int index = -1;
  if (value.starts_with("cuda:")) {
    char* end = nullptr;
    const long parsed = std::strtol(value.c_str() + 5, &end, 10);
    if (*end == '\0' && end != value.c_str() + 5) index = static_cast<int>(parsed);
  }
  if (index < 0) return Errorf("DIFFTRAIN_DEVICE='{}': expected cuda:J or cpu", value);
  return index;
}

// This process's place in the job and its communicators.
struct Placement {
  int rank = 0, world = 1;
  // Behind a pointer: the communicators keep a reference to the store, so it must not move.
  std::unique_ptr<parallel::Store> store;
  std::vector<std::unique_ptr<parallel::Comm>> comms;
  ParallelOptions parallel;
};

// With a GPU, the data-parallel group is an NCCL communicator on it and every other group
// (which carries host buffers) is Gloo.
Result<Placement> Place(const RankOptions& o, const TrainConfig& config, GpuStep* gpu) {
  Placement p;
  std::string store_dir;
  if (o.mpi != nullptr) {
    p.rank = o.mpi->rank();
    p.world = o.mpi->size();
  } else {
    DT_ASSIGN_OR_RETURN(p.rank, FlagOrEnv(o.rank, "RANK", 0));
    DT_ASSIGN_OR_RETURN(p.world, FlagOrEnv(o.world, "WORLD_SIZE", 1));
    DT_ASSIGN_OR_RETURN(store_dir, FlagOrEnv(o.store, "STORE", std::string()));
  }
  if (p.world < 1 || p.rank < 0 || p.rank >= p.world) {
    return Errorf("--rank {} must be in [0, --world {})", p.rank, p.world);
  }
  const ParallelConfig& pc = config.parallel;
  DT_RETURN_IF_ERROR(
      FamilyOf(config.model).ValidateLayout(config.model, {pc.tp, pc.cp, pc.pp, pc.stage_blocks}));
  DT_ASSIGN_OR_RETURN(const int dp, config.DataParallelSize(p.world));
  p.parallel.stage_blocks = pc.stage_blocks;
  p.parallel.zero1 = pc.zero1;
  p.parallel.overlap = pc.overlap;
  p.parallel.bucket_elements = pc.bucket_elements();
  // One process without a store trains alone; with a store it forms a group of one, which
  // runs the same synchronisation code as a larger group.
  if (pc.backend == "mpi" && o.mpi == nullptr) {
    return Status::Error(
        "parallel.backend mpi needs ranks started by mpirun or srun --mpi=pmix; under "
        "`difftrain run`, the daemons or --store, use parallel.backend gloo");
  }
  if (p.world == 1 && store_dir.empty() && o.mpi == nullptr) return p;
  if (store_dir.empty() && o.mpi == nullptr) {
    return Status::Error("--world > 1 needs --store DIR (or STORE)");
  }
  DT_ASSIGN_OR_RETURN(Topology topology, Topology::Create(pc.tp, pc.cp, dp, pc.pp));
  if (o.mpi != nullptr) {
    // The store rank 0 serves over MPI (worker/mpi_launch.h).
    p.store = std::make_unique<parallel::PrefixStore>(o.mpi->store(), "mpi");
  } else {
    // A directory (FileStore), or the controller's store (tcp:// or ipc://) under a daemon.
    const char* keys = std::getenv("DIFFTRAIN_KEYS");
    DT_ASSIGN_OR_RETURN(p.store, OpenStore(store_dir, keys ? keys : ""));
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(pc.timeout_seconds * 1000));
  // Communicators live under job/attempt/group, so a restarted attempt never meets the
  // keys of the one before. Every rank joins its groups in the same token order.
  // `name` labels the group in keys and messages ("world" reads better than tp-cp-dp-pp).
  // The address peers reach this rank at: its worker daemon's (docs/jobs.md), else loopback.
  const char* given_address = std::getenv("DIFFTRAIN_ADDRESS");
  const std::string address = given_address && *given_address ? given_address : "127.0.0.1";
  auto join = [&](std::string_view token, bool always, std::string_view name = {},
                  bool on_gpu = false) -> Result<parallel::Comm*> {
    DT_ASSIGN_OR_RETURN(RankGroup group, topology.GroupOf(p.rank, token));
    if (group.ranks.size() == 1 && !always) return nullptr;
    const std::string prefix =
        fmt::format("train/attempt-{}/{}", o.attempt,
                    parallel::GroupName(name.empty() ? token : name, group.ranks));
    const int size = static_cast<int>(group.ranks.size());
    const int r = group.rank_in_group;
    DT_ASSIGN_OR_RETURN(
        std::unique_ptr<parallel::Comm> comm,
        on_gpu ? gpu->JoinGroup(*p.store, prefix, r, size, group.ranks, timeout)
        : pc.backend == "mpi"
            ? o.mpi->CreateComm(prefix, r, size, group.ranks, timeout)
            : parallel::CreateGlooComm(*p.store, prefix, r, size, group.ranks, timeout, address));
    p.comms.push_back(std::move(comm));
    return p.comms.back().get();
  };
  ParallelOptions& po = p.parallel;
  DT_ASSIGN_OR_RETURN(po.tp, join("tp", false));
  DT_ASSIGN_OR_RETURN(po.cp, join("cp", false));
  DT_ASSIGN_OR_RETURN(po.pp, join("pp", false));
  // Gradients average over the replicas and the context-parallel ranks of each.
  DT_ASSIGN_OR_RETURN(po.dp_cp, join(pc.cp > 1 ? "dp-cp" : "dp", true, {}, gpu != nullptr));
  if (po.dp_cp->size() == p.world && gpu == nullptr) {
    po.world = po.dp_cp;
  } else {
    DT_ASSIGN_OR_RETURN(po.world, join("tp-cp-dp-pp", true, "world"));
  }
  po.rank = p.rank;
  po.topology = topology;
  return p;
}

// Progress of the run on rank 0: one line rewritten in place on a terminal, or a log line
// every log_every steps when the output is a file or pipe.
class Progress {
 public:
  Progress(const TrainConfig& config, int64_t first_step)
      : config_(config),
        flops_per_sample_(FamilyOf(config.model).Cost(config.model).training_flops_per_sample()),
        first_step_(first_step),
        tty_(isatty(STDERR_FILENO) == 1) {}

  void Report(const StepStats& s, double step_seconds, double elapsed_seconds) {
    const double samples_per_s = config_.global_batch / step_seconds;
    const double tflops =
        samples_per_s * (s.flops_per_sample > 0 ? s.flops_per_sample : flops_per_sample_) / 1e12;
    const double eta = elapsed_seconds / (s.step - first_step_) * (config_.steps - s.step);
    // The passes over the data, where the data have epochs.
    const std::string epoch = s.epoch > 0 ? fmt::format("  epoch {:.2f}", s.epoch) : "";
    const std::string line = fmt::format(
        "step {}/{}{}  loss {:.4f}  grad-norm {:.3f}  lr {:.2e}  {:.1f} samples/s  {:.3f} TFLOP/s  "
        "ETA {:.0f}s",
        s.step, config_.steps, epoch, s.loss, s.grad_norm, s.lr, samples_per_s, tflops, eta);
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      if (s.step == config_.steps) std::fputc('\n', stderr);
      std::fflush(stderr);
    } else if (s.step % config_.log_every == 0 || s.step == config_.steps) {
      spdlog::info("{}", line);
    }
  }

 private:
  const TrainConfig& config_;
  double flops_per_sample_;
  int64_t first_step_;
  bool tty_;
};

// The attempt fence (common/attempt_fence.h): under a controller (which names itself in
// DIFFTRAIN_INCARNATION), a checkpoint is committed only while this rank's attempt is the one
// the controller launched last. A store that cannot answer fails the commit too.
Status CheckAttemptIsCurrent(Placement& p, int attempt) {
  const char* incarnation = std::getenv("DIFFTRAIN_INCARNATION");
  if (incarnation == nullptr || *incarnation == '\0' || p.store == nullptr) return Status::Ok();
  const std::string ours = CurrentAttempt(incarnation, attempt);
  Result<std::vector<char>> current =
      p.store->Get(std::string(kCurrentAttemptKey), std::chrono::seconds(10));
  if (!current.ok()) return current.status().WithContext("reading the job's current attempt");
  const std::string theirs(current->begin(), current->end());
  if (theirs != ours) {
    return Errorf(
        "attempt {} (controller {}) is no longer the job's current attempt ({}): a newer one "
        "owns the checkpoints",
        attempt, incarnation, theirs);
  }
  return Status::Ok();
}

// Every rank writes its shard; once all have, rank 0 publishes the checkpoint, if its attempt
// is still the current one.
Status Checkpoint(Trainer& trainer, const io::CheckpointStore& store, Placement& p, int attempt) {
  DT_RETURN_IF_ERROR(WriteCheckpointShard(trainer, store, p.rank, p.world));
  parallel::Comm* world = p.parallel.world;
  if (world) DT_RETURN_IF_ERROR(world->Barrier().WithContext("checkpoint barrier"));
  if (p.rank == 0) {
    DT_RETURN_IF_ERROR(CheckAttemptIsCurrent(p, attempt)
                           .WithContext(fmt::format("not committing step {}", trainer.step())));
    DT_RETURN_IF_ERROR(store.Commit(trainer.step(), p.world));
    spdlog::info("checkpoint step {} written to {}", trainer.step(), store.StepDir(trainer.step()));
  }
  if (world) DT_RETURN_IF_ERROR(world->Barrier().WithContext("checkpoint barrier"));
  return Status::Ok();
}

// Wraps every communicator of `p` so that the time its caller waits is added to `times`
// (the rank's comm seconds by group and op).
void TimeComms(Placement& p, parallel::CommTimes& times) {
  std::map<parallel::Comm*, parallel::Comm*> timed;
  for (std::unique_ptr<parallel::Comm>& comm : p.comms) {
    parallel::Comm* inner = comm.get();
    comm = parallel::TimeComm(std::move(comm), times);
    timed[inner] = comm.get();
  }
  ParallelOptions& po = p.parallel;
  for (parallel::Comm** c : {&po.tp, &po.cp, &po.pp, &po.dp_cp, &po.world}) {
    if (*c != nullptr) *c = timed.at(*c);
  }
}

// SIGTERM or SIGUSR1 (a worker daemon passing on a Slurm warning or a Kubernetes
// termination): finish the step, write a checkpoint, exit kExitCheckpointed.
std::atomic<int> g_stop_signal{0};
void OnStopSignal(int signal) {
  g_stop_signal.store(signal);
}

// Whether any rank was asked to stop: every rank must leave after the same step, so the
// flag is summed over all ranks each step (one float; under a daemon or alone).
Result<bool> AgreeToStop(Placement& p) {
  float stop = g_stop_signal.load() != 0 ? 1.0f : 0.0f;
  if (p.parallel.world) {
    DT_RETURN_IF_ERROR(p.parallel.world->AllReduce(&stop, 1, parallel::ReduceOp::kSum));
  }
  return stop > 0;
}

// A rank's own Prometheus metrics, when it has no worker daemon to serve them.
struct ServedMetrics {
  std::unique_ptr<RankMetrics> metrics;
  std::unique_ptr<MetricsEndpoint> endpoint;
};

Result<ServedMetrics> ServeMetrics(const RankOptions& o) {
  ServedMetrics served;
  if (o.metrics_port <= 0) return served;
  const int port = o.metrics_port + (o.mpi ? o.mpi->local_rank() : 0);
  served.metrics = std::make_unique<RankMetrics>();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  served.metrics->SetJob(std::filesystem::path(o.config).stem().string(), host);
  Result<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(port, served.metrics->registry());
  if (!endpoint.ok()) return endpoint.status().WithContext("serving this rank's metrics");
  served.endpoint = std::move(endpoint).value();
  spdlog::info("serving this rank's metrics at http://{}:{}/metrics", host, port);
  return served;
}

int Fail(const std::string& message) {
  spdlog::error("{}", message);
  return kExitJobFailed;
}

}  // namespace

int RunRank(const RankOptions& o) {
  // A peer that dies must surface as an error of the collective, not as SIGPIPE here.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGTERM, OnStopSignal);
  std::signal(SIGUSR1, OnStopSignal);
  Result<TrainConfig> loaded = o.config_text.empty()
                                   ? TrainConfig::FromYamlFile(o.config)
                                   : TrainConfig::FromYamlText(o.config_text, o.config);
  if (!loaded.ok()) return ReportBadInput("train", loaded.status().message());
  TrainConfig config = *loaded;
  if (o.steps) {
    config.steps = *o.steps;  // over train.epochs too
    config.epochs = 0;
  }
  // Under a controller the job arrives resolved; alone, `parallel: auto` is chosen here for
  // the file's cluster section, as `difftrain validate` chooses it.
  if (Status s = ResolveJob(config); !s.ok()) return ReportBadInput("train", s.message());
  // train.epochs not resolved where the job was launched (or no launcher): from the data here,
  // which every rank reads alike.
  if (Status s = Trainer::ResolveEpochs(config); !s.ok()) {
    return ReportBadInput("train", s.message());
  }
  if (Status s = CpuPeakFlopsGiven().status(); !s.ok()) return ReportBadInput("train", s.message());
  // Before the communicators, which add to it until they are gone.
  parallel::CommTimes comm_times;
  std::unique_ptr<GpuStep> gpu;
  if (config.device == "cuda") {
    Result<int> index = GpuIndex(o.mpi ? o.mpi->local_rank() : 0);
    if (!index.ok()) return ReportBadInput("train", index.status().message());
    Result<std::unique_ptr<GpuStep>> made = GpuStep::Create(config, *index);
    if (!made.ok()) return ReportBadInput("train", made.status().WithContext(o.config).message());
    gpu = std::move(made).value();
    spdlog::info("computing on GPU {} ({})", gpu->device(), gpu->device_name());
  }
  Result<Placement> placed = Place(o, config, gpu.get());
  if (!placed.ok()) return ReportBadInput("train", placed.status().message());
  Placement& p = *placed;
  TimeComms(p, comm_times);
  if (p.rank != 0) spdlog::set_level(spdlog::level::warn);

  Result<std::unique_ptr<Trainer>> created = Trainer::Create(config, p.parallel, std::move(gpu));
  if (!created.ok()) {
    return ReportBadInput("train", created.status().WithContext(o.config).message());
  }
  Trainer& trainer = **created;
  const ModelCost cost = FamilyOf(config.model).Cost(config.model);

  std::optional<io::CheckpointStore> store;
  bool resumed_any = false;
  if (!config.checkpoint.dir.empty()) {
    store.emplace(config.checkpoint.dir, config.checkpoint.keep);
    Result<std::optional<int64_t>> resumed =
        RestoreLatestCheckpoint(trainer, *store, p.parallel.world);
    if (!resumed.ok()) return Fail(resumed.status().message());
    if (*resumed) spdlog::info("resumed from step {} of {}", **resumed, store->dir());
    resumed_any = resumed->has_value();
  }
  if (!resumed_any && !config.checkpoint.init_from.empty()) {
    Result<std::string> from = InitializeFromWeights(trainer, config.checkpoint.init_from);
    if (!from.ok())
      return ReportBadInput("train", "checkpoint.init_from: " + from.status().message());
    spdlog::info("starting from the weights of {}", *from);
  }
  Result<ServedMetrics> served = ServeMetrics(o);
  if (!served.ok()) return ReportBadInput("train", served.status().message());
  Result<std::unique_ptr<RankReporter>> reporter =
      RankReporter::Open(config, trainer, p.parallel, comm_times, served->metrics.get());
  if (!reporter.ok()) return Fail(reporter.status().message());
  const int dp = trainer.dp_size();
  spdlog::info(
      "training {} ({} parameters, {:.2f} GFLOP per sample) for {} steps{} on {} rank(s) "
      "(tp {} cp {} dp {} pp {}), global batch {} = micro {} x data-parallel {} x "
      "accumulation {}{}",
      config.model.name(), cost.parameters, cost.training_flops_per_sample() / 1e9, config.steps,
      config.epochs > 0
          ? fmt::format(" ({} epochs of {} samples)", config.epochs, config.epoch_samples)
          : "",
      p.world, config.parallel.tp, config.parallel.cp, dp, config.parallel.pp, config.global_batch,
      config.micro_batch, dp, config.AccumulationSteps(dp),
      config.parallel.zero1 ? ", ZeRO-1" : "");

  (*reporter)->Started(trainer.step());
  Progress progress(config, trainer.step());
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  StepStats last;
  while (trainer.step() < config.steps) {
    const auto t0 = Clock::now();
    Result<StepStats> stats = trainer.Step();
    if (!stats.ok()) {
      return Fail(
          fmt::format("rank {} step {}: {}", p.rank, trainer.step() + 1, stats.status().message()));
    }
    last = *stats;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (p.rank == 0) {
      progress.Report(last, seconds, std::chrono::duration<double>(Clock::now() - start).count());
    }
    (*reporter)->Stepped(last, seconds);
    Result<bool> stop = AgreeToStop(p);
    if (!stop.ok()) return Fail(stop.status().WithContext("agreeing to stop").message());
    const bool periodic = config.checkpoint.every > 0 && last.step % config.checkpoint.every == 0;
    if (store && (periodic || last.step == config.steps || *stop)) {
      const auto checkpoint_start = Clock::now();
      if (Status s = Checkpoint(trainer, *store, p, o.attempt); !s.ok()) return Fail(s.message());
      (*reporter)->Checkpointed(
          last.step, std::chrono::duration<double>(Clock::now() - checkpoint_start).count());
    }
    if (*stop && trainer.step() < config.steps) {
      spdlog::info("stopped by signal {} after step {}{}", g_stop_signal.load(), trainer.step(),
                   store ? ", checkpoint written" : " (no checkpoint.dir: nothing saved)");
      return kExitCheckpointed;
    }
  }
  spdlog::info("done: {} steps, final loss {:.4f}{}", trainer.step(), last.loss,
               store ? ", checkpoints in " + store->dir() : "");
  return kExitOk;
}

}  // namespace difftrain::worker
