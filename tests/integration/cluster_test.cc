// The job lifecycle end to end: a real `difftrain controller`, real `difftrain worker`
// daemons (two emulated nodes) and their real `difftrain train` ranks over Gloo, talking
// CURVE-encrypted ZeroMQ on loopback. Faults are real too: kill -9 of a rank or of a
// daemon, SIGTERM to the controller, a client with the wrong key, garbage on the wire.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/temp_dir.h"
#include "common/wire.h"
#include "model/parallel/rank_processes.h"
#include "tests/testing/checkpoint_tensors.h"
#include "tests/testing/processes.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

using testing::ChildrenOf;
using testing::Process;
using testing::ReadWholeFile;

class ClusterTest : public ::testing::Test {
 protected:
  static constexpr int kSteps = 24;

  void SetUp() override {
    keys_ = (fs::path(dir_.path()) / "keys").string();
    ASSERT_TRUE(WriteNewKeys(keys_).ok());
    endpoint_ = "ipc://" + dir_.path() + "/controller.sock";
    // The daemons' work directories (and what a killed one leaves) go with the test's.
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
  }

  // A job of two nodes with two CPU ranks each: tp=2 x dp=2, checkpoints every 4 steps.
  fs::path WriteJob(const std::string& name, const std::string& extra = "") {
    const fs::path dir = fs::path(dir_.path()) / name;
    fs::create_directories(dir);
    std::ofstream(dir / "job.yaml")
        << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2, "
           "num_heads: 4, num_classes: 10}\n"
        << "batch: {micro: 2, global: 4}\n"
        << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
        << "train: {steps: " << kSteps << ", log_every: 1, metrics_file: \""
        << (dir / "metrics-{rank}.jsonl").string() << "\"}\n"
        << "parallel: {tp: 2, timeout_seconds: 20}\n"
        << "checkpoint: {dir: \"" << (dir / "ckpt").string() << "\", every: 4, keep: 10}\n"
        << "cluster: {nodes: 2, devices_per_node: 2}\n"
        << "restart: {max_restarts: 2, heartbeat_seconds: 0.2, heartbeat_misses: 10, "
           "rendezvous_timeout_seconds: 60}\n"
        << extra;
    return dir / "job.yaml";
  }

  std::unique_ptr<Process> StartController(const fs::path& job) {
    return std::make_unique<Process>(
        std::vector<std::string>{DIFFTRAIN_BINARY, "controller", job.string(), "--bind", endpoint_,
                                 "--keys", keys_},
        job.parent_path() / "controller.log");
  }
  std::unique_ptr<Process> StartWorker(const fs::path& job, const std::string& node) {
    return std::make_unique<Process>(
        std::vector<std::string>{DIFFTRAIN_BINARY, "worker", "--controller", endpoint_, "--node",
                                 node, "--keys", keys_, "--devices", "2"},
        job.parent_path() / ("worker-" + node + ".log"));
  }

  // Runs the job to its end with two daemons; returns the controller's exit code. `during`
  // runs while the job does (the fault to inject).
  int RunJob(const fs::path& job, std::string* log,
             const std::function<void(Process& controller, std::unique_ptr<Process>* workers)>&
                 during = {}) {
    std::unique_ptr<Process> controller = StartController(job);
    std::unique_ptr<Process> workers[2] = {StartWorker(job, "n0"), StartWorker(job, "n1")};
    if (during) during(*controller, workers);
    const int code = controller->Wait();
    for (auto& w : workers)
      w->Wait(30s);
    *log = controller->Log();
    for (const char* node : {"n0", "n1"}) {
      *log += ReadWholeFile(job.parent_path() / (std::string("worker-") + node + ".log"));
    }
    return code;
  }

  // Blocks until rank 0 has logged `step` steps in this run (its metrics file).
  static bool WaitForStep(const fs::path& job, int step, std::chrono::seconds limit = 90s) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      std::ifstream metrics(job.parent_path() / "metrics-0.jsonl");
      int lines = 0;
      for (std::string line; std::getline(metrics, line);)
        ++lines;
      if (lines >= step) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  static std::map<std::string, std::string> FinalState(const fs::path& job, int64_t* step) {
    return testing::NewestCheckpointTensors(job.parent_path() / "ckpt", step);
  }

