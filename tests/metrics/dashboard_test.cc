// The Grafana dashboard (k8s/difftrain/dashboards/difftrain.json), checked as far as a
// machine without Grafana allows:
//   - its structure: every panel and query on the `datasource` variable, unique panel ids,
//     a grid without overlaps, a unit Grafana knows on every panel, only defined variables;
//   - every query, its variables substituted as Grafana does, is valid PromQL for
//     `promtool check rules` (as a recording rule);
//   - every query returns data from a real Prometheus (Debian's, on loopback) scraping a real
//     job: `difftrain run` with two emulated nodes of two CPU ranks (tp 2 x dp 2) and its
//     metrics ports on. So does every metric the chart's alerting rules use.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "tests/k8s/chart.h"
#include "tests/testing/http.h"
#include "tests/testing/processes.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kDashboard =
    fs::path(DIFFTRAIN_SOURCE_DIR) / "k8s/difftrain/dashboards/difftrain.json";
constexpr char kJob[] = "dashboard";  // the job file's stem: the metrics' job label
constexpr int kScrapeSeconds = 1;

json LoadDashboard() {
  return json::parse(std::ifstream(kDashboard));
}

// Every panel, the panels of collapsed rows included; rows themselves too.
void CollectPanels(const json& panels, std::vector<json>& out) {
  for (const json& p : panels) {
    out.push_back(p);
    if (p.contains("panels")) CollectPanels(p["panels"], out);
  }
}
std::vector<json> Panels(const json& dashboard) {
  std::vector<json> out;
  CollectPanels(dashboard["panels"], out);
  return out;
}

std::string VariableQuery(const json& variable) {
  return variable["query"].is_object() ? variable["query"]["query"].get<std::string>()
                                       : variable["query"].get<std::string>();
}

// Grafana's $__interval for a time range: range / max data points, rounded as Grafana's
// rangeutil.roundInterval does, and no less than the data source's scrape interval.
int IntervalSeconds(int range_seconds, int max_data_points = 1000) {
  const double raw = static_cast<double>(range_seconds) / max_data_points;
  static const std::pair<double, int> kSteps[] = {
      {1.5, 1},   {3.5, 2},    {7.5, 5},     {12.5, 10},   {17.5, 15},
      {25, 20},   {45, 30},    {90, 60},     {210, 120},   {450, 300},
      {750, 600}, {1050, 900}, {1500, 1200}, {2700, 1800}, {5400, 3600}};
  int interval = 7200;
  for (const auto& [below, seconds] : kSteps) {
    if (raw < below) {
      interval = seconds;
      break;
    }
  }
  return std::max(interval, kScrapeSeconds);
}

// The dashboard's default time range ("now-1h") in seconds.
int RangeSeconds(const json& dashboard) {
  std::smatch m;
  const std::string from = dashboard["time"]["from"].get<std::string>();
  if (!std::regex_match(from, m, std::regex(R"(now-(\d+)([smhd]))"))) return 3600;
  const std::map<std::string, int> unit = {{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}};
  return std::stoi(m[1]) * unit.at(m[2]);
}

// The values Grafana gives the variables when the dashboard shows job kJob with everything
// else at "All" (allValue .*), and its built-in interval and range variables.
std::map<std::string, std::string> VariableValues(const json& dashboard) {
  std::map<std::string, std::string> values;
  for (const json& v : dashboard["templating"]["list"]) {
    const std::string name = v["name"].get<std::string>();
    if (v["type"] == "datasource") {
      values[name] = "prometheus";
    } else if (name == "job") {
      values[name] = kJob;
    } else {
      values[name] = v.value("allValue", ".*");
    }
  }
  const int range = RangeSeconds(dashboard);
  const int interval = IntervalSeconds(range);
  // $__rate_interval: max($__interval + scrape interval, 4 x scrape interval).
  const int rate_interval = std::max(interval + kScrapeSeconds, 4 * kScrapeSeconds);
  values["__interval"] = std::to_string(interval) + "s";
  values["__interval_ms"] = std::to_string(interval * 1000);
  values["__rate_interval"] = std::to_string(rate_interval) + "s";
  values["__range"] = std::to_string(range) + "s";
  values["__range_s"] = std::to_string(range);
  values["__range_ms"] = std::to_string(range * 1000);
  return values;
}

