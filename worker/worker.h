// The worker daemon: one per node. It registers with the controller over one DEALER
// socket, starts one rank process (`difftrain train`) per assigned device without a
// shell, relays the ranks' progress in its heartbeats and their exits, and stops them
// when told to, or when the controller has been silent for longer than its timeout.
//
// Ranks get their place in the job from the environment: RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, STORE (the controller's address: the rendezvous store),
// DIFFTRAIN_KEYS, DIFFTRAIN_DEVICE, DIFFTRAIN_ATTEMPT, DIFFTRAIN_PROGRESS_FD (a pipe on
// which the rank writes one JSON line per step) and OMP_NUM_THREADS (cores / ranks).
#pragma once

#include <atomic>
#include <string>

#include "common/status.h"

namespace difftrain::worker {

struct WorkerOptions {
  std::string controller;  // tcp://HOST:PORT or ipc://PATH
  std::string node;        // this node's name
  std::string keys_dir;    // the job's keys (also handed to the ranks)
  int devices = 0;         // ranks this node can run; 0: GPUs, else CPU cores
  std::string binary;      // the `difftrain` executable the ranks run
  std::string work_dir;    // where the job file is written for the ranks
  // Set (to the signal number) by a signal handler: the ranks checkpoint, then it exits.
  const std::atomic<int>* stop_signal = nullptr;
  // Give up when no controller answers the registration for this long.
  double register_timeout_seconds = 600;
  // Serve the ranks' Prometheus metrics on this port (docs/metrics.md); 0: off.
  int metrics_port = 0;
};

// Runs the daemon until the controller ends the job (returns the job's exit code: 0, 1
// or 75), the controller is lost (1) or a signal stops it (75). Bad usage: 2.
int RunWorker(const WorkerOptions& options);

// The devices of this machine: CUDA devices, else CPU cores.
struct NodeResources {
  int gpus = 0;
  std::string gpu_name;          // the first GPU's, as the driver reports it
  int64_t gpu_memory_bytes = 0;  // of the first GPU
  int cores = 1;                 // those this process may run on (its CPU affinity: a cpuset)
  int64_t memory_bytes = 0;  // host memory its ranks may use: the machine's, or its cgroup's limit
  std::string memory_limit;  // the cgroup whose limit that is ("" where it is the machine's)
};
NodeResources DetectResources();

}  // namespace difftrain::worker
