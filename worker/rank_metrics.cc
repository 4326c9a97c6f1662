#include "worker/rank_metrics.h"

#include <utility>

#include "common/metrics.h"

namespace difftrain::worker {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Labels;

template <typename Builder>
auto& Register(Builder builder, prometheus::Registry& registry, const char* name,
               const char* help) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

// The series of one rank: its labels and the metrics made with them.
struct RankMetrics::Series {
  Labels labels;
  prometheus::Gauge *up, *iteration, *loss, *grad_norm, *lr, *epoch, *samples_per_second, *flops,
      *peak_flops, *mfu, *memory_allocated, *memory_reserved, *host_resident, *checkpoint_seconds,
      *last_checkpoint_step, *last_checkpoint_time;
  int64_t timed_checkpoint_step = INT64_MIN;  // the checkpoint last_checkpoint_time is of
  prometheus::Histogram* step_seconds;
  prometheus::Counter* data_wait;
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> comm;  // (group, op)
};

RankMetrics::RankMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      up_(Register(BuildGauge(), *registry_, "difftrain_rank_up",
                   "1 while the rank's process runs, 0 after it exited")),
      info_(Register(BuildGauge(), *registry_, "difftrain_rank_info",
                     "Always 1; the device label says what the rank computes on")),
      iteration_(
          Register(BuildGauge(), *registry_, "difftrain_rank_iteration", "Optimizer steps done")),
      loss_(Register(BuildGauge(), *registry_, "difftrain_rank_loss",
                     "Training loss of the last step (mean over the global batch)")),
      grad_norm_(Register(BuildGauge(), *registry_, "difftrain_rank_grad_norm",
                          "Global gradient norm of the last step, before clipping")),
      lr_(Register(BuildGauge(), *registry_, "difftrain_rank_learning_rate",
                   "Learning rate of the last step")),
      epoch_(Register(BuildGauge(), *registry_, "difftrain_rank_epoch",
                      "Passes over the data done: the data's samples trained on / the samples of "
                      "an epoch (0 for data without epochs)")),
      step_seconds_(Register(BuildHistogram(), *registry_, "difftrain_rank_step_seconds",
                             "Wall time of each training step")),
      samples_per_second_(Register(BuildGauge(), *registry_, "difftrain_rank_samples_per_second",
                                   "The job's samples per second by this "
                                   "rank's last step: global batch / "
                                   "step seconds")),
      flops_(Register(BuildGauge(), *registry_, "difftrain_rank_model_flops_per_second",
                      "Model FLOP/s of this rank (per device) in the last "
                      "step: training FLOPs "
                      "of the global batch / step seconds / world size")),
      peak_flops_(Register(BuildGauge(), *registry_, "difftrain_rank_peak_flops_per_second",
                           "The device peak MFU is measured against")),
      mfu_(Register(BuildGauge(), *registry_, "difftrain_rank_mfu_ratio",
                    "Model FLOPs utilisation of the last step: model FLOP/s / "
                    "device peak")),
      memory_allocated_(Register(BuildGauge(), *registry_,
                                 "difftrain_rank_device_memory_allocated_bytes",
                                 "Bytes the rank's model state and activations "
                                 "take on its device (host on CPU)")),
      memory_reserved_(Register(BuildGauge(), *registry_,
                                "difftrain_rank_device_memory_reserved_bytes",
                                "Bytes the rank holds on its device (= allocated on CPU)")),
      host_resident_(Register(BuildGauge(), *registry_, "difftrain_rank_host_resident_bytes",
                              "Resident set of the rank's process")),
      data_wait_(Register(BuildCounter(), *registry_, "difftrain_rank_data_wait_seconds_total",
                          "Seconds the rank waited for the data loader")),
      comm_(Register(BuildCounter(), *registry_, "difftrain_rank_comm_seconds_total",
                     "Seconds the rank was blocked in communication, by group and op")),
      checkpoint_seconds_(Register(BuildGauge(), *registry_, "difftrain_rank_checkpoint_seconds",
                                   "Duration of the rank's last checkpoint")),
      last_checkpoint_step_(Register(BuildGauge(), *registry_,
                                     "difftrain_rank_last_checkpoint_step",
                                     "Step of the last checkpoint written or resumed from")),
      last_checkpoint_time_(Register(BuildGauge(), *registry_,
                                     "difftrain_rank_last_checkpoint_timestamp_seconds",
                                     "Unix time of the last checkpoint written or resumed from "
                                     "(before any, of the rank's first report)")),
      ranks_running_(Register(BuildGauge(), *registry_, "difftrain_worker_ranks_running",
                              "Rank processes this worker daemon runs")) {}

RankMetrics::~RankMetrics() = default;

void RankMetrics::SetJob(const std::string& job, const std::string& node) {
  job_ = job;
  node_ = node;
}

RankMetrics::Series& RankMetrics::SeriesOf(const RankReport& r) {
  const Labels labels = {{"job", job_},
                         {"node", node_},
                         {"rank", std::to_string(r.rank)},
                         {"tp", std::to_string(r.tp)},
                         {"cp", std::to_string(r.cp)},
                         {"dp", std::to_string(r.dp)},
                         {"pp", std::to_string(r.pp)}};
  std::unique_ptr<Series>& s = series_[r.rank];
  if (s && s->labels == labels) return *s;
  // The metrics of labels already seen are found again, so a rank that moves back (a new job name
  // is not expected, but costs nothing) continues its series.
  s = std::make_unique<Series>();
  s->labels = labels;
  s->up = &up_.Add(labels);
  s->iteration = &iteration_.Add(labels);
  s->loss = &loss_.Add(labels);
  s->grad_norm = &grad_norm_.Add(labels);
  s->lr = &lr_.Add(labels);
  s->epoch = &epoch_.Add(labels);
  s->step_seconds = &step_seconds_.Add(labels, StepSecondsBuckets());
  s->samples_per_second = &samples_per_second_.Add(labels);
  s->flops = &flops_.Add(labels);
  s->peak_flops = &peak_flops_.Add(labels);
  s->mfu = &mfu_.Add(labels);
  s->memory_allocated = &memory_allocated_.Add(labels);
  s->memory_reserved = &memory_reserved_.Add(labels);
  s->host_resident = &host_resident_.Add(labels);
  s->data_wait = &data_wait_.Add(labels);
  s->checkpoint_seconds = &checkpoint_seconds_.Add(labels);
  s->last_checkpoint_step = &last_checkpoint_step_.Add(labels);
  s->last_checkpoint_time = &last_checkpoint_time_.Add(labels);
  return *s;
}

void RankMetrics::Record(const RankReport& r) {
  Series& s = SeriesOf(r);
  s.up->Set(1);
  Labels info = s.labels;
  info["device"] = r.device;
  info_.Add(info).Set(1);
  s.iteration->Set(static_cast<double>(std::max<int64_t>(0, r.step)));
  s.peak_flops->Set(r.peak_flops_per_second);
  s.memory_allocated->Set(static_cast<double>(r.device_memory_allocated_bytes));
  s.memory_reserved->Set(static_cast<double>(r.device_memory_reserved_bytes));
  s.host_resident->Set(static_cast<double>(r.host_resident_bytes));
  s.checkpoint_seconds->Set(r.checkpoint_seconds);
  s.last_checkpoint_step->Set(static_cast<double>(r.last_checkpoint_step));
  // Since when the rank's progress is in no checkpoint: what the checkpoint-age alert measures
  // (k8s/difftrain/templates/prometheus-rules.yaml). Before the first checkpoint, since the
  // rank first reported.
  if (r.last_checkpoint_step != s.timed_checkpoint_step) {
    s.timed_checkpoint_step = r.last_checkpoint_step;
    s.last_checkpoint_time->SetToCurrentTime();
  }
  if (!r.event.empty()) return;  // "started": no step yet
  s.loss->Set(r.loss);
  s.grad_norm->Set(r.grad_norm);
  s.lr->Set(r.lr);
  s.epoch->Set(r.epoch);
  s.step_seconds->Observe(r.step_seconds);
  s.samples_per_second->Set(r.samples_per_second);
  s.flops->Set(r.flops_per_second);
  s.mfu->Set(r.mfu);
  s.data_wait->Increment(std::max(0.0, r.data_wait_seconds));
  for (const auto& [group, ops] : r.comm_seconds) {
    for (const auto& [op, seconds] : ops) {
      prometheus::Counter*& c = s.comm[{group, op}];
      if (c == nullptr) {
        Labels labels = s.labels;
        labels["group"] = group;
        labels["op"] = op;
        c = &comm_.Add(labels);
      }
      c->Increment(std::max(0.0, seconds));
    }
  }
}

void RankMetrics::RankExited(int rank) {
  auto it = series_.find(rank);
  if (it != series_.end()) it->second->up->Set(0);
}

void RankMetrics::SetRanksRunning(int ranks) {
  ranks_running_.Add({{"job", job_}, {"node", node_}}).Set(ranks);
}

}  // namespace difftrain::worker
