// `difftrain train --config JOB.yaml`: one training process, no daemons. Resumes from the
// newest complete checkpoint of checkpoint.dir and writes checkpoints as configured.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "launch/command.h"
#include "model/train/checkpointing.h"

namespace difftrain::launch {
namespace {

struct TrainOptions {
  std::string config;
  std::optional<int64_t> steps;
  std::string log_level = "info";
};

// Progress of the run: one line rewritten in place on a terminal, or a log line every
// log_every steps when the output is a file or pipe.
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

Status Checkpoint(const Trainer& trainer, const io::CheckpointStore& store) {
  DT_RETURN_IF_ERROR(WriteCheckpointShard(trainer, store, 0, 1));
  DT_RETURN_IF_ERROR(store.Commit(trainer.step(), 1));
  spdlog::info("checkpoint step {} written to {}", trainer.step(), store.StepDir(trainer.step()));
  return Status::Ok();
}

int RunTrain(const TrainOptions& o) {
  if (Status s = SetupLogging(o.log_level); !s.ok()) return ReportBadInput("train", s.message());
  Result<TrainConfig> loaded = TrainConfig::FromYamlFile(o.config);
  if (!loaded.ok()) return ReportBadInput("train", loaded.status().message());
  TrainConfig config = *loaded;
  if (o.steps) {
    config.steps = *o.steps;
    if (Status s = config.Validate(); !s.ok()) return ReportBadInput("train", s.message());
  }
  const DiTConfig& m = config.model;
  Trainer trainer(config, std::make_unique<SyntheticDataset>(config.seed, m.in_channels,
                                                             m.input_size, m.num_classes));
  std::optional<io::CheckpointStore> store;
  if (!config.checkpoint.dir.empty()) {
    store.emplace(config.checkpoint.dir, config.checkpoint.keep);
    Result<std::optional<int64_t>> resumed = RestoreLatestCheckpoint(trainer, *store, 0, 1);
    if (!resumed.ok()) {
      spdlog::error("{}", resumed.status().message());
      return kExitJobFailed;
    }
    if (*resumed) spdlog::info("resumed from step {} of {}", **resumed, store->dir());
  }
  spdlog::info(
      "training {} ({} parameters, {:.2f} GFLOP per sample) for {} steps, global batch "
      "{} = micro {} x accumulation {}",
      m.name, ParameterCount(m), TrainingFlopsPerSample(m) / 1e9, config.steps, config.global_batch,
      config.micro_batch, config.AccumulationSteps());

  Progress progress(config, trainer.step());
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  StepStats last;
  while (trainer.step() < config.steps) {
    const auto t0 = Clock::now();
    Result<StepStats> stats = trainer.Step();
    if (!stats.ok()) {
      spdlog::error("step {}: {}", trainer.step() + 1, stats.status().message());
      return kExitJobFailed;
    }
    last = *stats;
    const auto t1 = Clock::now();
    progress.Report(last, std::chrono::duration<double>(t1 - t0).count(),
                    std::chrono::duration<double>(t1 - start).count());
    const bool periodic = config.checkpoint.every > 0 && last.step % config.checkpoint.every == 0;
    if (store && (periodic || last.step == config.steps)) {
      if (Status s = Checkpoint(trainer, *store); !s.ok()) {
        spdlog::error("{}", s.message());
        return kExitJobFailed;
      }
    }
  }
  spdlog::info("done: {} steps, final loss {:.4f}{}", trainer.step(), last.loss,
               store ? ", checkpoints in " + store->dir() : "");
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(
    kTrain, {"train", "Train in this one process (no daemons)", [](CLI::App& app) {
               auto o = std::make_shared<TrainOptions>();
               app.add_option("--config", o->config, "job YAML (docs/job-spec.md)")->required();
               app.add_option("--steps", o->steps, "override train.steps");
               app.add_option("--log-level", o->log_level, "trace|debug|info|warn|error|off")
                   ->capture_default_str();
               return [o] { return RunTrain(*o); };
             }});

}  // namespace difftrain::launch
