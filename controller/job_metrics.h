// The per-job Prometheus metrics the controller serves (docs/metrics.md): its state, size, daemons
// and their heartbeats, restarts, the job's throughput, the straggler ratio, and the control
// plane's counters. The controller hands a snapshot of itself to Publish a few times a second;
// scrapes read the registry from the exposer's threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "common/topology.h"

namespace difftrain::controller {

struct JobSnapshot {
  std::string state;  // StateName(...)
  int world = 0;
  int workers_expected = 0;
  int restarts = 0;
  // Every registered worker daemon and the seconds since it was last heard from.
  std::map<std::string, double> heartbeat_age_seconds;
  struct Rank {
    std::string node;
    int64_t step = -1;
    double step_seconds = 0, compute_seconds = 0, samples_per_second = 0;
    // The rank's model FLOP/s per device, each step's at its own size (aspect-ratio buckets);
    // 0 where the rank did not report it.
    double flops_per_second = 0;
  };
  std::vector<Rank> ranks;  // by global rank (of the current attempt)
  // The control plane's counts (ControllerCounters).
  int64_t messages = 0, heartbeats = 0, store_requests = 0, refused_connections = 0;
  std::map<std::string, int64_t> dropped_by_reason;
  // The progress watchdog: hangs found so far by (rank, node), and the seconds since the
  // slowest running rank's step last moved (0 unless RUNNING).
  std::map<std::pair<int, std::string>, int64_t> hangs_by_rank;
  double progress_age_seconds = 0;
};

// The straggler among `ranks`: the rank with the longest busy time of its last step (compute
// seconds when reported, else step seconds) and that time over the median of all ranks that
// reported a step. Ratio 0 (rank −1) when no rank has reported one.
struct Straggler {
  int rank = -1;
  double ratio = 0;
};
Straggler FindStraggler(const std::vector<JobSnapshot::Rank>& ranks);

class JobMetrics {
 public:
  // `topology` gives the straggler's coordinates; `flops_per_sample` (training FLOPs of one sample)
  // turns samples per second into FLOP/s.
  JobMetrics(std::string job, const Topology& topology, double flops_per_sample);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void Publish(const JobSnapshot& snapshot);

 private:
  std::string job_;
  Topology topology_;
  double flops_per_sample_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& state_;
  prometheus::Gauge& world_;
  prometheus::Gauge& workers_up_;
  prometheus::Gauge& workers_expected_;
  prometheus::Counter& restarts_;
  prometheus::Family<prometheus::Gauge>& heartbeat_age_;
  prometheus::Gauge& iteration_;
  prometheus::Gauge& samples_per_second_;
  prometheus::Gauge& flops_;
  prometheus::Family<prometheus::Gauge>& straggler_;
  prometheus::Counter& messages_;
  prometheus::Counter& heartbeats_;
  prometheus::Counter& store_requests_;
  prometheus::Counter& refused_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Family<prometheus::Counter>& hangs_;
  prometheus::Gauge& progress_age_;
  std::map<std::string, prometheus::Gauge*> state_gauges_;      // by state name
  std::map<std::string, prometheus::Gauge*> heartbeat_gauges_;  // by node
  prometheus::Gauge* straggler_gauge_ = nullptr;
  prometheus::Labels straggler_labels_;
};

}  // namespace difftrain::controller
