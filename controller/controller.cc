#include "controller/controller.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/attempt_fence.h"
#include "common/metrics.h"
#include "controller/job_metrics.h"

namespace difftrain::controller {

using std::chrono::duration;
using std::chrono::milliseconds;
using wire::Message;
using wire::MessageType;

const char* StateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "PENDING";
    case JobState::kRendezvous:
      return "RENDEZVOUS";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kRestarting:
      return "RESTARTING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCheckpointed:
      return "CHECKPOINTED";
  }
  return "?";
}

namespace {

// A frame larger than this closes the sender's connection inside libzmq; smaller ones
// that are still too large reach the decoder, which drops and counts them.
constexpr int64_t kHardMessageLimit = 4 * wire::kMaxMessageBytes;
constexpr int kHighWaterMark = 1 << 20;

double Seconds(StoreServer::Clock::duration d) {
  return duration<double>(d).count();
}

}  // namespace

Controller::Controller(ControllerOptions options)
    : o_(std::move(options)), context_(1), router_(context_, zmq::socket_type::router) {
  std::random_device random;
  incarnation_ = fmt::format("{:08x}{:08x}", random(), random());
}

Controller::~Controller() {
  router_.close();
  zap_.reset();
  context_.close();
}

Result<std::unique_ptr<Controller>> Controller::Create(ControllerOptions options) {
  DT_ASSIGN_OR_RETURN(JobPlan plan, MakePlan(options.config));
  // The ranks receive the job as resolved here (layout chosen, cluster size applied).
  std::string as_written = options.job_yaml;
  DT_ASSIGN_OR_RETURN(options.job_yaml, ResolvedJobYaml(as_written, options.config));
  std::unique_ptr<Controller> c(new Controller(std::move(options)));
  c->plan_ = std::move(plan);
  c->job_yaml_as_written_ = std::move(as_written);
  c->planned_for_ = LocalPlanDevice();
  DT_RETURN_IF_ERROR(c->Bind());
  if (const int port = c->o_.config.cluster.metrics_port; port != 0) {
    const JobPlan& p = c->plan_;
    DT_ASSIGN_OR_RETURN(const Topology topology, Topology::Create(p.tp, p.cp, p.dp, p.pp));
    c->metrics_ = std::make_unique<JobMetrics>(
        c->o_.job_name, topology,
        FamilyOf(c->o_.config.model).Cost(c->o_.config.model).training_flops_per_sample());
    DT_ASSIGN_OR_RETURN(c->metrics_endpoint_,
                        MetricsEndpoint::Start(port, c->metrics_->registry()));
  }
  return c;
}

int Controller::metrics_port() const {
  return metrics_endpoint_ ? metrics_endpoint_->port() : 0;
}

void Controller::PublishMetrics(bool force) {
  const Clock::time_point now = Clock::now();
  if (!metrics_ || (!force && now - last_metrics_ < milliseconds(200))) return;
  last_metrics_ = now;
  JobSnapshot s;
  s.state = StateName(state_);
  s.world = plan_.world;
  s.workers_expected = plan_.nodes;
  s.restarts = restarts_;
  for (const auto& [name, node] : nodes_)
    s.heartbeat_age_seconds[name] = Seconds(now - node.last_seen);
  for (const Rank& r : ranks_) {
    s.ranks.push_back({r.node, r.progress.step, r.progress.step_seconds, r.progress.compute_seconds,
                       r.progress.samples_per_second, r.progress.flops_per_second});
  }
  s.messages = counters_.messages;
  s.heartbeats = counters_.heartbeats;
  s.store_requests = counters_.store_requests;
  s.refused_connections = zap_->refused();
  s.dropped_by_reason = counters_.dropped_by_reason;
  s.hangs_by_rank = hangs_by_rank_;
  if (state_ == JobState::kRunning) {
    for (const Rank& r : ranks_) {
      if (!r.exited)
        s.progress_age_seconds = std::max(s.progress_age_seconds, Seconds(now - r.moved_at));
    }
  }
  metrics_->Publish(s);
}

