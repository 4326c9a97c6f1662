// The controller's handling of what its workers send (controller/controller.h): each frame
// decoded and dispatched by type, a worker's registration, its heartbeats (and what they say of
// its ranks), a rank's exit and a worker's report that its ranks stopped.
#include "controller/controller.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace difftrain::controller {

using wire::Message;
using wire::MessageType;

void Controller::OnFrame(const std::string& peer, std::string_view frame) {
  ++counters_.messages;
  Result<Message> decoded = wire::Decode(frame);
  if (!decoded.ok()) {
    Drop(peer, wire::DropReason(decoded.status()), decoded.status().message());
    return;
  }
  const Message& m = *decoded;
  switch (m.type) {
    case MessageType::kStoreSet:
    case MessageType::kStoreGet:
    case MessageType::kStoreAdd:
      ++counters_.store_requests;
      store_.Handle(peer, m, Clock::now(), outbox_);
      return;
    case MessageType::kRegister:
      OnRegister(peer, m);
      return;
    default:
      break;
  }
  Node* node = NodeOfPeer(peer);
  if (node == nullptr) {
    Drop(peer, "unexpected",
         fmt::format("{} from a peer that has not registered", wire::TypeName(m.type)));
    return;
  }
  node->last_seen = Clock::now();
  switch (m.type) {
    case MessageType::kHeartbeat:
      OnHeartbeat(*node, m);
      return;
    case MessageType::kRankExit:
      OnRankExit(*node, m);
      return;
    case MessageType::kStopped:
      OnStopped(*node, m);
      return;
    default:
      Drop(peer, "unexpected",
           fmt::format("{} is not a message for the controller", wire::TypeName(m.type)));
  }
}

void Controller::OnRegister(const std::string& peer, const Message& m) {
  const std::string name = m.header["node"].get<std::string>();
  auto it = nodes_.find(name);
  if (it != nodes_.end() && it->second.peer != peer) {
    // The daemon restarted (its ranks died with it) or a second one took the name.
    const bool placed = it->second.slot >= 0;
    spdlog::warn("controller: node {} registered again from a new connection", name);
    EraseNode(it);
    if (placed && (state_ == JobState::kRendezvous || state_ == JobState::kRunning)) {
      Fail(fmt::format("node {} re-registered: its worker daemon restarted", name));
    }
  }
  Node& node = nodes_[name];
  const bool fresh = node.peer.empty();
  node.name = name;
  node.peer = peer;
  node_of_peer_[peer] = name;
  node.devices = m.header["devices"].get<int>();
  node.gpus = m.header["gpus"].get<int>();
  node.cores = m.header["cores"].get<int>();
  node.memory_bytes = m.header["memory_bytes"].get<int64_t>();
  node.memory_limit = m.header["memory_limit"].get<std::string>();
  node.gpu_name = m.header["gpu_name"].get<std::string>();
  node.gpu_memory_bytes = m.header["gpu_memory_bytes"].get<int64_t>();
  node.last_seen = Clock::now();
  if (fresh) {
    node.slot = -1;
    node.stopped = true;  // a new daemon runs no ranks
    spdlog::info(
        "controller: node {} registered ({} devices, {} GPUs, {} cores, {:.1f} GiB{}); {} of {} "
        "nodes",
        name, node.devices, node.gpus, node.cores, node.memory_bytes / 1073741824.0,
        node.memory_limit.empty() ? "" : ": a cgroup's memory limit", nodes_.size(), plan_.nodes);
    if (node.gpus > 0 && node.gpus < plan_.devices_per_node) {
      spdlog::warn("controller: node {} has {} GPUs for {} ranks per node", name, node.gpus,
                   plan_.devices_per_node);
    }
  }
  const RestartPolicy& r = o_.config.cluster.restart;
  const int64_t heartbeat_ms = std::max<int64_t>(1, std::llround(r.heartbeat_seconds * 1000));
  Send(peer, {MessageType::kRegistered,
              {{"node", name},
               {"job", o_.job_name},
               {"heartbeat_ms", heartbeat_ms},
               {"timeout_ms", heartbeat_ms * r.heartbeat_misses}},
              ""});
  if (state_ == JobState::kPending && static_cast<int>(nodes_.size()) >= plan_.nodes) Launch();
}

