// A training rank's reports (common/rank_report.h): one line per step to the worker daemon that
// started it (the pipe DIFFTRAIN_PROGRESS_FD; the daemon exports them to Prometheus), to the
// rank's metrics file (train.metrics_file, "{rank}" → the rank), rank 0's to TensorBoard event
// files (train.tensorboard_dir) and, in the MPI launch, which has no daemon, to the rank's own
// Prometheus metrics.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "common/rank_report.h"
#include "model/io/tensorboard.h"
#include "model/parallel/timed_comm.h"
#include "model/train/peak_flops.h"
#include "model/train/trainer.h"

namespace difftrain::worker {

class RankMetrics;

class RankReporter {
 public:
  // `comm_times` is where the rank's communicators add their waiting time (TimeComm). `metrics`
  // (optional, must outlive the reporter) records every report too. Measures the CPU's sgemm
  // peak (for MFU) when anyone reads the reports.
  static Result<std::unique_ptr<RankReporter>> Open(const TrainConfig& config,
                                                    const Trainer& trainer,
                                                    const ParallelOptions& parallel,
                                                    parallel::CommTimes& comm_times,
                                                    RankMetrics* metrics = nullptr);
  ~RankReporter();

  // The communicators are up; training continues after `step` (resumed from a checkpoint of that
  // step when it is not 0).
  void Started(int64_t step);
  // A step that took `step_seconds`.
  void Stepped(const StepStats& stats, double step_seconds);
  // A checkpoint of `step` was written in `seconds`.
  void Checkpointed(int64_t step, double seconds);

 private:
  RankReporter(const TrainConfig& config, const Trainer& trainer, parallel::CommTimes& times);
  RankReport Base() const;
  // `write` to tensorboard_, if open.
  void Tensorboard(const std::function<Status(io::TensorBoardWriter&)>& write);
  // To the daemon's pipe and to `metrics_`.
  void Publish(const RankReport& report);

  const TrainConfig& config_;
  const Trainer& trainer_;
  parallel::CommTimes& comm_times_;
  double flops_per_sample_;  // training FLOPs, from the model's family
  int world_ = 1;
  RankReport place_;  // rank, coordinates, device, memory
  PeakFlops peak_;
  int pipe_fd_ = -1;
  RankMetrics* metrics_ = nullptr;
  std::ofstream file_;
  // Rank 0's, with train.tensorboard_dir; dropped after a failed write (logged once: the run
  // goes on without it).
  std::optional<io::TensorBoardWriter> tensorboard_;
  double checkpoint_seconds_ = 0;
  int64_t last_checkpoint_step_ = -1;
};

}  // namespace difftrain::worker