Status Controller::Bind() {
  // The ZAP handler first: no handshake may happen before it can refuse one.
  zap_ = std::make_unique<ZapHandler>(context_, o_.keys);
  router_.set(zmq::sockopt::linger, 2000);
  router_.set(zmq::sockopt::maxmsgsize, kHardMessageLimit);
  router_.set(zmq::sockopt::rcvhwm, kHighWaterMark);
  router_.set(zmq::sockopt::sndhwm, kHighWaterMark);
  MakeCurveServer(router_, o_.keys);
  try {
    router_.bind(o_.bind);
  } catch (const zmq::error_t& e) {
    return Errorf("binding the controller to {}: {}", o_.bind, e.what());
  }
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  return Status::Ok();
}

void Controller::Transition(JobState next, const std::string& why) {
  const Clock::time_point now = Clock::now();
  spdlog::info("controller: {} -> {} after {:.1f} s: {}", StateName(state_), StateName(next),
               Seconds(now - state_since_), why);
  state_ = next;
  state_since_ = now;
  PublishMetrics(/*force=*/true);
}

void Controller::Send(const std::string& peer, const Message& m) {
  if (Node* node = NodeOfPeer(peer)) node->last_sent = Clock::now();
  const std::string frame = wire::Encode(m);
  // Non-blocking: a peer that is gone or not reading loses the message, never the loop.
  if (router_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    router_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  }
}

Controller::Node* Controller::NodeOfPeer(const std::string& peer) {
  auto name = node_of_peer_.find(peer);
  if (name == node_of_peer_.end()) return nullptr;
  auto node = nodes_.find(name->second);
  return node == nodes_.end() ? nullptr : &node->second;
}

std::map<std::string, Controller::Node>::iterator Controller::EraseNode(
    std::map<std::string, Node>::iterator it) {
  node_of_peer_.erase(it->second.peer);
  return nodes_.erase(it);
}

std::vector<Controller::Node*> Controller::LiveNodesByName() {
  std::vector<Node*> live;
  for (auto& [name, node] : nodes_)
    live.push_back(&node);  // std::map: sorted by name
  return live;
}

void Controller::Drop(const std::string& peer, std::string_view reason, const std::string& detail) {
  ++counters_.dropped;
  const int64_t n = ++counters_.dropped_by_reason[std::string(reason)];
  // Every drop is counted; the log shows the first few of each kind and then a sample,
  // so a flood of garbage cannot flood the log.
  if (n <= 10 || n % 1000 == 0) {
    spdlog::warn("controller: dropped a message ({} #{}) from peer {:02x}: {}", reason, n,
                 fmt::join(std::vector<uint8_t>(peer.begin(), peer.end()), ""), detail);
  }
}

void Controller::StopRanks(const char* mode) {
  for (auto& [name, node] : nodes_) {
    if (node.slot < 0) continue;
    if (std::string(mode) == "kill") node.stopped = false;
    Send(node.peer, {MessageType::kStop, {{"attempt", attempt_}, {"mode", mode}}, ""});
  }
}

void Controller::Launch() {
  const bool restart = state_ == JobState::kRestarting;
  if (restart) {
    ++attempt_;
    ++restarts_;
  }
  std::vector<Node*> live = LiveNodesByName();
  if (!restart && (o_.config.parallel.automatic || o_.config.device_automatic)) {
    std::vector<Node*> placed(live.begin(),
                              live.begin() + std::min<size_t>(live.size(), plan_.nodes));
    if (Status s = ResolveForWorkers(placed); !s.ok()) {
      Finish(JobState::kFailed, s.WithContext("the worker daemons' devices").message());
      return;
    }
  }
  // Ranks whose arenas cannot fit their node's memory would fail (or be OOM-killed) on every
  // attempt: the job fails here, before any starts, naming the node.
  for (size_t i = 0; i < live.size() && i < static_cast<size_t>(plan_.nodes); ++i) {
    const Node& n = *live[i];
    if (Status s = CheckNodeHostMemory(o_.config, plan_, static_cast<int>(i), n.name,
                                       n.memory_bytes, n.memory_limit);
        !s.ok()) {
      Finish(JobState::kFailed, s.message());
      return;
    }
  }
  ranks_.assign(plan_.world, Rank{});
  // The fence: from now on only this attempt's rank 0 commits checkpoints (it reads the key
  // before each commit; worker/rank_runtime.h).
  store_.Publish(std::string(kCurrentAttemptKey), CurrentAttempt(incarnation_, attempt_), outbox_);
  std::vector<std::string> placed;
  for (size_t i = 0; i < live.size(); ++i) {
    Node& node = *live[i];
    node.slot = i < static_cast<size_t>(plan_.nodes) ? static_cast<int>(i) : -1;
    node.stopped = node.slot < 0;
    if (node.slot < 0) continue;
    nlohmann::json assignments = nlohmann::json::array();
    const std::vector<int>& ranks = plan_.node_ranks[node.slot];
    for (size_t j = 0; j < ranks.size(); ++j) {
      assignments.push_back({{"rank", ranks[j]}, {"local_rank", j}, {"device", j}});
      ranks_[ranks[j]].node = node.name;
    }
    Send(node.peer, {MessageType::kLaunch,
                     {{"attempt", attempt_},
                      {"incarnation", incarnation_},
                      {"world", plan_.world},
                      {"ranks", assignments}},
                     o_.job_yaml});
    placed.push_back(node.name);
  }
  Transition(
      JobState::kRendezvous,
      fmt::format("attempt {}: {} ranks launched on {}{}", attempt_, plan_.world,
                  fmt::join(placed, ", "),
                  restart ? fmt::format(" (restart {} of at most {}: {})", restarts_,
                                        o_.config.cluster.restart.max_restarts, pending_cause_)
                          : ""));
}