// `text` with Grafana's variable syntaxes ($name, ${name}, ${name:format}, [[name]])
// replaced; the names of variables without a value are added to `unknown`.
std::string Substitute(const std::string& text, const std::map<std::string, std::string>& values,
                       std::set<std::string>* unknown = nullptr) {
  static const std::regex kVariable(R"(\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\])");
  std::string out;
  auto begin = std::sregex_iterator(text.begin(), text.end(), kVariable);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const std::string name = m[1].matched ? m[1] : m[2].matched ? m[2] : m[3];
    out += text.substr(last, m.position() - last);
    if (auto v = values.find(name); v != values.end()) {
      out += v->second;
    } else {
      out += m.str();
      if (unknown != nullptr) unknown->insert(name);
    }
    last = m.position() + m.length();
  }
  return out + text.substr(last);
}

// (panel title, refId, expression substituted) of every query of the dashboard.
struct Query {
  std::string panel, ref_id, expr;
};
std::vector<Query> Queries(const json& dashboard) {
  const auto values = VariableValues(dashboard);
  std::vector<Query> queries;
  for (const json& panel : Panels(dashboard)) {
    for (const json& target : panel.value("targets", json::array())) {
      queries.push_back({panel["title"].get<std::string>(), target.value("refId", ""),
                         Substitute(target["expr"].get<std::string>(), values)});
    }
  }
  return queries;
}

TEST(DashboardTest, EveryPanelAndQueryUsesTheDatasourceVariable) {
  const json dashboard = LoadDashboard();
  const json& first = dashboard["templating"]["list"][0];
  EXPECT_EQ(first["name"], "datasource");
  EXPECT_EQ(first["type"], "datasource");
  EXPECT_EQ(first["query"], "prometheus");
  const json expected = {{"type", "prometheus"}, {"uid", "${datasource}"}};
  int queries = 0;
  for (const json& panel : Panels(dashboard)) {
    if (panel["type"] == "row") {
      EXPECT_FALSE(panel.contains("targets")) << panel["title"];
      continue;
    }
    EXPECT_EQ(panel["datasource"], expected) << panel["title"];
    ASSERT_TRUE(panel.contains("targets")) << panel["title"] << " has no query";
    std::set<std::string> ref_ids;
    for (const json& target : panel["targets"]) {
      EXPECT_EQ(target["datasource"], expected) << panel["title"];
      EXPECT_TRUE(ref_ids.insert(target.value("refId", "")).second)
          << panel["title"] << ": refId " << target.value("refId", "") << " twice";
      EXPECT_FALSE(target.value("expr", "").empty()) << panel["title"];
      ++queries;
    }
  }
  for (const json& v : dashboard["templating"]["list"]) {
    if (v["type"] == "query") {
      EXPECT_EQ(v["datasource"], expected) << v["name"];
    }
  }
  EXPECT_GE(queries, 20);
}

