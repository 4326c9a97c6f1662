// The per-rank Prometheus metrics a worker daemon serves (docs/metrics.md): built from the reports
// its ranks write on their progress pipes (common/rank_report.h). Every series carries the labels
// job, node, rank, tp, cp, dp, pp. A restarted rank continues its series: gauges take its new
// values, counters keep counting up.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/rank_report.h"

namespace difftrain::worker {

class RankMetrics {
 public:
  RankMetrics();
  ~RankMetrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // The job's name (the controller's, from its registration answer) and this node's.
  void SetJob(const std::string& job, const std::string& node);
  // A line of a rank's progress pipe.
  void Record(const RankReport& report);
  // The rank's process ended (difftrain_rank_up 0 until it reports again).
  void RankExited(int rank);
  // Ranks this daemon runs now.
  void SetRanksRunning(int ranks);

 private:
  struct Series;
  Series& SeriesOf(const RankReport& report);

  std::shared_ptr<prometheus::Registry> registry_;
  std::string job_, node_;
  prometheus::Family<prometheus::Gauge>& up_;
  prometheus::Family<prometheus::Gauge>& info_;
  prometheus::Family<prometheus::Gauge>& iteration_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& lr_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& flops_;
  prometheus::Family<prometheus::Gauge>& peak_flops_;
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& memory_allocated_;
  prometheus::Family<prometheus::Gauge>& memory_reserved_;
  prometheus::Family<prometheus::Gauge>& host_resident_;
  prometheus::Family<prometheus::Counter>& data_wait_;
  prometheus::Family<prometheus::Counter>& comm_;
  prometheus::Family<prometheus::Gauge>& checkpoint_seconds_;
  prometheus::Family<prometheus::Gauge>& last_checkpoint_step_;
  prometheus::Family<prometheus::Gauge>& last_checkpoint_time_;
  prometheus::Family<prometheus::Gauge>& ranks_running_;
  std::map<int, std::unique_ptr<Series>> series_;  // by global rank
};

}  // namespace difftrain::worker
