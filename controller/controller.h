// The controller of one job: a state machine over one ROUTER socket.
//
//   PENDING ──all nodes registered──► RENDEZVOUS ──every rank started──► RUNNING
//      RUNNING ──every rank exited 0──► SUCCEEDED
//      RENDEZVOUS | RUNNING ──a rank failed, a node lost or restarted──► RESTARTING
//      RESTARTING ──every node stopped its ranks and the nodes are back──► RENDEZVOUS
//      (restarts exhausted, or a timeout waiting for nodes) ──► FAILED
//      SIGTERM / SIGUSR1 ──► ranks checkpoint and exit ──► CHECKPOINTED (exit 75)
//
// Worker daemons register, get their ranks' assignments and the job file, and send
// heartbeats with their ranks' progress and exits. Ranks reach the same socket for the
// rendezvous store (controller/store_server.h). Every frame is decoded by common/wire.h;
// one that fails is dropped, counted and logged. docs/protocol.md has the messages.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/curve.h"
#include "controller/plan.h"
#include "controller/store_server.h"
#include "job/job_spec.h"

namespace difftrain {
class MetricsEndpoint;
}

namespace difftrain::controller {

class JobMetrics;

// The progress watchdog's limit in seconds: restart.hang_seconds when set, else
// RestartPolicy::kHangFactor x the median of `step_seconds` (the ranks' last step times; zeros
// are ignored), at least RestartPolicy::kHangFloorSeconds.
double HangLimitSeconds(const RestartPolicy& policy, std::vector<double> step_seconds);

enum class JobState {
  kPending,
  kRendezvous,
  kRunning,
  kRestarting,
  kSucceeded,
  kFailed,
  kCheckpointed
};
const char* StateName(JobState state);

// Exit codes of the controller (and of `difftrain run`).
inline constexpr int kExitSucceeded = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitCheckpointed = 75;  // EX_TEMPFAIL: requeue to resume

struct ControllerOptions {
  TrainConfig config;    // with the command line's --nodes/--devices-per-node applied
  std::string job_yaml;  // the job file as written; every rank receives it resolved
  std::string job_name = "job";
  std::string bind = "tcp://0.0.0.0:29400";
  CurveKeys keys;
  // Set (to the signal number) by a signal handler: checkpoint and stop.
  const std::atomic<int>* stop_signal = nullptr;
};

// What the controller counts; logged at the end, exported as metrics (docs/metrics.md).
struct ControllerCounters {
  int64_t messages = 0;
  int64_t dropped = 0;  // malformed, oversized, wrong version or type, unexpected
  std::map<std::string, int64_t> dropped_by_reason;
  int64_t refused_connections = 0;  // wrong CURVE key
  int64_t heartbeats = 0;
  int64_t store_requests = 0;
  int64_t hangs = 0;  // ranks the progress watchdog found hung
};

// The latest progress of one rank (from its worker's heartbeats).
struct RankProgress {
  int64_t step = -1;
  double loss = 0, step_seconds = 0, samples_per_second = 0;
  double compute_seconds = 0;   // step seconds minus the seconds blocked in communication
  double flops_per_second = 0;  // the rank's model FLOP/s (per device); 0: not reported
};

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  static Result<std::unique_ptr<Controller>> Create(ControllerOptions options);
  ~Controller();

  // The endpoint it listens on (with the port chosen when the bind address said 0).
  const std::string& endpoint() const { return endpoint_; }
  // The port of its Prometheus /metrics (config.cluster.metrics_port); 0: none.
  int metrics_port() const;

  // Runs the job to its end and returns the exit code: 0, 1 or 75.
  int Run();

  JobState state() const { return state_; }
  int restarts() const { return restarts_; }
  const ControllerCounters& counters() const { return counters_; }
  int attempt() const { return attempt_; }
  // The latest progress of every rank of the current attempt (index = global rank) and
  // the node running it: what the metrics exporter serves.
  std::vector<std::pair<std::string, RankProgress>> RankProgressSnapshot() const;