  // An uninterrupted run of `job`'s twin, for the bit-for-bit comparison.
  std::map<std::string, std::string> Reference() {
    const fs::path job = WriteJob("reference");
    std::string log;
    EXPECT_EQ(RunJob(job, &log), 0) << log;
    int64_t step = 0;
    std::map<std::string, std::string> state = FinalState(job, &step);
    EXPECT_EQ(step, kSteps);
    EXPECT_FALSE(state.empty());
    return state;
  }

  TempDir dir_;
  std::string keys_, endpoint_;
};

TEST_F(ClusterTest, TwoNodesTrainToCompletion) {
  const fs::path job = WriteJob("complete");
  std::string log;
  ASSERT_EQ(RunJob(job, &log), 0) << log;
  EXPECT_NE(log.find("-> RENDEZVOUS"), std::string::npos) << log;
  EXPECT_NE(log.find("RENDEZVOUS -> RUNNING"), std::string::npos) << log;
  EXPECT_NE(log.find("RUNNING -> SUCCEEDED"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 0"), std::string::npos) << log;
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty());
  EXPECT_EQ(step, kSteps);
}

TEST_F(ClusterTest, KilledRankRestartsFromCheckpointToTheSameParameters) {
  const auto reference = Reference();
  const fs::path job = WriteJob("killed-rank");
  std::string log;
  const int code = RunJob(job, &log, [&](Process&, std::unique_ptr<Process>* workers) {
    ASSERT_TRUE(WaitForStep(job, 6));
    const std::vector<pid_t> ranks = ChildrenOf(workers[1]->pid(), "train");
    ASSERT_EQ(ranks.size(), 2u);
    ::kill(ranks[1], SIGKILL);
  });
  ASSERT_EQ(code, 0) << log;
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
  // From RUNNING, or from RENDEZVOUS where the ranks reached step 6 before a heartbeat told
  // the controller that they had all met (a fast machine does that in under 0.4 s).
  EXPECT_NE(log.find("-> RESTARTING"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 1"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from step"), std::string::npos) << log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(FinalState(job, &step), reference);
}

TEST_F(ClusterTest, KilledWorkerDaemonRestartsTheJobToTheSameParameters) {
  const auto reference = Reference();
  const fs::path job = WriteJob("killed-worker");
  std::string log;
  const int code = RunJob(job, &log, [&](Process& controller, std::unique_ptr<Process>* workers) {
    ASSERT_TRUE(WaitForStep(job, 6));
    const std::vector<pid_t> ranks = ChildrenOf(workers[1]->pid(), "train");
    workers[1]->Signal(SIGKILL);
    workers[1]->Wait();
    // Its ranks die with it (no orphans training on) ...
    for (pid_t r : ranks) {
      for (int i = 0; i < 200 && ::kill(r, 0) == 0; ++i)
        std::this_thread::sleep_for(10ms);
      EXPECT_NE(::kill(r, 0), 0) << "rank " << r << " outlived its daemon";
    }
    // The controller notices the silence (heartbeat_misses x heartbeat_seconds = 2 s) ...
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline && controller.Log().find("node n1 lost") == std::string::npos)
      std::this_thread::sleep_for(20ms);
    EXPECT_NE(controller.Log().find("node n1 lost"), std::string::npos);
    // ... and once the node's supervisor (systemd, Kubernetes) starts the daemon again,
    // the job goes on.
    workers[1] = StartWorker(job, "n1");
  });
  ASSERT_EQ(code, 0) << log;
  EXPECT_NE(log.find("-> RESTARTING"), std::string::npos) << log;
  EXPECT_NE(log.find("final state SUCCEEDED, restarts 1"), std::string::npos) << log;
  int64_t step = 0;
  testing::ExpectIdenticalTensors(FinalState(job, &step), reference);
}

TEST_F(ClusterTest, FailsWithTheCauseWhenRestartsAreExhausted) {
  const fs::path job = WriteJob("exhausted", "");
  std::string yaml = ReadWholeFile(job);
  yaml.replace(yaml.find("max_restarts: 2"), std::strlen("max_restarts: 2"), "max_restarts: 0");
  std::ofstream(job) << yaml;
  std::string log;
  const int code = RunJob(job, &log, [&](Process&, std::unique_ptr<Process>* workers) {
    ASSERT_TRUE(WaitForStep(job, 3));
    const std::vector<pid_t> ranks = ChildrenOf(workers[0]->pid(), "train");
    ASSERT_EQ(ranks.size(), 2u);
    ::kill(ranks[0], SIGKILL);
  });
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("-> FAILED"), std::string::npos) << log;
  EXPECT_NE(log.find("killed by signal 9; no restarts left (restart.max_restarts 0)"),
            std::string::npos)
      << log;
  // The daemons end with the job and leave no ranks behind.
  EXPECT_NE(log.find("worker n0: the job is over (exit code 1)"), std::string::npos) << log;
}

