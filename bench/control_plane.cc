// Control-plane scale: a real `difftrain controller` and a simulated cluster of fake
// worker daemons on loopback, all in this one process (one DEALER socket each, CURVE
// like the real ones). Measures
//   assignment:  from the last registration sent to the last launch received,
//   rendezvous:  every rank sets its address, adds itself to a counter and blocks on a
//                "done" key that the last arrival sets (the shape of a Gloo/NCCL bootstrap),
//   heartbeats:  the controller's CPU (utime + stime from /proc) while every node sends a
//                heartbeat with its ranks' progress every second.
// Usage: bench_control_plane DIFFTRAIN_BINARY [NODES=1024] [RANKS_PER_NODE=8] [SECONDS=10]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/check.h"
#include "common/curve.h"
#include "common/wire.h"

extern char** environ;

namespace {

using namespace difftrain;
using Clock = std::chrono::steady_clock;
using wire::Message;
using wire::MessageType;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// utime + stime of `pid` in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string field;
  std::vector<std::string> fields;
  while (in >> field)
    fields.push_back(field);
  DT_CHECK(fields.size() > 15, "cannot read /proc/{}/stat", pid);
  return (std::stod(fields[13]) + std::stod(fields[14])) / ::sysconf(_SC_CLK_TCK);
}

struct FakeNode {
  std::unique_ptr<zmq::socket_t> socket;
  bool launched = false;
  std::vector<int> ranks;
};

class Cluster {
 public:
  Cluster(const CurveKeys& keys, const std::string& endpoint, int nodes, pid_t controller)
      : context_(4), controller_(controller) {
    context_.set(zmq::ctxopt::max_sockets, nodes + 64);
    for (int n = 0; n < nodes; ++n) {
      FakeNode node;
      node.socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      node.socket->set(zmq::sockopt::linger, 0);
      node.socket->set(zmq::sockopt::sndhwm, 100000);
      node.socket->set(zmq::sockopt::rcvhwm, 100000);
      MakeCurveClient(*node.socket, keys);
      node.socket->connect(endpoint);
      nodes_.push_back(std::move(node));
    }
  }

  void Send(int n, const Message& m) {
    const std::string frame = wire::Encode(m);
    nodes_[n].socket->send(zmq::buffer(frame), zmq::send_flags::none);
  }

  // Polls every socket once (up to `timeout`) and hands each message to `on`.
  template <typename On>
  void Pump(std::chrono::milliseconds timeout, On on) {
    DT_CHECK(::waitpid(controller_, nullptr, WNOHANG) == 0, "the controller exited");
    std::vector<zmq::pollitem_t> items;
    for (FakeNode& n : nodes_)
      items.push_back({n.socket->handle(), 0, ZMQ_POLLIN, 0});
    if (PollIgnoringSignals(items.data(), items.size(), timeout) == 0) return;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      zmq::message_t msg;
      while (nodes_[i].socket->recv(msg, zmq::recv_flags::dontwait)) {
        Result<Message> m = wire::Decode(msg.to_string_view());
        DT_CHECK(m.ok(), "{}", m.status().message());
        on(static_cast<int>(i), *m);
      }
    }
  }

  std::vector<FakeNode>& nodes() { return nodes_; }

 private:
  zmq::context_t context_;
  pid_t controller_;
  std::vector<FakeNode> nodes_;
};

struct Figures {
  double connect_seconds, assignment_seconds, rendezvous_seconds, heartbeat_cpu_fraction;
};