Status Controller::ResolveForWorkers(const std::vector<Node*>& placed) {
  // Every placed node must hold the layout: plan for the smallest GPU (or host memory).
  PlanDevice device;
  const bool gpus = std::all_of(placed.begin(), placed.end(), [](Node* n) { return n->gpus > 0; });
  for (Node* n : placed) {
    const double memory =
        gpus ? static_cast<double>(n->gpu_memory_bytes) : static_cast<double>(n->memory_bytes);
    if (device.memory_bytes == 0 || memory < device.memory_bytes) {
      device = {gpus ? n->gpu_name : std::string(), memory};
    }
  }
  if (device == planned_for_) return Status::Ok();
  TrainConfig config = o_.config;
  DT_RETURN_IF_ERROR(ResolveJob(config, device));
  DT_ASSIGN_OR_RETURN(JobPlan plan, MakePlan(config));
  DT_ASSIGN_OR_RETURN(std::string yaml, ResolvedJobYaml(job_yaml_as_written_, config));
  const ParallelConfig& was = o_.config.parallel;
  const ParallelConfig& now = config.parallel;
  if (config.device_automatic) {
    spdlog::info("controller: train.device: auto for the worker daemons' {}: {}",
                 DescribePlanDevice(device), config.device);
  }
  if (config.parallel.automatic) {
    spdlog::info(
        "controller: parallel: auto for the worker daemons' {} (planned for {}): tp {} cp {} pp "
        "{} dp {}{}, micro-batch {}{}",
        DescribePlanDevice(device), DescribePlanDevice(planned_for_), now.tp, now.cp, now.pp,
        now.dp, now.zero1 ? ", ZeRO-1" : "", config.micro_batch,
        config.recompute ? ", recompute" : "");
  }
  if (now.tp != was.tp || now.cp != was.cp || now.pp != was.pp || now.dp != was.dp ||
      now.zero1 != was.zero1 || config.micro_batch != o_.config.micro_batch ||
      config.recompute != o_.config.recompute) {
    spdlog::warn("controller: the layout differs from `difftrain validate` on this machine");
  }
  o_.config = std::move(config);
  plan_ = std::move(plan);
  o_.job_yaml = std::move(yaml);
  planned_for_ = device;
  return Status::Ok();
}

void Controller::Fail(const std::string& cause) {
  if (state_ != JobState::kRendezvous && state_ != JobState::kRunning) return;
  if (restarts_ >= o_.config.cluster.restart.max_restarts) {
    Finish(JobState::kFailed, fmt::format("{}; no restarts left (restart.max_restarts {})", cause,
                                          o_.config.cluster.restart.max_restarts));
    return;
  }
  pending_cause_ = cause;
  Transition(JobState::kRestarting, cause + "; stopping every rank");
  StopRanks("kill");
}

