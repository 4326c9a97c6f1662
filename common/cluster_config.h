// The cluster sections of the job file: how many nodes and devices the job runs on, when
// the controller gives up on a node or restarts the job, where metrics are served and
// which keys guard the control plane. Read together with the training sections
// (job/job_spec.h) from one YAML file; documented in docs/job-spec.md.
#pragma once

#include <initializer_list>
#include <map>
#include <string>

#include "common/status.h"
#include "common/yaml_fields.h"

namespace difftrain {

struct RestartPolicy {
  int max_restarts = 3;                     // restarts of the whole job before FAILED
  double heartbeat_seconds = 1;             // between a worker daemon's heartbeats
  int heartbeat_misses = 10;                // missed heartbeats before a daemon is lost
  double rendezvous_timeout_seconds = 300;  // for daemons to register and ranks to meet
  // After a checkpoint-stop (a signal) the ranks get this long to finish the step, write a
  // checkpoint and exit; then their daemon kills what is left with SIGKILL. Also the extra
  // time the progress watchdog allows a step that writes a checkpoint or is an attempt's first.
  double stop_grace_seconds = 60;
  // A rank whose step does not move for this long is hung and the job restarts (the progress
  // watchdog). 0: automatic, kHangFactor x the median step time, at least kHangFloorSeconds.
  double hang_seconds = 0;
  static constexpr double kHangFactor = 10;
  static constexpr double kHangFloorSeconds = 60;
};

struct ClusterConfig {
  int nodes = 1;             // worker daemons (one per node)
  int devices_per_node = 1;  // ranks per node (GPUs, or CPU slots without a GPU)
  RestartPolicy restart;
  int metrics_port = 0;  // Prometheus /metrics of the controller (0: off; docs/metrics.md)
  double progress_log_seconds = 10;  // between the controller's progress lines while running
  std::string keys_dir;  // CURVE keys of the job (`difftrain keys`); empty: ephemeral keys

  int world_size() const { return nodes * devices_per_node; }

  // "file:line:col" of each field read from the file, by dotted path ("cluster.nodes"),
  // so that errors found later (the layout) still point into the file. A value set by a
  // command-line flag is located at the flag ("--nodes").
  std::map<std::string, std::string> where;
  std::string Where(const std::string& field) const;
  // Records where[SECTION.KEY] for each of `keys` that `fields` (section `section`) has.
  void Locate(const YamlFields& fields, const std::string& section,
              std::initializer_list<const char*> keys);
};

// Reads the sections cluster, restart, metrics and security of the top-level mapping
// `top` into `config`, checking every value on its own (the layout is checked against the
// parallel sizes by the controller's plan).
Status ReadClusterConfig(YamlFields& top, ClusterConfig& config);

}  // namespace difftrain
