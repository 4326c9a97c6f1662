// The metrics against the real tools. A local job (a `difftrain controller` and two
// `difftrain worker` daemons with two CPU ranks each, tp 2 x dp 2) serves /metrics;
// `promtool check metrics` lints the controller's and the workers' endpoints; a real
// Prometheus server (Debian's, on loopback, with a private configuration, storage and
// port) scrapes them every second. Its query API must return every rank's loss and FLOP/s,
// and the restart counter must move after a rank is killed with SIGKILL. (The dashboard's
// queries against a real scrape: tests/metrics/dashboard_test.cc.)
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/curve.h"
#include "common/temp_dir.h"
#include "model/parallel/rank_processes.h"
#include "tests/testing/http.h"
#include "tests/testing/processes.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::HttpGet;
using testing::Process;
namespace fs = std::filesystem;

constexpr char kJob[] = "metrics";  // the job file's stem: the metrics' job label
constexpr int kRanks = 4;

// Polls `ready` every 200 ms until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& ready, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(200ms);
  }
  return ready();
}

// The lines of an exposition that start with `name{`.
int CountSeries(const std::string& exposition, const std::string& name) {
  int n = 0;
  for (size_t at = 0; (at = exposition.find("\n" + name + "{", at)) != std::string::npos; ++at)
    ++n;
  return n;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"promtool", "prometheus"}) {
      ASSERT_EQ(testing::RunCommand(std::string("command -v ") + tool).exit_code, 0)
          << tool << " is not installed: run scripts/install-deps.sh";
    }
    dir_ = dir_holder_.path();
    keys_ = (dir_ / "keys").string();
    ASSERT_TRUE(WriteNewKeys(keys_).ok());
    std::set<int> ports;
    while (ports.size() < 4)
      ports.insert(testing::FreePort());
    auto it = ports.begin();
    controller_port_ = *it++;
    worker_ports_[0] = *it++;
    worker_ports_[1] = *it++;
    prometheus_port_ = *it;
  }

  // Two nodes of two CPU ranks, tp 2 x dp 2, training until the test ends.
  fs::path WriteJob() {
    const fs::path job = dir_ / (std::string(kJob) + ".yaml");
    std::ofstream(job) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, "
                          "depth: 2, num_heads: 4, num_classes: 10}\n"
                       << "batch: {micro: 2, global: 8}\n"
                       << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
                       << "train: {steps: 1000000, log_every: 200}\n"
                       << "parallel: {tp: 2, timeout_seconds: 20}\n"
                       << "checkpoint: {dir: \"" << (dir_ / "ckpt").string()
                       << "\", every: 50, keep: 2}\n"
                       << "cluster: {nodes: 2, devices_per_node: 2}\n"
                       << "restart: {max_restarts: 3, heartbeat_seconds: 0.2, "
                          "heartbeat_misses: 10, rendezvous_timeout_seconds: 60}\n";
    return job;
  }

  void StartJob() {
    const fs::path job = WriteJob();
    const std::string endpoint = "ipc://" + (dir_ / "controller.sock").string();
    controller_ = std::make_unique<Process>(
        std::vector<std::string>{DIFFTRAIN_BINARY, "controller", job.string(), "--bind", endpoint,
                                 "--keys", keys_, "--metrics-port",
                                 std::to_string(controller_port_)},
        dir_ / "controller.log");
    for (int n = 0; n < 2; ++n) {
      const std::string node = "n" + std::to_string(n);
      workers_[n] = std::make_unique<Process>(
          std::vector<std::string>{DIFFTRAIN_BINARY, "worker", "--controller", endpoint, "--node",
                                   node, "--keys", keys_, "--devices", "2", "--metrics-port",
                                   std::to_string(worker_ports_[n])},
          dir_ / ("worker-" + node + ".log"));
    }
  }

  void StartPrometheus() {
    const fs::path config = dir_ / "prometheus.yml";
    // honor_labels: the metrics' own `job` label (the difftrain job) wins over the scrape
    // job's name, as docs/metrics.md asks of every Prometheus that scrapes difftrain.
    std::ofstream(config) << "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                          << "scrape_configs:\n"
                          << "  - job_name: difftrain\n"
                          << "    honor_labels: true\n"
                          << "    static_configs:\n"
                          << "      - targets: ['127.0.0.1:" << controller_port_
                          << "', '127.0.0.1:" << worker_ports_[0]
                          << "', '127.0.0.1:" << worker_ports_[1] << "']\n";
    prometheus_ = std::make_unique<Process>(
        std::vector<std::string>{
            "/usr/bin/prometheus", "--config.file=" + config.string(),
            "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
            "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_),
            "--log.level=warn"},
        dir_ / "prometheus.log");
  }

  // The result vector of an instant query (empty on any error).
  nlohmann::json Query(const std::string& promql) {
    Result<std::string> body =
        HttpGet(prometheus_port_, "/api/v1/query?query=" + testing::UrlEncode(promql));
    if (!body.ok()) return nlohmann::json::array();
    const nlohmann::json reply = nlohmann::json::parse(*body, nullptr, false);
    if (!reply.is_object() || reply.value("status", "") != "success") {
      return nlohmann::json::array();
    }
    const nlohmann::json& data = reply["data"];
    // A scalar or string result is one value.
    if (data["resultType"] != "vector" && data["resultType"] != "matrix") {
      return nlohmann::json::array({data["result"]});
    }
    return data["result"];
  }

  std::string Logs() const {
    std::string logs;
    for (const char* name : {"controller.log", "worker-n0.log", "worker-n1.log", "prometheus.log"})
      logs += std::string("--- ") + name + "\n" + testing::ReadWholeFile(dir_ / name);
    return logs;
  }

  TempDir dir_holder_;
  fs::path dir_;
  std::string keys_;
  int controller_port_ = 0, worker_ports_[2] = {}, prometheus_port_ = 0;
  std::unique_ptr<Process> controller_, workers_[2], prometheus_;
};