void Controller::Finish(JobState final_state, const std::string& why) {
  Transition(final_state, why);
  exit_code_ = final_state == JobState::kSucceeded      ? kExitSucceeded
               : final_state == JobState::kCheckpointed ? kExitCheckpointed
                                                        : kExitFailed;
  for (auto& [name, node] : nodes_) {
    Send(node.peer, {MessageType::kShutdown, {{"exit_code", exit_code_}}, ""});
  }
  if (final_state == JobState::kCheckpointed) {
    spdlog::info("controller: run the job again to resume from {}", NewestCheckpoint());
  }
  std::string drops;
  for (const auto& [reason, n] : counters_.dropped_by_reason)
    drops += fmt::format(", {} {}", reason, n);
  spdlog::info(
      "controller: final state {}, restarts {}, messages {}, heartbeats {}, store requests {}, "
      "dropped messages {}{}, refused connections {}",
      StateName(state_), restarts_, counters_.messages, counters_.heartbeats,
      counters_.store_requests, counters_.dropped, drops, zap_->refused());
  PublishMetrics(/*force=*/true);
  done_ = true;
}

void Controller::Tick() {
  const Clock::time_point now = Clock::now();
  const ClusterConfig& cluster = o_.config.cluster;
  const auto since = Seconds(now - state_since_);
  const double timeout = cluster.restart.rendezvous_timeout_seconds;
  counters_.refused_connections = zap_->refused();

  if (o_.stop_signal != nullptr && o_.stop_signal->load() != 0 && !checkpoint_requested_) {
    checkpoint_requested_ = true;
    stop_since_ = now;
    spdlog::info(
        "controller: signal {}: the ranks checkpoint and stop (within "
        "restart.stop_grace_seconds = {} s)",
        o_.stop_signal->load(), cluster.restart.stop_grace_seconds);
    if (state_ == JobState::kPending) {
      Finish(JobState::kCheckpointed, "stopped by a signal before the job started");
      return;
    }
    StopRanks("checkpoint");
  }
  store_.Expire(now, outbox_);
  // The rest looks at every node: a few times a second is enough, and keeps the loop's
  // cost flat when heartbeats from thousands of nodes wake it a thousand times a second.
  if (now - last_health_check_ < milliseconds(50)) return;
  last_health_check_ = now;
  PublishMetrics();

  // Daemons that stopped sending heartbeats.
  const double lost_after = cluster.restart.heartbeat_seconds * cluster.restart.heartbeat_misses;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const double silent = Seconds(now - it->second.last_seen);
    if (silent <= lost_after) {
      ++it;
      continue;
    }
    const bool placed = it->second.slot >= 0;
    const std::string name = it->first;
    spdlog::warn("controller: node {} lost: no message for {:.1f} s", name, silent);
    if (placed) FenceLostNode(it->second);
    it = EraseNode(it);
    if (!placed) continue;
    if (checkpoint_requested_) {
      // Its ranks cannot report any more (their daemon kills them when it notices the
      // silence): the stop goes on without them, and the newest complete checkpoint stands.
      for (Rank& r : ranks_) {
        if (r.node == name && !r.exited) {
          r.exited = true;
          r.exit_code = -1;
        }
      }
      FinishStopIfDone(fmt::format("node {} lost while the ranks checkpointed", name));
      if (done_) return;
      continue;
    }
    Fail(fmt::format("node {} lost (no heartbeat for {:.1f} s)", name, silent));
  }
  if (checkpoint_requested_) {
    CheckStopDeadline(now);
    if (done_) return;
  }

  switch (state_) {
    case JobState::kPending:
      if (since > timeout) {
        std::vector<std::string> names;
        for (const auto& [name, node] : nodes_)
          names.push_back(name);
        Finish(JobState::kFailed,
               fmt::format("only {} of {} nodes registered within restart.rendezvous_timeout_"
                           "seconds = {} s ({}); {} missing",
                           nodes_.size(), plan_.nodes, timeout,
                           names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")),
                           plan_.nodes - static_cast<int>(nodes_.size())));
      }
      break;
    case JobState::kRendezvous:
      if (since > timeout) {
        std::vector<int> missing;
        for (size_t r = 0; r < ranks_.size(); ++r) {
          if (ranks_[r].progress.step < 0) missing.push_back(static_cast<int>(r));
        }
        Fail(fmt::format("rendezvous timed out after {} s; ranks not started: {}", timeout,
                         fmt::join(missing, ",")));
      }
      break;
    case JobState::kRestarting: {
      const bool stopped =
          std::all_of(nodes_.begin(), nodes_.end(), [](const auto& n) { return n.second.stopped; });
      if (stopped && checkpoint_requested_) {
        Finish(JobState::kCheckpointed, "stopped by a signal while restarting");
      } else if (stopped && static_cast<int>(nodes_.size()) >= plan_.nodes && now >= fence_until_) {
        Launch();
      } else if (since > timeout) {
        Finish(JobState::kFailed,
               fmt::format("restarting after '{}': {} of {} nodes available after {} s",
                           pending_cause_, nodes_.size(), plan_.nodes, timeout));
      }
      break;
    }
    case JobState::kRunning:
      CheckProgress(now);
      if (state_ != JobState::kRunning) break;
      if (now - last_progress_log_ >
              std::chrono::duration<double>(o_.config.cluster.progress_log_seconds) &&
          !ranks_.empty()) {
        last_progress_log_ = now;
        int64_t step = ranks_[0].progress.step;
        for (const Rank& r : ranks_)
          step = std::min(step, r.progress.step);
        // Steps of 0: train.epochs that the ranks resolve from data this machine cannot read.
        spdlog::info("controller: attempt {} at step {}/{}, loss {:.4f}, {:.1f} samples/s",
                     attempt_, step,
                     o_.config.steps > 0 ? std::to_string(o_.config.steps)
                                         : fmt::format("({} epochs)", o_.config.epochs),
                     ranks_[0].progress.loss, ranks_[0].progress.samples_per_second);
      }
      break;
    default:
      break;
  }
}

