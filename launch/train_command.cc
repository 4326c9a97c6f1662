// `difftrain train --config JOB.yaml`: training without daemons. One process, or one rank
// of a data-parallel group started by hand or by a test (--rank/--world/--store, or the
// RANK/WORLD_SIZE/STORE environment variables). Resumes from the newest complete
// checkpoint of checkpoint.dir and writes checkpoints as configured.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "launch/command.h"
#include "model/parallel/gloo_comm.h"
#include "model/parallel/store.h"
#include "model/train/checkpointing.h"

namespace difftrain::launch {
namespace {

struct TrainOptions {
  std::string config;
  std::optional<int64_t> steps;
  std::string log_level = "info";
  std::optional<int> rank, world;
  std::optional<std::string> store;
  int attempt = 0;
};

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

// This process's place in the job and its data-parallel communicator.
struct Placement {
  int rank = 0, world = 1;
  // Behind a pointer: the communicator keeps a reference to the store, so it must not move.
  std::unique_ptr<parallel::FileStore> store;
  std::unique_ptr<parallel::Comm> dp;
};

Result<Placement> Place(const TrainOptions& o, const TrainConfig& config) {
  Placement p;
  DT_ASSIGN_OR_RETURN(p.rank, FlagOrEnv(o.rank, "RANK", 0));
  DT_ASSIGN_OR_RETURN(p.world, FlagOrEnv(o.world, "WORLD_SIZE", 1));
  DT_ASSIGN_OR_RETURN(std::string store_dir, FlagOrEnv(o.store, "STORE", std::string()));
  if (p.world < 1 || p.rank < 0 || p.rank >= p.world) {
    return Errorf("--rank {} must be in [0, --world {})", p.rank, p.world);
  }
  // One process without a store trains alone; with a store it forms a group of one, which
  // runs the same synchronisation code as a larger group.
  if (p.world == 1 && store_dir.empty()) return p;
  if (store_dir.empty()) return Status::Error("--world > 1 needs --store DIR (or STORE)");
  DT_ASSIGN_OR_RETURN(parallel::FileStore store, parallel::FileStore::Open(store_dir));
  p.store = std::make_unique<parallel::FileStore>(std::move(store));
  std::vector<int> ranks(p.world);
  for (int r = 0; r < p.world; ++r)
    ranks[r] = r;
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.parallel.timeout_seconds * 1000));
  // Communicators live under job/attempt/group, so a restarted attempt never meets the
  // keys of the one before.
  const std::string prefix =
      fmt::format("train/attempt-{}/{}", o.attempt, parallel::GroupName("dp", ranks));
  DT_ASSIGN_OR_RETURN(p.dp,
                      parallel::CreateGlooComm(*p.store, prefix, p.rank, p.world, ranks, timeout));
  return p;
}

// Progress of the run on rank 0: one line rewritten in place on a terminal, or a log line
// every log_every steps when the output is a file or pipe.
class Progress {
 public:
  Progress(const TrainConfig& config, int64_t first_step)
      : config_(config), first_step_(first_step), tty_(isatty(STDERR_FILENO) == 1) {}

  void Report(const StepStats& s, double step_seconds, double elapsed_seconds) {
    const double samples_per_s = config_.global_batch / step_seconds;
    const double tflops = samples_per_s * TrainingFlopsPerSample(config_.model) / 1e12;
    const double eta = elapsed_seconds / (s.step - first_step_) * (config_.steps - s.step);
    const std::string line = fmt::format(
        "step {}/{}  loss {:.4f}  grad-norm {:.3f}  lr {:.2e}  {:.1f} samples/s  {:.3f} TFLOP/s  "
        "ETA {:.0f}s",
        s.step, config_.steps, s.loss, s.grad_norm, s.lr, samples_per_s, tflops, eta);
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
  int64_t first_step_;
  bool tty_;
};

// Every rank writes its shard; once all have, rank 0 publishes the checkpoint.
Status Checkpoint(const Trainer& trainer, const io::CheckpointStore& store, Placement& p) {
  DT_RETURN_IF_ERROR(WriteCheckpointShard(trainer, store, p.rank, p.world));
  if (p.dp) DT_RETURN_IF_ERROR(p.dp->Barrier().WithContext("checkpoint barrier"));
  if (p.rank == 0) {
    DT_RETURN_IF_ERROR(store.Commit(trainer.step(), p.world));
    spdlog::info("checkpoint step {} written to {}", trainer.step(), store.StepDir(trainer.step()));
  }
  if (p.dp) DT_RETURN_IF_ERROR(p.dp->Barrier().WithContext("checkpoint barrier"));
  return Status::Ok();
}

std::string MetricsPath(std::string pattern, int rank) {
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) pattern.replace(at, 6, std::to_string(rank));
  return pattern;
}

