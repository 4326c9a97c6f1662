#include "worker/worker.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/metrics.h"
#include "common/temp_dir.h"
#include "common/wire.h"
#include "job/job_spec.h"
#include "model/device.h"
#include "model/tensor/host_memory.h"
#include "worker/local_address.h"
#include "worker/rank_metrics.h"
#include "worker/rank_supervisor.h"

namespace difftrain::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using wire::Message;
using wire::MessageType;

class Worker {
 public:
  explicit Worker(const WorkerOptions& o)
      : o_(o),
        context_(1),
        socket_(context_, zmq::socket_type::dealer),
        monitor_(context_, zmq::socket_type::pair),
        metrics_(o.metrics_port != 0 ? std::make_unique<RankMetrics>() : nullptr),
        ranks_(o.node, metrics_.get()) {}

  ~Worker() {
    KillRanks();
    monitor_.close();
    socket_.close();
    context_.close();
  }

  Status Start(const CurveKeys& keys) {
    resources_ = DetectResources();
    // The address the ranks advertise to their peers: given, or the interface towards the
    // controller (on a multi-homed node, set DIFFTRAIN_ADDRESS to pick the network).
    if (const char* given = std::getenv("DIFFTRAIN_ADDRESS"); given && *given) {
      address_ = given;
    } else {
      DT_ASSIGN_OR_RETURN(address_, LocalAddressTowards(o_.controller));
    }
    devices_ =
        o_.devices > 0 ? o_.devices : (resources_.gpus > 0 ? resources_.gpus : resources_.cores);
    socket_.set(zmq::sockopt::linger, 1000);
    // Nothing is queued for a connection that has not completed its handshake: a
    // registration goes out only once the controller accepted our key.
    socket_.set(zmq::sockopt::immediate, true);
    MakeCurveClient(socket_, keys);
    // A new handshake after the first is a new connection: a restarted controller (or one
    // that dropped ours), which knows nothing of this daemon.
    const std::string monitor = fmt::format("inproc://worker-monitor-{}", fmt::ptr(this));
    if (zmq_socket_monitor(socket_.handle(), monitor.c_str(), ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0) {
      return Errorf("monitoring the controller connection: {}", zmq_strerror(zmq_errno()));
    }
    monitor_.connect(monitor);
    if (metrics_) {
      metrics_->SetJob("", o_.node);
      DT_ASSIGN_OR_RETURN(metrics_endpoint_,
                          MetricsEndpoint::Start(o_.metrics_port, metrics_->registry()));
      spdlog::info("worker {}: serving metrics on port {}", o_.node, o_.metrics_port);
    }
    try {
      socket_.connect(o_.controller);
    } catch (const zmq::error_t& e) {
      return Errorf("connecting to the controller at {}: {}", o_.controller, e.what());
    }
    return Status::Ok();
  }

  int Run() {
    const Clock::time_point start = Clock::now();
    last_heard_ = start;
    spdlog::info("worker {}: connecting to {} ({} devices: {} GPUs, {} cores, {:.1f} GiB{})",
                 o_.node, o_.controller, devices_, resources_.gpus, resources_.cores,
                 resources_.memory_bytes / 1073741824.0,
                 resources_.memory_limit.empty()
                     ? std::string()
                     : " by the memory limit of cgroup " + resources_.memory_limit);
    while (!exit_code_) {
      try {
        Step(start);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;  // a signal: the next pass looks at it
      }
    }
    KillRanks();
    return *exit_code_;
  }

 private:
  // One pass of the loop: messages, the ranks' pipes and exits, then the timers.
  void Step(Clock::time_point start) {
    std::vector<zmq::pollitem_t> items = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                          {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    for (int fd : ranks_.ProgressFds())
      items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
    PollIgnoringSignals(items.data(), items.size(), milliseconds(ranks_.empty() ? 100 : 20));
    for (int i = 0; i < 1000; ++i) {
      zmq::message_t msg;
      if (!socket_.recv(msg, zmq::recv_flags::dontwait)) break;
      OnFrame(msg.to_string_view());
    }
    ReadMonitor();
    ranks_.ReadProgress();
    for (const RankExit& e : ranks_.Reap())
      ReportExit(e.rank, e.exit_code, e.signal, e.oom_killed);
    Tick(start);
  }

  // Events of the controller connection: two frames each (event and value; address).
  void ReadMonitor() {
    while (true) {
      zmq::message_t event, address;
      if (!monitor_.recv(event, zmq::recv_flags::dontwait)) return;
      if (event.more()) (void)monitor_.recv(address, zmq::recv_flags::dontwait);
      uint16_t id = 0;
      if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
      if (id != ZMQ_EVENT_HANDSHAKE_SUCCEEDED || ++handshakes_ == 1) continue;
      spdlog::warn(
          "worker {}: a new connection to the controller at {} (it restarted, or lost "
          "ours): killing ranks {}, registering again",
          o_.node, o_.controller, ranks_.List());
      // Ranks of an attempt the controller may no longer know must not train on.
      KillRanks();
      registered_ = false;
      stop_requested_ = false;
      register_since_ = Clock::now();
      last_register_ = {};
    }
  }

  void Send(const Message& m) {
    const std::string frame = wire::Encode(m);
    (void)socket_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  }

  void OnFrame(std::string_view frame) {
    Result<Message> decoded = wire::Decode(frame);
    if (!decoded.ok()) {
      if (++dropped_ <= 10 || dropped_ % 1000 == 0) {
        spdlog::warn("worker {}: dropped a message (#{}): {}", o_.node, dropped_,
                     decoded.status().message());
      }
      return;
    }
    const Message& m = *decoded;
    last_heard_ = Clock::now();
    switch (m.type) {
      case MessageType::kRegistered:
        if (!registered_) {
          spdlog::info("worker {}: registered with job {}", o_.node,
                       m.header["job"].get<std::string>());
        }
        registered_ = true;
        if (metrics_) metrics_->SetJob(m.header["job"].get<std::string>(), o_.node);
        heartbeat_ = milliseconds(m.header["heartbeat_ms"].get<int64_t>());
        timeout_ = milliseconds(m.header["timeout_ms"].get<int64_t>());
        return;
      case MessageType::kHeartbeatAck:
        return;
      case MessageType::kLaunch:
        Launch(m);
        return;
      case MessageType::kStop:
        Stop(m);
        return;
      case MessageType::kShutdown:
        spdlog::info("worker {}: the job is over (exit code {})", o_.node,
                     m.header["exit_code"].get<int>());
        exit_code_ = m.header["exit_code"].get<int>();
        return;
      default:
        ++dropped_;
        spdlog::warn("worker {}: dropped an unexpected {} message", o_.node,
                     wire::TypeName(m.type));
    }
  }

  void Launch(const Message& m) {
    KillRanks();
    attempt_ = m.header["attempt"].get<int>();
    incarnation_ = m.header["incarnation"].get<std::string>();
    stop_requested_ = false;
    stop_reported_ = false;
    const int world = m.header["world"].get<int>();
    const std::string job = o_.work_dir + "/job.yaml";
    {
      std::ofstream out(job, std::ios::trunc);
      out << m.payload;
      if (!out) {
        spdlog::error("worker {}: cannot write '{}'", o_.node, job);
        for (const nlohmann::json& a : m.header["ranks"])
          ReportExit(a["rank"].get<int>(), 1, 0);
        return;
      }
    }
    // The job's stop grace (the ranks read the same file, so it parses; if not, they fail
    // and the default stands).
    if (Result<TrainConfig> config = TrainConfig::FromYamlFile(job); config.ok()) {
      stop_grace_ = config->cluster.restart.stop_grace_seconds;
    }
    const int local_world = static_cast<int>(m.header["ranks"].size());
    const int threads = std::max(1, resources_.cores / local_world);
    for (const nlohmann::json& a : m.header["ranks"]) {
      const int rank = a["rank"].get<int>();
      const int local_rank = a["local_rank"].get<int>();
      const int device = a["device"].get<int>();
      const std::vector<std::string> args = {o_.binary, "train",     "--config",
                                             job,       "--attempt", std::to_string(attempt_)};
      const std::map<std::string, std::string> env = {
          {"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"STORE", o_.controller},
          {"DIFFTRAIN_KEYS", o_.keys_dir},
          {"DIFFTRAIN_NODE", o_.node},
          {"DIFFTRAIN_ADDRESS", address_},
          {"DIFFTRAIN_ATTEMPT", std::to_string(attempt_)},
          {"DIFFTRAIN_INCARNATION", incarnation_},
          {"DIFFTRAIN_DEVICE",
           resources_.gpus > 0 ? "cuda:" + std::to_string(device) : std::string("cpu")},
          {"OMP_NUM_THREADS", std::to_string(threads)},
      };
      if (Status s = ranks_.Start(rank, args, env); !s.ok()) {
        spdlog::error("worker {}: starting rank {}: {}", o_.node, rank, s.message());
        ReportExit(rank, 1, 0);
      }
    }
    spdlog::info("worker {}: attempt {}: started ranks {} ({} OpenMP threads each)", o_.node,
                 attempt_, ranks_.List(), threads);
  }

  void Stop(const Message& m) {
    const std::string mode = m.header["mode"].get<std::string>();
    const int attempt = m.header["attempt"].get<int>();
    if (attempt < attempt_) return;  // an attempt this daemon has moved past
    stop_requested_ = true;
    stop_reported_ = false;
    if (attempt > attempt_) {
      // Its launch never reached us (sent while our connection was down): nothing of that
      // attempt runs here, and whatever does is older. The controller waits for our
      // "stopped" of that attempt, which must come.
      spdlog::warn("worker {}: stop of attempt {}, whose launch never arrived: killing ranks {}",
                   o_.node, attempt, ranks_.List());
      KillLeft(fmt::format("attempt {} is over", attempt_), spdlog::level::warn);
      attempt_ = attempt;
      return;
    }
    spdlog::info("worker {}: stop ({}) ranks {}", o_.node, mode, ranks_.List());
    if (mode == "checkpoint") {
      AskRanksToStop();
    } else {
      KillLeft("the job restarts", spdlog::level::info);
    }
  }

  // SIGUSR1: the ranks finish the step, checkpoint and exit 75, within the job's
  // restart.stop_grace_seconds; Tick kills what is left after that.
  void AskRanksToStop() {
    ranks_.Signal(SIGUSR1);
    if (!stop_deadline_) {
      stop_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(stop_grace_));
    }
  }

  // SIGKILL to every rank not yet killed; Step reports their exits.
  void KillLeft(const std::string& why, spdlog::level::level_enum level) {
    ranks_.KillLeft(why, level);
    stop_deadline_.reset();
  }

  // Every rank killed and reaped, none reported (the end of a job, a new attempt, a lost
  // controller: the controller has moved on).
  void KillRanks() {
    ranks_.KillAll();
    stop_deadline_.reset();
  }

  void ReportExit(int rank, int code, int signal, bool oom_killed = false) {
    Send({MessageType::kRankExit,
          {{"attempt", attempt_},
           {"rank", rank},
           {"exit_code", code},
           {"signal", signal},
           {"oom_killed", oom_killed ? 1 : 0}},
          ""});
  }

  void SendHeartbeat() {
    Send({MessageType::kHeartbeat,
          {{"node", o_.node}, {"attempt", attempt_}, {"ranks", ranks_.Progress()}},
          ""});
  }

  void Tick(Clock::time_point start) {
    const Clock::time_point now = Clock::now();
    if (o_.stop_signal != nullptr && o_.stop_signal->load() != 0 && !signalled_) {
      signalled_ = true;
      spdlog::info("worker {}: signal {}: the ranks checkpoint and stop", o_.node,
                   o_.stop_signal->load());
      AskRanksToStop();
    }
    if (stop_deadline_ && now >= *stop_deadline_) {
      KillLeft(fmt::format("still running restart.stop_grace_seconds = {} s after the stop",
                           stop_grace_),
               spdlog::level::warn);
    }
    if (signalled_ && ranks_.empty()) {
      exit_code_ = 75;
      return;
    }
    if (stop_requested_ && ranks_.empty() && !stop_reported_) {
      Send({MessageType::kStopped, {{"attempt", attempt_}}, ""});
      stop_reported_ = true;
    }
    if (!registered_) {
      if (now - last_register_ > std::chrono::seconds(1)) {
        last_register_ = now;
        Send({MessageType::kRegister,
              {{"node", o_.node},
               {"devices", devices_},
               {"gpus", resources_.gpus},
               {"cores", resources_.cores},
               {"memory_bytes", resources_.memory_bytes},
               {"memory_limit", resources_.memory_limit},
               {"gpu_name", resources_.gpu_name},
               {"gpu_memory_bytes", resources_.gpu_memory_bytes},
               {"pid", ::getpid()}},
              ""});
      }
      if (now - std::max(start, register_since_) >
          std::chrono::duration<double>(o_.register_timeout_seconds)) {
        spdlog::error("worker {}: no controller answered at {} within {} s", o_.node, o_.controller,
                      o_.register_timeout_seconds);
        exit_code_ = 1;
      }
      return;
    }
    if (now - last_heartbeat_ >= heartbeat_) {
      last_heartbeat_ = now;
      SendHeartbeat();
    }
    if (now - last_heard_ > timeout_) {
      spdlog::error("worker {}: the controller has been silent for {:.1f} s; stopping ranks",
                    o_.node, std::chrono::duration<double>(now - last_heard_).count());
      exit_code_ = 1;
    }
  }

  const WorkerOptions& o_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // events of socket_'s connection
  int handshakes_ = 0;
  Clock::time_point register_since_;  // when it last started registering
  NodeResources resources_;
  std::string address_;  // this node's address for the ranks' collectives
  int devices_ = 1;
  bool registered_ = false;
  milliseconds heartbeat_{1000}, timeout_{10000};
  Clock::time_point last_heard_, last_register_, last_heartbeat_;
  int attempt_ = -1;
  std::string incarnation_;  // of the controller that launched this attempt
  bool stop_requested_ = false, stop_reported_ = false, signalled_ = false;
  double stop_grace_ = RestartPolicy{}.stop_grace_seconds;  // the job's, once launched
  std::optional<Clock::time_point> stop_deadline_;          // a checkpoint-stop's: then SIGKILL
  int64_t dropped_ = 0;
  std::optional<int> exit_code_;
  std::unique_ptr<RankMetrics> metrics_;  // with metrics_port
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  RankSupervisor ranks_;  // after metrics_, which it records into
};

}  // namespace

NodeResources DetectResources() {
  NodeResources r;
  const DeviceInventory inventory = QueryDeviceInventory();
  r.gpus = static_cast<int>(inventory.gpus.size());
  if (!inventory.gpus.empty()) {
    r.gpu_name = inventory.gpus.front().name;
    r.gpu_memory_bytes = static_cast<int64_t>(inventory.gpus.front().memory_bytes);
  }
  cpu_set_t set;
  r.cores = ::sched_getaffinity(0, sizeof set, &set) == 0
                ? CPU_COUNT(&set)
                : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  r.cores = std::max(1, r.cores);
  // The ranks are this daemon's children, in its cgroup: under Slurm's --mem, a pod's
  // limits.memory or `podman run --memory`, the limit is their memory, not the machine's.
  const HostMemory memory = ReadHostMemory();
  r.memory_bytes = static_cast<int64_t>(memory.capacity());
  if (memory.LimitedByCgroup()) r.memory_limit = memory.cgroup->path;
  return r;
}

int RunWorker(const WorkerOptions& options) {
  WorkerOptions o = options;
  std::filesystem::path made_work_dir;
  if (o.work_dir.empty()) {
    Result<std::string> made = MakeTempDir("difftrain-worker");
    if (!made.ok()) {
      spdlog::error("worker: {}", made.status().message());
      return 1;
    }
    o.work_dir = made_work_dir = *made;
  }
  Result<CurveKeys> keys = ReadKeys(o.keys_dir);
  if (!keys.ok()) {
    spdlog::error("worker {}: {}", o.node, keys.status().message());
    return 2;
  }
  int code = 1;
  {
    Worker worker(o);
    if (Status s = worker.Start(*keys); !s.ok()) {
      spdlog::error("worker {}: {}", o.node, s.message());
      code = 2;
    } else {
      code = worker.Run();
    }
  }
  std::error_code ignored;
  if (!made_work_dir.empty()) std::filesystem::remove_all(made_work_dir, ignored);
  return code;
}

}  // namespace difftrain::worker