int Controller::Run() {
  state_since_ = Clock::now();
  last_progress_log_ = state_since_;
  spdlog::info("controller: job {} listening on {}: {} node(s) x {} device(s), state {}",
               o_.job_name, endpoint_, plan_.nodes, plan_.devices_per_node, StateName(state_));
  while (!done_) {
    try {
      Step();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // a signal: Tick looks at it on the next pass
    }
  }
  RepeatShutdown();
  return exit_code_;
}

void Controller::RepeatShutdown() {
  // A shutdown sent just before the socket closes is not always delivered (it was lost
  // now and then on ipc:// in tests, linger notwithstanding). So for two heartbeat
  // periods more, a daemon that is still talking hears it again: no daemon waits for its
  // controller timeout after the job has ended.
  const double heartbeat = o_.config.cluster.restart.heartbeat_seconds;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::clamp(2 * heartbeat, 0.5, 5.0)));
  while (Clock::now() < deadline) {
    try {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      PollIgnoringSignals(&item, 1, milliseconds(20));
      for (int i = 0; i < 100000; ++i) {
        zmq::message_t peer, frame;
        if (!router_.recv(peer, zmq::recv_flags::dontwait)) break;
        while (peer.more() && router_.recv(frame, zmq::recv_flags::dontwait) && frame.more()) {
        }
        if (NodeOfPeer(peer.to_string()) != nullptr) {
          Send(peer.to_string(), {MessageType::kShutdown, {{"exit_code", exit_code_}}, ""});
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

void Controller::Step() {
  std::vector<zmq::message_t> parts;
  {
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                               {zap_->socket().handle(), 0, ZMQ_POLLIN, 0}};
    PollIgnoringSignals(items, 2, milliseconds(outbox_.empty() ? 50 : 0));
    while (zap_->socket().get(zmq::sockopt::events) & ZMQ_POLLIN)
      zap_->HandleRequest();
    // Drain what has arrived (bounded, so timers still run under a flood).
    for (int i = 0; i < 100000 && !done_; ++i) {
      zmq::message_t peer;
      if (!router_.recv(peer, zmq::recv_flags::dontwait)) break;
      parts.clear();
      bool more = peer.more();
      while (more) {
        zmq::message_t part;
        if (!router_.recv(part, zmq::recv_flags::dontwait)) break;
        more = part.more();
        parts.push_back(std::move(part));
      }
      if (parts.size() != 1) {
        Drop(peer.to_string(), "malformed", fmt::format("{} frames (expected 1)", parts.size()));
        continue;
      }
      OnFrame(peer.to_string(), parts[0].to_string_view());
    }
    if (!done_) Tick();
    for (const Outgoing& out : outbox_)
      Send(out.peer, out.message);
    outbox_.clear();
  }
}

}  // namespace difftrain::controller
