// What a rank reports after each training step: one JSON object per line, written to its worker
// daemon's progress pipe (DIFFTRAIN_PROGRESS_FD) and, when train.metrics_file is set, appended to
// the rank's metrics file. The daemon turns the lines into the rank's Prometheus metrics
// (worker/rank_metrics.h, docs/metrics.md) and relays step, loss, step seconds, samples per second
// and compute seconds to the controller in its heartbeats.
//
// A rank writes one "started" line (event "started", step = the step it resumes from) once its
// communicators are up, then one line per step. Readers take what they understand: a missing or
// mistyped field keeps its default, so old and new ranks and daemons mix.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace difftrain {

struct RankReport {
  std::string event;  // "started" before the first step; empty for a step
  int64_t step = -1;  // optimizer steps done
  int rank = 0;
  // The rank's coordinates in the parallel layout.
  int tp = 0, cp = 0, dp = 0, pp = 0;
  std::string device = "cpu";  // what it computes on: "cpu" or "cuda:J"

  // The step.
  double loss = 0, grad_norm = 0, lr = 0;
  // Passes over the data done (StepStats::epoch); 0 for data without epochs.
  double epoch = 0;
  double step_seconds = 0;
  double samples_per_second = 0;  // the job's: global batch / this rank's step seconds
  double flops_per_second = 0;    // model FLOPs of this rank's share (per device)
  double peak_flops_per_second = 0;
  double mfu = 0;  // flops_per_second / peak_flops_per_second
  // The step's sample size (a latent's height and width) where the data come in aspect-ratio
  // buckets; 0 otherwise.
  int sample_height = 0, sample_width = 0;
  double data_wait_seconds = 0;  // blocked on the data loader in this step
  double comm_wait_seconds = 0;  // waiting for the gradient reduction after backward
  double compute_seconds = 0;    // step seconds minus the seconds blocked in communication
  // Seconds blocked in communication in this step, by group token ("dp", "tp", …) and op.
  std::map<std::string, std::map<std::string, double>> comm_seconds;

  // Memory. On a CPU rank the "device" is the host: allocated = reserved = the bytes of the model's
  // arenas (parameters, gradients, optimizer, EMA, activations).
  int64_t device_memory_allocated_bytes = 0;
  int64_t device_memory_reserved_bytes = 0;
  int64_t host_resident_bytes = 0;                         // the process's resident set
  nlohmann::json memory_bytes = nlohmann::json::object();  // the arenas, one by one

  // Checkpoints.
  double checkpoint_seconds = 0;      // the last checkpoint's duration (0: none yet)
  int64_t last_checkpoint_step = -1;  // the step of the last checkpoint written or resumed

  nlohmann::json ToJson() const;
  // Reads what `j` holds; fields that are missing or of another type keep their defaults.
  static RankReport FromJson(const nlohmann::json& j);
};

// This process's resident set in bytes (/proc/self/statm), 0 when it cannot be read.
int64_t ResidentBytes();

}  // namespace difftrain