Figures RunOnce(const std::string& binary, int nodes, int ranks_per_node, int seconds) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench-control-plane-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  DT_CHECK(WriteNewKeys((dir / "keys").string()).ok(), "keys");
  const CurveKeys keys = *ReadKeys((dir / "keys").string());
  std::ofstream(dir / "job.yaml")
      << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
         "num_heads: 4}\n"
      << "batch: {micro: 1, global: " << nodes * ranks_per_node << "}\n"
      << "restart: {heartbeat_seconds: 1, heartbeat_misses: 30, rendezvous_timeout_seconds: 600}\n";
  const std::string endpoint = "ipc://" + (dir / "ctl.sock").string();
  std::vector<std::string> args = {binary,
                                   "controller",
                                   (dir / "job.yaml").string(),
                                   "--bind",
                                   endpoint,
                                   "--keys",
                                   (dir / "keys").string(),
                                   "--nodes",
                                   std::to_string(nodes),
                                   "--devices-per-node",
                                   std::to_string(ranks_per_node),
                                   "--log-level",
                                   "warn"};
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  DT_CHECK(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0, "spawn");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  Cluster cluster(keys, endpoint, nodes, pid);
  // Connections and CURVE handshakes first: a store get of a missing key on every socket.
  const Clock::time_point connect_start = Clock::now();
  int64_t id = 0;
  for (int n = 0; n < nodes; ++n) {
    cluster.Send(n,
                 {MessageType::kStoreGet, {{"id", ++id}, {"key", "probe"}, {"timeout_ms", 0}}, ""});
  }
  int answered = 0;
  while (answered < nodes)
    cluster.Pump(std::chrono::milliseconds(100), [&](int, const Message&) { ++answered; });
  const double connect_seconds = Since(connect_start);

  // Registration, then the launches.
  for (int n = 0; n < nodes; ++n) {
    cluster.Send(n, {MessageType::kRegister,
                     {{"node", "fake-" + std::to_string(100000 + n)},
                      {"devices", ranks_per_node},
                      {"gpus", 0},
                      {"cores", ranks_per_node},
                      {"memory_bytes", int64_t{1} << 36},
                      {"memory_limit", ""},
                      {"gpu_name", ""},
                      {"gpu_memory_bytes", 0},
                      {"pid", n}},
                     ""});
  }
  const Clock::time_point registered = Clock::now();
  int launched = 0;
  double assignment_seconds = 0;
  while (launched < nodes) {
    cluster.Pump(std::chrono::milliseconds(100), [&](int n, const Message& m) {
      if (m.type != MessageType::kLaunch) return;
      for (const auto& r : m.header["ranks"])
        cluster.nodes()[n].ranks.push_back(r["rank"].get<int>());
      if (++launched == nodes) assignment_seconds = Since(registered);
    });
  }

  // Rendezvous of every rank through the controller's store.
  const int world = nodes * ranks_per_node;
  const Clock::time_point rdzv_start = Clock::now();
  for (int n = 0; n < nodes; ++n) {
    for (int r : cluster.nodes()[n].ranks) {
      cluster.Send(n, {MessageType::kStoreSet,
                       {{"id", ++id}, {"key", "bench/rank/" + std::to_string(r)}},
                       std::string(64, 'a')});
      cluster.Send(
          n, {MessageType::kStoreAdd, {{"id", ++id}, {"key", "bench/arrived"}, {"delta", 1}}, ""});
      cluster.Send(n, {MessageType::kStoreGet,
                       {{"id", ++id}, {"key", "bench/done"}, {"timeout_ms", 600000}},
                       ""});
    }
  }
  int done = 0;
  double rendezvous_seconds = 0;
  while (done < world) {
    cluster.Pump(std::chrono::milliseconds(100), [&](int n, const Message& m) {
      if (m.type != MessageType::kStoreReply) return;
      if (m.header["number"].get<int64_t>() == world) {
        cluster.Send(n, {MessageType::kStoreSet, {{"id", ++id}, {"key", "bench/done"}}, "1"});
      }
      if (m.payload == "1" && ++done == world) rendezvous_seconds = Since(rdzv_start);
    });
  }

  // Heartbeats: every node once a second, spread over the second, with 8 ranks' progress.
  auto heartbeat = [&](int n, int64_t step) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r : cluster.nodes()[n].ranks) {
      ranks.push_back({{"rank", r},
                       {"pid", 1000 + r},
                       {"step", step},
                       {"loss", 0.25},
                       {"step_seconds", 0.5},
                       {"samples_per_second", 512.0},
                       {"compute_seconds", 0.1},
                       {"flops_per_second", 2e9}});
    }
    cluster.Send(
        n, {MessageType::kHeartbeat,
            {{"node", "fake-" + std::to_string(100000 + n)}, {"attempt", 0}, {"ranks", ranks}},
            ""});
  };
  // One round first (the controller moves to RUNNING), then the measured window.
  for (int n = 0; n < nodes; ++n)
    heartbeat(n, 0);
  const double cpu_start = CpuSeconds(pid);
  const Clock::time_point hb_start = Clock::now();
  int64_t sent = 0;
  while (Since(hb_start) < seconds) {
    // The heartbeats due by now, at `nodes` per second.
    const int64_t due = static_cast<int64_t>(Since(hb_start) * nodes);
    for (; sent < due; ++sent)
      heartbeat(static_cast<int>(sent % nodes), 1 + sent / nodes);
    cluster.Pump(std::chrono::milliseconds(5), [](int, const Message&) {});
  }
  const double heartbeat_cpu_fraction = (CpuSeconds(pid) - cpu_start) / Since(hb_start);

  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  std::filesystem::remove_all(dir);
  return {connect_seconds, assignment_seconds, rendezvous_seconds, heartbeat_cpu_fraction};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIFFTRAIN_BINARY [NODES] [RANKS_PER_NODE] [SECONDS]\n",
                 argv[0]);
    return 2;
  }
  const int nodes = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int ranks = argc > 3 ? std::atoi(argv[3]) : 8;
  const int seconds = argc > 4 ? std::atoi(argv[4]) : 10;
  const Figures f = RunOnce(argv[1], nodes, ranks, seconds);
  std::printf(
      "{\"nodes\": %d, \"ranks\": %d, \"connect_s\": %.3f, \"assignment_s\": %.3f, "
      "\"rendezvous_s\": %.3f, \"heartbeat_cpu_fraction\": %.4f}\n",
      nodes, nodes * ranks, f.connect_seconds, f.assignment_seconds, f.rendezvous_seconds,
      f.heartbeat_cpu_fraction);
  return 0;
}