TEST_F(PrometheusTest, ScrapesAJobAndCountsARestart) {
  StartJob();
  // Every rank has reported a step to its daemon, and the controller knows the straggler.
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(WaitFor(
        [&] {
          Result<std::string> m = HttpGet(worker_ports_[n], "/metrics");
          return m.ok() && CountSeries(*m, "difftrain_rank_loss") == 2;
        },
        90s))
        << Logs();
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        Result<std::string> m = HttpGet(controller_port_, "/metrics");
        return m.ok() && CountSeries(*m, "difftrain_job_straggler_ratio") == 1;
      },
      30s))
      << Logs();

  // promtool lints each endpoint's exposition.
  for (int port : {controller_port_, worker_ports_[0], worker_ports_[1]}) {
    Result<std::string> m = HttpGet(port, "/metrics");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const fs::path file = dir_ / ("metrics-" + std::to_string(port) + ".txt");
    std::ofstream(file) << *m;
    const testing::CommandResult lint =
        testing::RunCommand("promtool check metrics < " + testing::ShellQuote(file.string()));
    EXPECT_EQ(lint.exit_code, 0) << "port " << port << ":\n" << lint.output << "\n" << *m;
  }

  StartPrometheus();
  ASSERT_TRUE(WaitFor([&] { return HttpGet(prometheus_port_, "/-/ready").ok(); }, 30s)) << Logs();
  // Loss and FLOP/s of every rank, with all their labels.
  for (const char* metric : {"difftrain_rank_loss", "difftrain_rank_model_flops_per_second"}) {
    const std::string query = std::string(metric) + "{job=\"" + kJob + "\"}";
    ASSERT_TRUE(WaitFor([&] { return Query(query).size() == kRanks; }, 30s)) << query << Logs();
    std::set<std::string> ranks;
    for (const nlohmann::json& series : Query(query)) {
      const nlohmann::json& labels = series["metric"];
      for (const char* label : {"node", "rank", "tp", "cp", "dp", "pp"})
        EXPECT_TRUE(labels.contains(label)) << label << " in " << series.dump();
      EXPECT_GT(std::stod(series["value"][1].get<std::string>()), 0) << series.dump();
      ranks.insert(labels.value("rank", ""));
    }
    EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"})) << metric;
  }

  // kill -9 of a rank: the controller restarts every rank, and the counter shows it.
  const std::string restarts = std::string("difftrain_job_restarts_total{job=\"") + kJob + "\"}";
  // The controller's target may be scraped after the workers' (whose series are above).
  ASSERT_TRUE(WaitFor([&] { return Query(restarts).size() == 1; }, 30s)) << Logs();
  const nlohmann::json before = Query(restarts);
  EXPECT_EQ(before[0]["value"][1], "0");
  const std::vector<pid_t> ranks = testing::ChildrenOf(workers_[1]->pid(), "train");
  ASSERT_EQ(ranks.size(), 2u) << Logs();
  ::kill(ranks[0], SIGKILL);
  EXPECT_TRUE(WaitFor(
      [&] {
        const nlohmann::json r = Query(restarts);
        return r.size() == 1 && std::stod(r[0]["value"][1].get<std::string>()) >= 1;
      },
      60s))
      << Logs();
  // The restarted ranks report again on their old series.
  EXPECT_TRUE(WaitFor(
      [&] {
        const nlohmann::json up =
            Query(std::string("count(difftrain_rank_up{job=\"") + kJob + "\"} == 1)");
        return up.size() == 1 && up[0]["value"][1] == std::to_string(kRanks);
      },
      60s))
      << Logs();
}

}  // namespace
}  // namespace difftrain