TEST_F(ClusterTest, SigtermCheckpointsAndASecondRunResumesToTheSameParameters) {
  const auto reference = Reference();
  const fs::path job = WriteJob("sigterm");
  std::string log;
  int code = RunJob(job, &log, [&](Process& controller, std::unique_ptr<Process>*) {
    ASSERT_TRUE(WaitForStep(job, 5));
    controller.Signal(SIGTERM);
  });
  ASSERT_EQ(code, 75) << log;
  EXPECT_NE(log.find("-> CHECKPOINTED"), std::string::npos) << log;
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty()) << log;
  EXPECT_GE(step, 5);
  EXPECT_LT(step, kSteps);
  code = RunJob(job, &log);
  ASSERT_EQ(code, 0) << log;
  EXPECT_NE(log.find("resumed from step " + std::to_string(step)), std::string::npos) << log;
  testing::ExpectIdenticalTensors(FinalState(job, &step), reference);
}

// A client socket of the test with `keys`.
std::unique_ptr<zmq::socket_t> Connect(zmq::context_t& context, const CurveKeys& keys,
                                       const std::string& endpoint) {
  auto s = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
  s->set(zmq::sockopt::linger, 0);
  MakeCurveClient(*s, keys);
  s->connect(endpoint);
  return s;
}

// A worker daemon's registration; with `gpus`, a node of that many H200s.
std::string RegisterFrame(const std::string& node, int gpus = 0) {
  return wire::Encode({wire::MessageType::kRegister,
                       {{"node", node},
                        {"devices", gpus > 0 ? gpus : 2},
                        {"gpus", gpus},
                        {"cores", 2},
                        {"memory_bytes", 1 << 30},
                        {"memory_limit", ""},
                        {"gpu_name", gpus > 0 ? "NVIDIA H200" : ""},
                        {"gpu_memory_bytes", gpus > 0 ? int64_t{141} << 30 : 0},
                        {"pid", 1}},
                       ""});
}

// The next message on `s` within `limit`, if any.
std::optional<wire::Message> Receive(zmq::socket_t& s, std::chrono::milliseconds limit) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, limit) == 0) return std::nullopt;
  zmq::message_t m;
  if (!s.recv(m)) return std::nullopt;
  Result<wire::Message> decoded = wire::Decode(m.to_string_view());
  if (!decoded.ok()) return std::nullopt;
  return *decoded;
}

