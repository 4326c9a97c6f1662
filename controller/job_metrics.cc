#include "controller/job_metrics.h"

#include <algorithm>
#include <utility>

#include "common/metrics.h"

namespace difftrain::controller {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::Labels;

double BusySeconds(const JobSnapshot::Rank& r) {
  return r.compute_seconds > 0 ? r.compute_seconds : r.step_seconds;
}

bool Reported(const JobSnapshot::Rank& r) {
  return r.step >= 1 && r.step_seconds > 0;
}

}  // namespace

Straggler FindStraggler(const std::vector<JobSnapshot::Rank>& ranks) {
  std::vector<double> busy;
  Straggler s;
  double slowest = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!Reported(ranks[i])) continue;
    const double b = BusySeconds(ranks[i]);
    busy.push_back(b);
    if (s.rank < 0 || b > slowest) {
      slowest = b;
      s.rank = static_cast<int>(i);
    }
  }
  if (busy.empty()) return s;
  // The lower median: with two ranks, the faster one, so one slow rank of two shows.
  std::nth_element(busy.begin(), busy.begin() + (busy.size() - 1) / 2, busy.end());
  const double median = busy[(busy.size() - 1) / 2];
  s.ratio = median > 0 ? slowest / median : 1;
  return s;
}

JobMetrics::JobMetrics(std::string job, const Topology& topology, double flops_per_sample)
    : job_(std::move(job)),
      topology_(topology),
      flops_per_sample_(flops_per_sample),
      registry_(std::make_shared<prometheus::Registry>()),
      state_(BuildGauge()
                 .Name("difftrain_job_state")
                 .Help("1 for the job's current state (label state), 0 for "
                       "states it left")
                 .Register(*registry_)),
      world_(BuildGauge()
                 .Name("difftrain_job_world_size")
                 .Help("Ranks of the job")
                 .Register(*registry_)
                 .Add({{"job", job_}})),
      workers_up_(BuildGauge()
                      .Name("difftrain_job_workers_up")
                      .Help("Worker daemons registered and not lost")
                      .Register(*registry_)
                      .Add({{"job", job_}})),
      workers_expected_(BuildGauge()
                            .Name("difftrain_job_workers_expected")
                            .Help("Worker daemons the job needs (cluster.nodes)")
                            .Register(*registry_)
                            .Add({{"job", job_}})),
      restarts_(BuildCounter()
                    .Name("difftrain_job_restarts_total")
                    .Help("Restarts of every rank of the job")
                    .Register(*registry_)
                    .Add({{"job", job_}})),
      heartbeat_age_(BuildGauge()
                         .Name("difftrain_job_heartbeat_age_seconds")
                         .Help("Seconds since a worker daemon was last heard from")
                         .Register(*registry_)),
      iteration_(BuildGauge()
                     .Name("difftrain_job_iteration")
                     .Help("Optimizer steps every rank has done (the least of "
                           "the ranks')")
                     .Register(*registry_)
                     .Add({{"job", job_}})),
      samples_per_second_(BuildGauge()
                              .Name("difftrain_job_samples_per_second")
                              .Help("Training samples per second: global batch / the slowest "
                                    "rank's last step seconds")
                              .Register(*registry_)
                              .Add({{"job", job_}})),
      flops_(BuildGauge()
                 .Name("difftrain_job_model_flops_per_second")
                 .Help("Model FLOP/s of the whole job: samples per second x "
                       "training FLOPs "
                       "per sample")
                 .Register(*registry_)
                 .Add({{"job", job_}})),
      straggler_(BuildGauge()
                     .Name("difftrain_job_straggler_ratio")
                     .Help("The slowest rank's busy seconds of its last step "
                           "over the median "
                           "rank's; the labels name the slowest rank")
                     .Register(*registry_)),
      messages_(BuildCounter()
                    .Name("difftrain_controller_messages_total")
                    .Help("Control-plane messages received")
                    .Register(*registry_)
                    .Add({{"job", job_}})),
      heartbeats_(BuildCounter()
                      .Name("difftrain_controller_heartbeats_total")
                      .Help("Heartbeats received from worker daemons")
                      .Register(*registry_)
                      .Add({{"job", job_}})),
      store_requests_(BuildCounter()
                          .Name("difftrain_controller_store_requests_total")
                          .Help("Rendezvous-store requests from ranks")
                          .Register(*registry_)
                          .Add({{"job", job_}})),
      refused_(BuildCounter()
                   .Name("difftrain_controller_refused_connections_total")
                   .Help("Connections refused for an unknown CURVE key")
                   .Register(*registry_)
                   .Add({{"job", job_}})),
      dropped_(BuildCounter()
                   .Name("difftrain_controller_dropped_messages_total")
                   .Help("Messages dropped, by reason (docs/protocol.md)")
                   .Register(*registry_)),
      hangs_(BuildCounter()
                 .Name("difftrain_job_rank_hangs_total")
                 .Help("Ranks the progress watchdog found hung (no step for "
                       "restart.hang_seconds), each followed by a restart")
                 .Register(*registry_)),
      progress_age_(BuildGauge()
                        .Name("difftrain_job_progress_age_seconds")
                        .Help("Seconds since the slowest running rank's step last moved "
                              "(0 unless the job is RUNNING)")
                        .Register(*registry_)
                        .Add({{"job", job_}})) {}

