// A job of real daemons for fault tests: a `difftrain controller` and `difftrain worker`
// daemons as separate processes (optionally each inside a network namespace), their ranks,
// the job file, and what the tests look at afterwards (logs, the newest checkpoint).
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/checkpoint_tensors.h"
#include "tests/testing/processes.h"

namespace difftrain::testing {

// The shape of a fault-test job: a small DiT, checkpoints every 4 steps.
struct ClusterJobSpec {
  int nodes = 2, devices_per_node = 2;
  int steps = 24;
  std::string parallel = "{zero1: true, timeout_seconds: 6}";
  int micro = 1, global = 4;
  int hidden = 32;
  // Added to the restart section, e.g. "stop_grace_seconds: 4, hang_seconds: 2".
  std::string restart = "stop_grace_seconds: 4";
  int max_restarts = 4;
  double heartbeat_seconds = 0.2;
  int heartbeat_misses = 10;
  std::string extra;  // more top-level YAML
};

// Puts an environment variable back as it was when this object was made (the fixtures point
// TMPDIR into their own directory; the next test's directory is made under the old one).
class RestoredEnv {
 public:
  explicit RestoredEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) value_ = v;
  }
  ~RestoredEnv() {
    if (value_) {
      ::setenv(name_, value_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  RestoredEnv(const RestoredEnv&) = delete;
  RestoredEnv& operator=(const RestoredEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> value_;
};

class ClusterJob {
 public:
  using Clock = std::chrono::steady_clock;

  // Writes DIR/job.yaml; `endpoint` is where the controller binds and daemons connect.
  ClusterJob(std::filesystem::path dir, const ClusterJobSpec& spec, std::string endpoint,
             std::string keys)
      : dir_(std::move(dir)), spec_(spec), endpoint_(std::move(endpoint)), keys_(std::move(keys)) {
    std::filesystem::create_directories(dir_);
    std::ofstream(job()) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: "
                         << spec.hidden << ", depth: 2, num_heads: 4, num_classes: 10}\n"
                         << "batch: {micro: " << spec.micro << ", global: " << spec.global << "}\n"
                         << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
                         << "train: {steps: " << spec.steps << ", log_every: 1, metrics_file: \""
                         << (dir_ / "metrics-{rank}.jsonl").string() << "\"}\n"
                         << "parallel: " << spec.parallel << "\n"
                         << "checkpoint: {dir: \"" << (dir_ / "ckpt").string()
                         << "\", every: 4, keep: 10}\n"
                         << "cluster: {nodes: " << spec.nodes
                         << ", devices_per_node: " << spec.devices_per_node << "}\n"
                         << "restart: {max_restarts: " << spec.max_restarts
                         << ", heartbeat_seconds: " << spec.heartbeat_seconds
                         << ", heartbeat_misses: " << spec.heartbeat_misses
                         << ", rendezvous_timeout_seconds: 60" << (spec.restart.empty() ? "" : ", ")
                         << spec.restart << "}\n"
                         << spec.extra;
  }

  std::filesystem::path job() const { return dir_ / "job.yaml"; }

  // The `difftrain` the daemons run: DIFFTRAIN_TEST_BINARY when set (a long bench runs a copy,
  // so that rebuilding meanwhile changes nothing under it), else the one built with the test.
  static std::string Binary() {
    const char* given = std::getenv("DIFFTRAIN_TEST_BINARY");
    return given && *given ? given : DIFFTRAIN_BINARY;
  }
  const std::filesystem::path& dir() const { return dir_; }

  // `wrap` goes in front of the command (e.g. {"ip", "netns", "exec", "NS"}).
  std::unique_ptr<Process> StartController(const std::vector<std::string>& wrap = {},
                                           const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = wrap;
    for (const std::string& a : {Binary(), std::string("controller"), job().string(),
                                 std::string("--bind"), endpoint_, std::string("--keys"), keys_})
      argv.push_back(a);
    argv.insert(argv.end(), more.begin(), more.end());
    return std::make_unique<Process>(argv, dir_ / "controller.log");
  }
  std::unique_ptr<Process> StartWorker(const std::string& node,
                                       const std::vector<std::string>& wrap = {},
                                       const std::string& connect = "") {
    std::vector<std::string> argv = wrap;
    for (const std::string& a :
         {Binary(), std::string("worker"), std::string("--controller"),
          connect.empty() ? endpoint_ : connect, std::string("--node"), node, std::string("--keys"),
          keys_, std::string("--devices"), std::to_string(spec_.devices_per_node)})
      argv.push_back(a);
    return std::make_unique<Process>(argv, dir_ / ("worker-" + node + ".log"));
  }
  std::vector<std::string> NodeNames() const {
    std::vector<std::string> names;
    for (int i = 0; i < spec_.nodes; ++i)
      names.push_back("n" + std::to_string(i));
    return names;
  }

  // The controller's and every daemon's log so far.
  std::string Logs() const {
    std::string log = ReadWholeFile(dir_ / "controller.log");
    for (const std::string& node : NodeNames())
      log += ReadWholeFile(dir_ / ("worker-" + node + ".log"));
    return log;
  }

  // Steps rank 0 has logged (its metrics file, over every attempt and run).
  int StepsLogged() const {
    std::ifstream metrics(dir_ / "metrics-0.jsonl");
    int lines = 0;
    for (std::string line; std::getline(metrics, line);)
      ++lines;
    return lines;
  }
  bool WaitForSteps(int steps, std::chrono::seconds limit = std::chrono::seconds(90)) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (StepsLogged() >= steps) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Blocks until `text` is in the controller's log.
  bool WaitForLog(const std::string& text,
                  std::chrono::seconds limit = std::chrono::seconds(60)) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (ReadWholeFile(dir_ / "controller.log").find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  std::map<std::string, std::string> NewestCheckpoint(int64_t* step) const {
    return NewestCheckpointTensors(dir_ / "ckpt", step);
  }

 private:
  std::filesystem::path dir_;
  ClusterJobSpec spec_;
  std::string endpoint_, keys_;
};

// Blocks until `daemon` runs `count` ranks none of which is in `old`; returns them.
inline std::vector<pid_t> WaitForNewRanks(pid_t daemon, size_t count, const std::vector<pid_t>& old,
                                          std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> ranks = ChildrenOf(daemon, "train");
    bool fresh = ranks.size() == count;
    for (pid_t r : ranks)
      fresh = fresh && std::find(old.begin(), old.end(), r) == old.end();
    if (fresh) return ranks;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return {};
}

}  // namespace difftrain::testing