TEST_F(ClusterTest, WrongKeyGetsNothingAndBadMessagesAreDroppedAndCounted) {
  const fs::path job = WriteJob("bad-input");
  std::unique_ptr<Process> controller = StartController(job);
  Result<CurveKeys> keys = ReadKeys(keys_);
  ASSERT_TRUE(keys.ok());
  zmq::context_t context;

  // A client with keys of another job: no answer, ever.
  const std::string other = dir_.path() + "/other-keys";
  ASSERT_TRUE(WriteNewKeys(other).ok());
  CurveKeys wrong = *ReadKeys(other);
  wrong.controller_public = keys->controller_public;  // it knows the server, not the client key
  auto intruder = Connect(context, wrong, endpoint_);
  intruder->send(zmq::buffer(RegisterFrame("intruder")), zmq::send_flags::dontwait);
  EXPECT_FALSE(Receive(*intruder, 1500ms).has_value());

  // A client with the right keys sends garbage of every kind, then a valid registration:
  // the controller drops the garbage and still answers.
  auto client = Connect(context, *keys, endpoint_);
  std::string bad_version = RegisterFrame("n0");
  bad_version[2] = 99;
  std::string bad_type = RegisterFrame("n0");
  bad_type[3] = 77;
  const std::string bad_fields =
      wire::Encode({wire::MessageType::kStoreSet, {{"id", 1}, {"key", "k"}}, ""})
          .replace(8, 1, "[");
  std::string wrong_field_type = RegisterFrame("n0");
  const size_t at = wrong_field_type.find("\"devices\":2");
  ASSERT_NE(at, std::string::npos);
  wrong_field_type.replace(at, 11, "\"devices\":\"x\"");
  wrong_field_type[4] = static_cast<char>(wrong_field_type[4] + 2);
  std::string oversized = RegisterFrame("n0");
  oversized.append(5 << 20, 'x');
  for (const std::string& frame : {std::string("hello"), std::string(), bad_version, bad_type,
                                   bad_fields, wrong_field_type, oversized}) {
    client->send(zmq::buffer(frame), zmq::send_flags::none);
  }
  client->send(zmq::buffer(RegisterFrame("n0")), zmq::send_flags::none);
  std::optional<wire::Message> reply = Receive(*client, 10s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->type, wire::MessageType::kRegistered);
  EXPECT_EQ(reply->header["node"], "n0");

  // One node of two: still PENDING, so SIGTERM ends it at once ("nothing to resume").
  controller->Signal(SIGTERM);
  EXPECT_EQ(controller->Wait(30s), 75) << controller->Log();
  const std::string log = controller->Log();
  EXPECT_NE(log.find("dropped messages 7"), std::string::npos) << log;
  EXPECT_NE(log.find("malformed 3"), std::string::npos) << log;
  EXPECT_NE(log.find("oversized 1"), std::string::npos) << log;
  EXPECT_NE(log.find("version 1"), std::string::npos) << log;
  EXPECT_NE(log.find("type 1"), std::string::npos) << log;
  EXPECT_NE(log.find("fields 1"), std::string::npos) << log;
  EXPECT_NE(log.find("refused connections 1"), std::string::npos) << log;
}

TEST_F(ClusterTest, InvalidJobSpecExitsTwoNamingTheField) {
  const fs::path job = WriteJob("invalid", "");
  // A wrong type, an unknown key, layouts the nodes or the model cannot hold, and batch
  // arithmetic that does not add up: each names the field at its line and column.
  struct Case {
    std::string yaml, expected;
  } cases[] = {
      {"cluster: {nodes: two}\n", "job.yaml:1:18: cluster.nodes: expected an integer, found 'two'"},
      {"restart:\n  max_restart: 3\n", "job.yaml:2:3: restart.max_restart: unknown field"},
      {"cluster: {nodes: 3, devices_per_node: 1}\nparallel: {tp: 2}\n",
       "job.yaml:1:39: cluster.devices_per_node: expected nodes x devices_per_node = tp x cp x dp "
       "x pp"},
      {"security: {keys: [a]}\n", "job.yaml:1:18: security.keys: expected a string, found a list"},
      {"metrics: {progress_log_seconds: 0}\n",
       "job.yaml:1:33: metrics.progress_log_seconds: expected a number of seconds in [0.1, 86400], "
       "found 0"},
      {"model: {num_heads: 3}\ncluster: {devices_per_node: 2}\nparallel: {tp: 2}\n",
       "job.yaml:1:20: model.num_heads: expected a multiple of parallel.tp = 2, found 3"},
      {"batch: {micro: 2, global: 6}\ncluster: {devices_per_node: 2}\n",
       "job.yaml:1:27: batch.global: expected a multiple of batch.micro × data-parallel size = 2 × "
       "2 = 4 (global = micro × dp × accumulation steps), found 6"},
  };
  for (const Case& c : cases) {
    const fs::path file = job.parent_path() / "job.yaml";
    std::ofstream(file) << c.yaml;
    for (const char* command : {"validate", "controller", "run"}) {
      const std::string keys = std::string(command) == "controller" ? " --keys " + keys_ : "";
      const testing::CommandResult r = testing::RunDifftrain(
          std::string(command) + " " + testing::ShellQuote(file.string()) + keys);
      EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
      EXPECT_NE(r.output.find(c.expected), std::string::npos) << command << ": " << r.output;
    }
  }
}