void JobMetrics::Publish(const JobSnapshot& s) {
  prometheus::Gauge*& current = state_gauges_[s.state];
  if (current == nullptr) current = &state_.Add({{"job", job_}, {"state", s.state}});
  for (auto& [name, gauge] : state_gauges_)
    gauge->Set(name == s.state ? 1 : 0);
  world_.Set(s.world);
  workers_up_.Set(static_cast<double>(s.heartbeat_age_seconds.size()));
  workers_expected_.Set(s.workers_expected);
  AdvanceCounter(restarts_, s.restarts);
  AdvanceCounter(messages_, static_cast<double>(s.messages));
  AdvanceCounter(heartbeats_, static_cast<double>(s.heartbeats));
  AdvanceCounter(store_requests_, static_cast<double>(s.store_requests));
  AdvanceCounter(refused_, static_cast<double>(s.refused_connections));
  for (const auto& [reason, n] : s.dropped_by_reason)
    AdvanceCounter(dropped_.Add({{"job", job_}, {"reason", reason}}), static_cast<double>(n));
  for (const auto& [where, n] : s.hangs_by_rank) {
    AdvanceCounter(
        hangs_.Add({{"job", job_}, {"rank", std::to_string(where.first)}, {"node", where.second}}),
        static_cast<double>(n));
  }
  progress_age_.Set(s.progress_age_seconds);

  // A lost daemon's series goes with it.
  for (auto it = heartbeat_gauges_.begin(); it != heartbeat_gauges_.end();) {
    if (s.heartbeat_age_seconds.contains(it->first)) {
      ++it;
    } else {
      heartbeat_age_.Remove(it->second);
      it = heartbeat_gauges_.erase(it);
    }
  }
  for (const auto& [node, age] : s.heartbeat_age_seconds) {
    prometheus::Gauge*& g = heartbeat_gauges_[node];
    if (g == nullptr) g = &heartbeat_age_.Add({{"job", job_}, {"node", node}});
    g->Set(age);
  }

  // Throughput and the straggler, from the ranks that reported a step; kept at their last values
  // while none has (a restart).
  int64_t iteration = -1;
  double slowest_seconds = 0, samples_per_second = 0, rank_flops = 0;
  for (const JobSnapshot::Rank& r : s.ranks) {
    if (!Reported(r)) continue;
    iteration = iteration < 0 ? r.step : std::min(iteration, r.step);
    if (r.step_seconds > slowest_seconds) {
      slowest_seconds = r.step_seconds;
      samples_per_second = r.samples_per_second;
      rank_flops = r.flops_per_second;
    }
  }
  if (iteration < 0) return;
  iteration_.Set(static_cast<double>(iteration));
  samples_per_second_.Set(samples_per_second);
  // The slowest rank's FLOP/s per device times the devices: its step's own FLOPs (a bucket's
  // size where the data come in aspect-ratio buckets); the model's where it reported none.
  flops_.Set(rank_flops > 0 ? rank_flops * s.world : samples_per_second * flops_per_sample_);
  const Straggler straggler = FindStraggler(s.ranks);
  if (straggler.rank >= topology_.world_size()) return;
  const ParallelCoordinates c = topology_.CoordinatesOf(straggler.rank);
  const Labels labels = {{"job", job_},
                         {"node", s.ranks[straggler.rank].node},
                         {"rank", std::to_string(straggler.rank)},
                         {"tp", std::to_string(c.tp)},
                         {"cp", std::to_string(c.cp)},
                         {"dp", std::to_string(c.dp)},
                         {"pp", std::to_string(c.pp)}};
  // One series: the slowest rank's. When another rank becomes the slowest, the old series ends.
  if (straggler_gauge_ != nullptr && labels != straggler_labels_) {
    straggler_.Remove(straggler_gauge_);
    straggler_gauge_ = nullptr;
  }
  if (straggler_gauge_ == nullptr) {
    straggler_gauge_ = &straggler_.Add(labels);
    straggler_labels_ = labels;
  }
  straggler_gauge_->Set(straggler.ratio);
}

}  // namespace difftrain::controller