TEST(DashboardTest, PanelIdsAreUniqueAndPanelsTileTheGrid) {
  std::set<int> ids;
  struct Box {
    int x, y, w, h;
    std::string title;
  };
  std::vector<Box> boxes;
  for (const json& panel : Panels(LoadDashboard())) {
    ASSERT_TRUE(panel["id"].is_number_integer()) << panel["title"];
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second)
        << "panel id " << panel["id"] << " twice";
    const json& g = panel["gridPos"];
    const Box b{g["x"].get<int>(), g["y"].get<int>(), g["w"].get<int>(), g["h"].get<int>(),
                panel["title"].get<std::string>()};
    EXPECT_GT(b.w, 0) << b.title;
    EXPECT_GT(b.h, 0) << b.title;
    EXPECT_LE(b.x + b.w, 24) << b.title << " is wider than the grid's 24 columns";
    for (const Box& o : boxes) {
      const bool apart =
          b.x + b.w <= o.x || o.x + o.w <= b.x || b.y + b.h <= o.y || o.y + o.h <= b.y;
      EXPECT_TRUE(apart) << b.title << " overlaps " << o.title;
    }
    boxes.push_back(b);
  }
}

// Units are Grafana's unit ids; a panel without one shows raw numbers with SI prefixes, which
// reads wrong for bytes, seconds and ratios.
TEST(DashboardTest, EveryPanelHasAUnitGrafanaKnows) {
  const std::set<std::string> kUnits = {"none",  "short",       "s",       "ms",           "bytes",
                                        "flops", "percentunit", "percent", "dateTimeAsIso"};
  for (const json& panel : Panels(LoadDashboard())) {
    if (panel["type"] == "row") continue;
    const json& config = panel["fieldConfig"];
    ASSERT_TRUE(config["defaults"].contains("unit")) << panel["title"] << " has no unit";
    const std::string unit = config["defaults"]["unit"].get<std::string>();
    EXPECT_TRUE(kUnits.count(unit)) << panel["title"] << ": " << unit;
    for (const json& override : config.value("overrides", json::array())) {
      for (const json& property : override["properties"]) {
        if (property["id"] == "unit") {
          EXPECT_TRUE(kUnits.count(property["value"].get<std::string>()))
              << panel["title"] << ": " << property["value"];
        }
      }
    }
  }
}

TEST(DashboardTest, QueriesUseOnlyDefinedVariables) {
  const json dashboard = LoadDashboard();
  const auto values = VariableValues(dashboard);
  std::set<std::string> unknown;
  for (const json& panel : Panels(dashboard)) {
    for (const json& target : panel.value("targets", json::array())) {
      Substitute(target["expr"].get<std::string>(), values, &unknown);
      Substitute(target["datasource"]["uid"].get<std::string>(), values, &unknown);
    }
  }
  for (const json& v : dashboard["templating"]["list"]) {
    if (v["type"] == "query") Substitute(VariableQuery(v), values, &unknown);
  }
  EXPECT_TRUE(unknown.empty()) << "undefined: " << ::testing::PrintToString(unknown);
  // The substitution itself: what a query of the Ranks row becomes.
  EXPECT_EQ(Substitute(R"(rate(x{job=~"$job", rank=~"${rank}"}[$__rate_interval]))", values),
            std::string(R"(rate(x{job=~")") + kJob + R"(", rank=~".*"}[6s]))");
}

// Every query (substituted) is valid PromQL: promtool parses it as a recording rule.
TEST(DashboardTest, QueriesPassPromtoolCheckRules) {
  TempDir dir;
  const fs::path rules = fs::path(dir.path()) / "dashboard.rules.yaml";
  std::ofstream out(rules);
  out << "groups:\n  - name: dashboard\n    rules:\n";
  int n = 0;
  for (const Query& q : Queries(LoadDashboard())) {
    out << "      - record: difftrain_dashboard:query_" << n++
        << "\n        expr: " << json(q.expr).dump() << "\n";
  }
  out.close();
  const testing::CommandResult check =
      testing::RunCommand("promtool check rules " + testing::ShellQuote(rules.string()));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_THAT(check.output, ::testing::HasSubstr("SUCCESS: " + std::to_string(n) + " rules found"));

  // The check is not vacuous: a query with a variable Grafana would not substitute fails.
  std::ofstream(rules) << "groups:\n  - name: dashboard\n    rules:\n"
                       << "      - record: difftrain_dashboard:bad\n"
                       << "        expr: rate(difftrain_rank_data_wait_seconds_total[$__nope])\n";
  EXPECT_NE(
      testing::RunCommand("promtool check rules " + testing::ShellQuote(rules.string())).exit_code,
      0);
}

// Polls `ready` every 250 ms until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& ready, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(250ms);
  }
  return ready();
}