void Controller::OnHeartbeat(Node& node, const Message& m) {
  ++counters_.heartbeats;
  // The daemon needs to hear from the controller within its timeout (heartbeat_misses
  // heartbeats), not after every heartbeat: an ack a quarter of that apart is plenty and
  // halves the controller's messages on a large cluster.
  const RestartPolicy& policy = o_.config.cluster.restart;
  const auto ack_every =
      std::chrono::duration<double>(policy.heartbeat_seconds * policy.heartbeat_misses / 4);
  if (node.last_seen - node.last_ack >= ack_every) {
    node.last_ack = node.last_seen;
    Send(node.peer, {MessageType::kHeartbeatAck, nlohmann::json::object(), ""});
  }
  if (m.header["attempt"].get<int>() != attempt_ || node.slot < 0) return;
  for (const nlohmann::json& r : m.header["ranks"]) {
    const int rank = r["rank"].get<int>();
    if (rank >= static_cast<int>(ranks_.size()) || ranks_[rank].node != node.name) continue;
    Rank& moving = ranks_[rank];
    RankProgress& p = moving.progress;
    if (const int64_t step = r["step"].get<int64_t>(); step != p.step) {
      moving.moved_at = node.last_seen;
      ++moving.moves;
    }
    p.step = r["step"].get<int64_t>();
    p.loss = r["loss"].get<double>();
    p.step_seconds = r["step_seconds"].get<double>();
    p.samples_per_second = r["samples_per_second"].get<double>();
    p.flops_per_second = r["flops_per_second"].get<double>();
    p.compute_seconds = r["compute_seconds"].get<double>();
  }
  if (state_ == JobState::kRendezvous &&
      std::all_of(ranks_.begin(), ranks_.end(),
                  [](const Rank& r) { return r.progress.step >= 0 || r.exited; })) {
    // The watchdog counts from here, and allows the first step its slow start.
    for (Rank& r : ranks_) {
      r.moved_at = node.last_seen;
      r.moves = 0;
    }
    Transition(JobState::kRunning,
               fmt::format("all {} ranks have met (attempt {})", ranks_.size(), attempt_));
  }
}

void Controller::OnRankExit(Node& node, const Message& m) {
  const int rank = m.header["rank"].get<int>();
  if (m.header["attempt"].get<int>() != attempt_ || rank >= static_cast<int>(ranks_.size()) ||
      ranks_[rank].node != node.name || ranks_[rank].exited) {
    return;  // an exit of an earlier attempt, or one already known
  }
  Rank& r = ranks_[rank];
  r.exited = true;
  r.exit_code = m.header["exit_code"].get<int>();
  r.signal = m.header["signal"].get<int>();
  const std::string how =
      !r.signal ? fmt::format("exited with code {}", r.exit_code)
      : m.header["oom_killed"].get<int>() != 0
          ? fmt::format(
                "was killed by signal {} by the kernel's OOM killer (out of host memory "
                "on its node: the machine's, or its worker daemon's cgroup limit)",
                r.signal)
          : fmt::format("was killed by signal {}", r.signal);
  if (state_ != JobState::kRendezvous && state_ != JobState::kRunning) return;
  const bool clean = r.signal == 0 && r.exit_code == 0;
  const bool checkpointed = r.signal == 0 && r.exit_code == kExitCheckpointed;
  if (clean || checkpointed || checkpoint_requested_) {
    spdlog::info("controller: rank {} on node {} {}", rank, node.name, how);
    if (checkpointed && !checkpoint_requested_) {
      // A rank was told to stop by someone else (its daemon got SIGTERM): the others
      // stop at the same step anyway, since the ranks agree on stopping every step.
      checkpoint_requested_ = true;
      stop_since_ = Clock::now();
      StopRanks("checkpoint");
    }
    FinishStopIfDone("the ranks checkpointed and stopped on request");
    return;
  }
  Fail(fmt::format("rank {} on node {} {}", rank, node.name, how));
}

void Controller::OnStopped(Node& node, const Message& m) {
  if (m.header["attempt"].get<int>() == attempt_) node.stopped = true;
}

std::vector<std::pair<std::string, RankProgress>> Controller::RankProgressSnapshot() const {
  std::vector<std::pair<std::string, RankProgress>> snapshot;
  snapshot.reserve(ranks_.size());
  for (const Rank& r : ranks_)
    snapshot.emplace_back(r.node, r.progress);
  return snapshot;
}

bool Controller::AllRanksExited() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
}

}  // namespace difftrain::controller
