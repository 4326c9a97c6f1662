#include "worker/rank_reporter.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <utility>

#include <spdlog/spdlog.h>

#include "model/train/gpu_step.h"
#include "worker/rank_metrics.h"

namespace difftrain::worker {
namespace {

std::string MetricsPath(std::string pattern, int rank) {
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) pattern.replace(at, 6, std::to_string(rank));
  return pattern;
}

// The write end of the daemon's progress pipe, made non-blocking (a full pipe loses a line rather
// than stalling training); -1 without a daemon.
int OpenProgressPipe() {
  const char* fd_text = std::getenv("DIFFTRAIN_PROGRESS_FD");
  if (fd_text == nullptr || *fd_text == '\0') return -1;
  const int fd = std::atoi(fd_text);
  if (fd <= 2 || ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return -1;
  return fd;
}

}  // namespace

RankReporter::RankReporter(const TrainConfig& config, const Trainer& trainer,
                           parallel::CommTimes& times)
    : config_(config),
      trainer_(trainer),
      comm_times_(times),
      flops_per_sample_(FamilyOf(config.model).Cost(config.model).training_flops_per_sample()) {}

RankReporter::~RankReporter() = default;

Result<std::unique_ptr<RankReporter>> RankReporter::Open(const TrainConfig& config,
                                                         const Trainer& trainer,
                                                         const ParallelOptions& parallel,
                                                         parallel::CommTimes& comm_times,
                                                         RankMetrics* metrics) {
  std::unique_ptr<RankReporter> r(new RankReporter(config, trainer, comm_times));
  r->metrics_ = metrics;
  RankReport& place = r->place_;
  place.rank = parallel.rank;
  if (parallel.topology) {
    const ParallelCoordinates c = parallel.topology->CoordinatesOf(parallel.rank);
    place.tp = c.tp;
    place.cp = c.cp;
    place.dp = c.dp;
    place.pp = c.pp;
    r->world_ = parallel.topology->world_size();
  }
  // The model's arenas are all it allocates (host memory, or device memory on a GPU), with no
  // caching allocator that would reserve more than they take.
  const GpuStep* gpu = trainer.gpu();
  place.device = gpu ? fmt::format("cuda:{}", gpu->device()) : "cpu";
  const MemoryBytes m = trainer.memory();
  const size_t arenas = m.total();
  place.device_memory_allocated_bytes = place.device_memory_reserved_bytes =
      static_cast<int64_t>(arenas);
  place.memory_bytes = {{"parameters", m.parameters},
                        {"gradients", m.gradients},
                        {"optimizer", m.optimizer},
                        {"ema", m.ema},
                        {"activations", m.activations}};
  if (!config.metrics_file.empty()) {
    const std::string path = MetricsPath(config.metrics_file, parallel.rank);
    r->file_.open(path, std::ios::app);
    if (!r->file_) return Errorf("cannot open metrics file '{}'", path);
  }
  if (!config.tensorboard_dir.empty() && parallel.rank == 0) {
    Result<io::TensorBoardWriter> tensorboard = io::TensorBoardWriter::Open(config.tensorboard_dir);
    if (!tensorboard.ok()) return tensorboard.status().WithContext("train.tensorboard_dir");
    spdlog::info("TensorBoard events: {}", tensorboard->path());
    r->tensorboard_.emplace(std::move(tensorboard).value());
  }
  r->pipe_fd_ = OpenProgressPipe();
  if (gpu) {
    r->peak_ = {GpuPeakFlops(gpu->device_name()), "table: " + gpu->device_name()};
  } else if (r->pipe_fd_ >= 0 || r->file_.is_open() || r->tensorboard_ || metrics != nullptr) {
    DT_ASSIGN_OR_RETURN(r->peak_, CpuPeakFlops());
  }
  if (r->peak_.flops_per_second > 0) {
    spdlog::info("MFU peak {:.1f} GFLOP/s: {}", r->peak_.flops_per_second / 1e9, r->peak_.source);
  }
  return r;
}

RankReport RankReporter::Base() const {
  RankReport r = place_;
  r.step = trainer_.step();
  r.peak_flops_per_second = peak_.flops_per_second;
  r.host_resident_bytes = ResidentBytes();
  r.checkpoint_seconds = checkpoint_seconds_;
  r.last_checkpoint_step = last_checkpoint_step_;
  return r;
}

void RankReporter::Publish(const RankReport& report) {
  if (metrics_ != nullptr) metrics_->Record(report);
  if (pipe_fd_ < 0) return;
  const std::string text = report.ToJson().dump() + "\n";
  (void)!::write(pipe_fd_, text.data(), text.size());
}

void RankReporter::Tensorboard(const std::function<Status(io::TensorBoardWriter&)>& write) {
  if (!tensorboard_) return;
  if (Status s = write(*tensorboard_); !s.ok()) {
    spdlog::warn("train.tensorboard_dir: {}; no more TensorBoard events this attempt", s.message());
    tensorboard_.reset();
  }
}

void RankReporter::Started(int64_t step) {
  if (step > 0) last_checkpoint_step_ = step;
  // Training goes on after `step` (0, or a checkpoint's): what an earlier attempt logged of
  // later steps is retrained, and TensorBoard drops it.
  Tensorboard([&](io::TensorBoardWriter& w) { return w.Restart(step + 1); });
  RankReport r = Base();
  r.event = "started";
  Publish(r);
}

void RankReporter::Stepped(const StepStats& stats, double step_seconds) {
  RankReport r = Base();
  r.step = stats.step;
  r.loss = stats.loss;
  r.grad_norm = stats.grad_norm;
  r.lr = stats.lr;
  r.epoch = stats.epoch;
  r.step_seconds = step_seconds;
  r.samples_per_second = config_.global_batch / step_seconds;
  // A step of aspect-ratio buckets is of its bucket's size: the FLOPs are that size's.
  const double flops_per_sample =
      stats.flops_per_sample > 0 ? stats.flops_per_sample : flops_per_sample_;
  r.flops_per_second = r.samples_per_second * flops_per_sample / world_;
  r.sample_height = stats.sample_size.height;
  r.sample_width = stats.sample_size.width;
  r.mfu = peak_.flops_per_second > 0 ? r.flops_per_second / peak_.flops_per_second : 0;
  r.data_wait_seconds = stats.data_wait_seconds;
  r.comm_wait_seconds = stats.comm_wait_seconds;
  r.comm_seconds = comm_times_.Take();
  double blocked = 0;
  for (const auto& [group, ops] : r.comm_seconds) {
    for (const auto& [op, seconds] : ops)
      blocked += seconds;
  }
  r.compute_seconds = std::max(0.0, step_seconds - blocked);
  Publish(r);
  if (file_.is_open()) file_ << r.ToJson().dump() << '\n' << std::flush;
  Tensorboard([&](io::TensorBoardWriter& w) {
    return w.Scalars(r.step, {{"train/loss", r.loss},
                              {"train/grad_norm", r.grad_norm},
                              {"train/lr", r.lr},
                              {"train/epoch", r.epoch},
                              {"perf/step_seconds", r.step_seconds},
                              {"perf/samples_per_second", r.samples_per_second},
                              {"perf/tflops_per_second", r.flops_per_second / 1e12},
                              {"perf/mfu", r.mfu},
                              {"perf/data_wait_seconds", r.data_wait_seconds}});
  });
}

void RankReporter::Checkpointed(int64_t step, double seconds) {
  last_checkpoint_step_ = step;
  checkpoint_seconds_ = seconds;
  // What writing it allocated beside the arenas, and freed (PlanCheckpointMemory).
  place_.memory_bytes["checkpoint"] = trainer_.checkpoint_peak_bytes();
}

}  // namespace difftrain::worker