// A port P of 127.0.0.1 with P + 1 and P + 2 free too: `difftrain run` serves the
// controller's metrics on P and node local-i's on P + 1 + i.
int ThreeFreePorts() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int port = testing::FreePort();
    bool free = port > 0 && port + 2 < 65536;
    for (int i = 1; free && i <= 2; ++i) {
      free =
          testing::HttpGet(port + i, "/").status().message().find("refused") != std::string::npos;
    }
    if (free) return port;
  }
  return 0;
}

class DashboardLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"promtool", "prometheus"}) {
      ASSERT_EQ(testing::RunCommand(std::string("command -v ") + tool).exit_code, 0)
          << tool << " is not installed: run scripts/install-deps.sh";
    }
    dir_ = dir_holder_.path();
    metrics_port_ = ThreeFreePorts();
    ASSERT_GT(metrics_port_, 0);
    do {
      prometheus_port_ = testing::FreePort();
    } while (prometheus_port_ >= metrics_port_ && prometheus_port_ <= metrics_port_ + 2);
  }

  void TearDown() override {
    // The job stops as on a user's Ctrl-C: the controller stops every rank.
    if (job_) {
      job_->Signal(SIGTERM);
      EXPECT_GE(job_->Wait(60s), 0) << "`difftrain run` did not stop on SIGTERM\n" << Logs();
    }
  }

  void StartJob() {
    const fs::path job = dir_ / (std::string(kJob) + ".yaml");
    std::ofstream(job) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, "
                          "depth: 2, num_heads: 4, num_classes: 10}\n"
                       << "batch: {micro: 2, global: 8}\n"
                       << "optimizer: {lr: 0.001, grad_clip: 1.0, warmup_steps: 3}\n"
                       << "train: {steps: 1000000, log_every: 1000}\n"
                       << "parallel: {tp: 2, timeout_seconds: 20}\n"
                       << "checkpoint: {dir: \"" << (dir_ / "ckpt").string()
                       << "\", every: 20, keep: 2}\n"
                       << "cluster: {nodes: 2, devices_per_node: 2}\n"
                       << "metrics: {port: " << metrics_port_ << "}\n";
    job_ = std::make_unique<testing::Process>(
        std::vector<std::string>{DIFFTRAIN_BINARY, "run", job.string()}, dir_ / "run.log");
  }

  void StartPrometheus() {
    const fs::path config = dir_ / "prometheus.yml";
    // honor_labels: the metrics' own `job` label wins (docs/metrics.md).
    std::ofstream(config) << "global: {scrape_interval: " << kScrapeSeconds
                          << "s, scrape_timeout: 1s}\n"
                          << "scrape_configs:\n"
                          << "  - job_name: difftrain\n"
                          << "    honor_labels: true\n"
                          << "    static_configs:\n"
                          << "      - targets: ['127.0.0.1:" << metrics_port_
                          << "', '127.0.0.1:" << metrics_port_ + 1
                          << "', '127.0.0.1:" << metrics_port_ + 2 << "']\n";
    prometheus_ = std::make_unique<testing::Process>(
        std::vector<std::string>{
            "/usr/bin/prometheus", "--config.file=" + config.string(),
            "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
            "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_),
            "--log.level=warn"},
        dir_ / "prometheus.log");
  }

  // The result of an instant query; empty on any error or when nothing matches.
  json Query(const std::string& promql) {
    Result<std::string> body =
        testing::HttpGet(prometheus_port_, "/api/v1/query?query=" + testing::UrlEncode(promql));
    if (!body.ok()) return json::array();
    const json reply = json::parse(*body, nullptr, false);
    if (!reply.is_object() || reply.value("status", "") != "success") return json::array();
    const json& data = reply["data"];
    if (data["resultType"] != "vector" && data["resultType"] != "matrix") {
      return json::array({data["result"]});
    }
    return data["result"];
  }

  std::string Logs() const {
    std::string logs;
    for (const char* name : {"run.log", "prometheus.log"})
      logs += std::string("--- ") + name + "\n" + testing::ReadWholeFile(dir_ / name);
    return logs;
  }

  TempDir dir_holder_;
  fs::path dir_;
  int metrics_port_ = 0, prometheus_port_ = 0;
  std::unique_ptr<testing::Process> job_, prometheus_;
};