// train.device auto, decided by the controller for the daemons that register: two nodes of
// GPUs get a job that says cuda (this controller's machine, the test's, shows no GPU), and a
// job the GPU step cannot train (tp 2) fails naming train.device instead of starting ranks.
TEST_F(ClusterTest, DeviceAutoFollowsTheWorkerDaemonsGpus) {
#ifdef DIFFTRAIN_HAVE_CUDA
  const std::string expected = "device: cuda";
#else
  const std::string expected = "device: cpu";  // no CUDA backend: auto never chooses the GPU
#endif
  Result<CurveKeys> keys = ReadKeys(keys_);
  ASSERT_TRUE(keys.ok());
  zmq::context_t context;
  // Two fake worker daemons, "g0" and "g1", each registering `gpus` GPUs.
  auto RegisterTwoNodes = [&](int gpus) {
    std::vector<std::unique_ptr<zmq::socket_t>> nodes;
    for (int i = 0; i < 2; ++i) {
      nodes.push_back(Connect(context, *keys, endpoint_));
      nodes.back()->send(zmq::buffer(RegisterFrame("g" + std::to_string(i), gpus)),
                         zmq::send_flags::none);
    }
    return nodes;
  };
  {
    const fs::path job = WriteJob("auto-dp");
    std::string yaml = ReadWholeFile(job);
    yaml.replace(yaml.find("tp: 2"), 5, "dp: 2");
    yaml.replace(yaml.find("devices_per_node: 2"), 19, "devices_per_node: 1");
    std::ofstream(job) << yaml;
    std::unique_ptr<Process> controller = StartController(job);
    std::vector<std::unique_ptr<zmq::socket_t>> nodes = RegisterTwoNodes(/*gpus=*/1);
    for (auto& node : nodes) {
      std::optional<wire::Message> m;
      while ((m = Receive(*node, 10s)) && m->type != wire::MessageType::kLaunch) {
      }
      ASSERT_TRUE(m.has_value()) << controller->Log();
      EXPECT_NE(m->payload.find(expected), std::string::npos) << m->payload;
      EXPECT_NE(m->payload.find("train.device: auto, resolved by the controller"), std::string::npos)
          << m->payload;
    }
    controller->Signal(SIGTERM);  // the fake daemons start no ranks: stop it, however it ends
    controller->Wait(60s);
    EXPECT_NE(controller->Log().find("train.device: auto for the worker daemons' NVIDIA H200"),
              std::string::npos)
        << controller->Log();
  }
#ifdef DIFFTRAIN_HAVE_CUDA
  {
    const fs::path job = WriteJob("auto-tp");
    std::unique_ptr<Process> controller = StartController(job);
    std::vector<std::unique_ptr<zmq::socket_t>> nodes = RegisterTwoNodes(/*gpus=*/2);
    EXPECT_EQ(controller->Wait(30s), 1) << controller->Log();
    EXPECT_NE(controller->Log().find("train.device cuda trains data-parallel layouts only; "
                                     "parallel.tp > 1 runs on the CPU"),
              std::string::npos)
        << controller->Log();
  }
#endif
}

TEST_F(ClusterTest, ValidatePrintsThePlan) {
  const fs::path job = WriteJob("plan");
  const testing::CommandResult r =
      testing::RunDifftrain("validate " + testing::ShellQuote(job.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected :
       {"world 4 = 2 node(s) x 2 device(s); tp 2 cp 1 dp 2 pp 1", "node 0: ranks 0,1",
        "node 1: ranks 2,3", "batch: global 4 = micro 2 x data-parallel 2 x accumulation 1",
        "memory per rank", "tp     [0,1] [2,3]", "dp     [0,2] [1,3]"}) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
}

TEST_F(ClusterTest, RunTrainsOnThisMachine) {
  const fs::path job = WriteJob("run", "");
  std::string yaml = ReadWholeFile(job);
  // One emulated node with both ranks; no keys given: `run` makes its own.
  yaml.replace(yaml.find("cluster: {nodes: 2, devices_per_node: 2}"),
               std::strlen("cluster: {nodes: 2, devices_per_node: 2}"),
               "cluster: {nodes: 1, devices_per_node: 2}");
  std::ofstream(job) << yaml;
  const testing::CommandResult r =
      testing::RunDifftrain("run " + testing::ShellQuote(job.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("final state SUCCEEDED"), std::string::npos) << r.output;
  int64_t step = 0;
  EXPECT_FALSE(FinalState(job, &step).empty());
  EXPECT_EQ(step, kSteps);
}

}  // namespace
}  // namespace difftrain