int Fail(const std::string& message) {
  spdlog::error("{}", message);
  return kExitJobFailed;
}

int RunTrain(const TrainOptions& o) {
  if (Status s = SetupLogging(o.log_level); !s.ok()) return ReportBadInput("train", s.message());
  // A peer that dies must surface as an error of the collective, not as SIGPIPE here.
  std::signal(SIGPIPE, SIG_IGN);
  Result<TrainConfig> loaded = TrainConfig::FromYamlFile(o.config);
  if (!loaded.ok()) return ReportBadInput("train", loaded.status().message());
  TrainConfig config = *loaded;
  if (o.steps) config.steps = *o.steps;
  Result<Placement> placed = Place(o, config);
  if (!placed.ok()) return ReportBadInput("train", placed.status().message());
  Placement& p = *placed;
  if (p.rank != 0) spdlog::set_level(spdlog::level::warn);

  DataParallelOptions dp;
  dp.comm = p.dp.get();
  dp.zero1 = config.parallel.zero1;
  dp.overlap = config.parallel.overlap;
  dp.bucket_elements = static_cast<size_t>(config.parallel.bucket_mb * (1 << 20) / sizeof(float));
  Result<std::unique_ptr<Trainer>> created = Trainer::Create(config, dp);
  if (!created.ok()) {
    return ReportBadInput("train", created.status().WithContext(o.config).message());
  }
  Trainer& trainer = **created;
  const DiTConfig& m = config.model;

  std::optional<io::CheckpointStore> store;
  if (!config.checkpoint.dir.empty()) {
    store.emplace(config.checkpoint.dir, config.checkpoint.keep);
    Result<std::optional<int64_t>> resumed = RestoreLatestCheckpoint(trainer, *store);
    if (!resumed.ok()) return Fail(resumed.status().message());
    if (*resumed) spdlog::info("resumed from step {} of {}", **resumed, store->dir());
  }
  std::ofstream metrics;
  if (!config.metrics_file.empty()) {
    const std::string path = MetricsPath(config.metrics_file, p.rank);
    metrics.open(path, std::ios::app);
    if (!metrics) return Fail(fmt::format("cannot open metrics file '{}'", path));
  }
  spdlog::info(
      "training {} ({} parameters, {:.2f} GFLOP per sample) for {} steps on {} rank(s), "
      "global batch {} = micro {} x data-parallel {} x accumulation {}{}",
      m.name, ParameterCount(m), TrainingFlopsPerSample(m) / 1e9, config.steps, p.world,
      config.global_batch, config.micro_batch, p.world, config.AccumulationSteps(p.world),
      config.parallel.zero1 ? ", ZeRO-1" : "");

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
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"step", last.step},
                                {"rank", p.rank},
                                {"loss", last.loss},
                                {"grad_norm", last.grad_norm},
                                {"lr", last.lr},
                                {"step_seconds", seconds},
                                {"comm_wait_seconds", last.comm_wait_seconds},
                                {"samples_per_second", config.global_batch / seconds}}
                     .dump()
              << '\n'
              << std::flush;
    }
    const bool periodic = config.checkpoint.every > 0 && last.step % config.checkpoint.every == 0;
    if (store && (periodic || last.step == config.steps)) {
      if (Status s = Checkpoint(trainer, *store, p); !s.ok()) return Fail(s.message());
    }
  }
  spdlog::info("done: {} steps, final loss {:.4f}{}", trainer.step(), last.loss,
               store ? ", checkpoints in " + store->dir() : "");
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(
    kTrain, {"train",
             "Train in this process: alone, or as one rank of a "
             "data-parallel group",
             [](CLI::App& app) {
               auto o = std::make_shared<TrainOptions>();
               app.add_option("--config", o->config, "job YAML (docs/job-spec.md)")->required();
               app.add_option("--steps", o->steps, "override train.steps");
               app.add_option("--rank", o->rank, "this rank (or RANK)");
               app.add_option("--world", o->world, "number of ranks (or WORLD_SIZE)");
               app.add_option("--store", o->store,
                              "rendezvous directory shared by the ranks (or STORE)");
               app.add_option("--attempt", o->attempt,
                              "restart attempt: communicators of each attempt are "
                              "separate")
                   ->capture_default_str();
               app.add_option("--log-level", o->log_level, "trace|debug|info|warn|error|off")
                   ->capture_default_str();
               return [o] { return RunTrain(*o); };
             }});

}  // namespace difftrain::launch