 private:
  struct Node {
    std::string name;
    std::string peer;  // ROUTER routing id of its connection
    int devices = 0, gpus = 0, cores = 0;
    int64_t memory_bytes = 0;  // host memory its ranks may use (the machine's, or a limit's)
    std::string memory_limit;  // the cgroup whose limit memory_bytes is; "": the machine's
    std::string gpu_name;      // the first GPU's
    int64_t gpu_memory_bytes = 0;
    Clock::time_point last_seen;
    Clock::time_point last_ack;   // the last heartbeat-ack sent to it
    Clock::time_point last_sent;  // the last message of any kind sent to it
    int slot = -1;                // its place in the plan in this attempt; -1: spare
    bool stopped = false;         // reported that every rank of this attempt has exited
  };
  struct Rank {
    std::string node;
    bool exited = false;
    int exit_code = 0, signal = 0;
    RankProgress progress;
    // The progress watchdog: when the step last moved, and how often it moved since the
    // attempt started running.
    Clock::time_point moved_at;
    int64_t moves = 0;
  };

  explicit Controller(ControllerOptions options);
  Status Bind();

  void OnFrame(const std::string& peer, std::string_view frame);
  void Drop(const std::string& peer, std::string_view reason, const std::string& detail);
  void OnRegister(const std::string& peer, const wire::Message& m);
  void OnHeartbeat(Node& node, const wire::Message& m);
  void OnRankExit(Node& node, const wire::Message& m);
  void OnStopped(Node& node, const wire::Message& m);
  void Step();  // one pass of the loop: ZAP, messages, timers, replies
  void RepeatShutdown();
  void Tick();
  // Hands the job's state to its metrics: at most every 200 ms, unless forced.
  void PublishMetrics(bool force = false);

  void Transition(JobState next, const std::string& why);
  void Launch();
  // `parallel: auto` planned for this machine's device; once the daemons have registered, the
  // layout is chosen again for theirs (the smallest among the placed nodes) and replaces the
  // first choice where it differs. An error when the model fits nowhere on them.
  Status ResolveForWorkers(const std::vector<Node*>& placed);
  void Fail(const std::string& cause);  // restart if allowed, else FAILED
  void StopRanks(const char* mode);
  void Finish(JobState final_state, const std::string& why);
  // A checkpoint-stop ends when every rank has exited or been given up on: CHECKPOINTED.
  void FinishStopIfDone(const std::string& why);
  // Deadlines of a checkpoint-stop (controller/deadlines.cc).
  void CheckStopDeadline(Clock::time_point now);
  // The progress watchdog: restarts the job when a running rank's step stops moving.
  void CheckProgress(Clock::time_point now);
  // A placed node was lost: its ranks live until its daemon notices the silence.
  void FenceLostNode(const Node& node);
  std::string NewestCheckpoint() const;
  bool AllRanksExited() const;
  std::vector<Node*> LiveNodesByName();
  void Send(const std::string& peer, const wire::Message& m);
  Node* NodeOfPeer(const std::string& peer);
  std::map<std::string, Node>::iterator EraseNode(std::map<std::string, Node>::iterator it);

  ControllerOptions o_;
  JobPlan plan_;
  std::string job_yaml_as_written_;  // the job file before resolution
  PlanDevice planned_for_;           // the device the layout was chosen for
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  std::string endpoint_;
  StoreServer store_;
  std::vector<Outgoing> outbox_;

  JobState state_ = JobState::kPending;
  Clock::time_point state_since_;
  int attempt_ = 0;
  int restarts_ = 0;
  // This controller process among the ones that run the job over time (a random id): with the
  // attempt it names the ranks that may commit a checkpoint (kCurrentAttemptKey).
  std::string incarnation_;
  bool checkpoint_requested_ = false;
  Clock::time_point stop_since_;  // when the checkpoint-stop was asked for
  // No attempt starts before this: the ranks of a lost node may train (and commit
  // checkpoints) until their daemon has noticed the controller's silence and killed them.
  Clock::time_point fence_until_;
  bool done_ = false;
  int exit_code_ = kExitFailed;
  std::map<std::string, Node> nodes_;                          // by name
  std::unordered_map<std::string, std::string> node_of_peer_;  // routing id -> name
  Clock::time_point last_health_check_;
  std::vector<Rank> ranks_;
  std::string pending_cause_;  // why the job is restarting
  Clock::time_point last_progress_log_;
  ControllerCounters counters_;
  std::unique_ptr<JobMetrics> metrics_;  // with a metrics port
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  Clock::time_point last_metrics_;
  std::map<std::pair<int, std::string>, int64_t> hangs_by_rank_;  // (rank, node) -> hangs
};

}  // namespace difftrain::controller