TEST_F(DashboardLiveTest, EveryPanelQueryReturnsDataFromARealJob) {
  StartJob();
  // Both nodes' ranks have stepped, and the controller knows the straggler.
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(WaitFor(
        [&] {
          Result<std::string> m = testing::HttpGet(metrics_port_ + 1 + n, "/metrics");
          return m.ok() && m->find("\ndifftrain_rank_loss{") != std::string::npos;
        },
        120s))
        << "node local-" << n << "\n"
        << Logs();
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        Result<std::string> m = testing::HttpGet(metrics_port_, "/metrics");
        return m.ok() && m->find("\ndifftrain_job_straggler_ratio{") != std::string::npos;
      },
      60s))
      << Logs();

  StartPrometheus();
  ASSERT_TRUE(WaitFor([&] { return testing::HttpGet(prometheus_port_, "/-/ready").ok(); }, 30s))
      << Logs();
  // All three endpoints scraped.
  ASSERT_TRUE(WaitFor([&] { return !Query("count(up == 1) == 3").empty(); }, 30s)) << Logs();

  const json dashboard = LoadDashboard();
  const auto values = VariableValues(dashboard);
  // The variables' options, as Grafana asks for label_values(METRIC, LABEL).
  for (const json& variable : dashboard["templating"]["list"]) {
    if (variable["type"] != "query") continue;
    std::smatch m;
    const std::string query = Substitute(VariableQuery(variable), values);
    ASSERT_TRUE(std::regex_match(query, m, std::regex(R"(label_values\((.+),\s*(\w+)\))")))
        << query;
    EXPECT_TRUE(WaitFor(
        [&] { return !Query("group by (" + m[2].str() + ") (" + m[1].str() + ")").empty(); }, 20s))
        << variable["name"] << ": " << query;
  }
  int answered = 0;
  for (const auto& q : Queries(dashboard)) {
    const bool data = WaitFor([&] { return !Query(q.expr).empty(); }, 20s);
    EXPECT_TRUE(data) << "panel '" << q.panel << "' " << q.ref_id << ": " << q.expr;
    answered += data;
  }
  EXPECT_GE(answered, 20);

  // Every metric the chart's alerting rules use is one the job exports.
  const k8s::Rendered rules =
      k8s::RenderChart({"-f", "cpu.yaml", "--set", "alerts.configMap.enabled=true", "--show-only",
                        "templates/prometheus-rules.yaml"});
  ASSERT_EQ(rules.exit_code, 0) << rules.text;
  const std::string text =
      rules.Find("ConfigMap", "dit-difftrain-alerts")["data"]["difftrain.rules.yaml"]
          .as<std::string>();
  std::set<std::string> metrics;
  const std::regex metric(R"(difftrain_\w+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), metric);
       it != std::sregex_iterator(); ++it) {
    metrics.insert(it->str());
  }
  EXPECT_GE(metrics.size(), 5u);
  for (const std::string& name : metrics) {
    EXPECT_FALSE(Query(name + "{job=\"" + kJob + "\"}").empty())
        << "the alerting rules use " << name << ", which the job does not export";
  }
}

}  // namespace
}  // namespace difftrain
