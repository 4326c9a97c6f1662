// The chart's alerting rules (k8s/difftrain/templates/prometheus-rules.yaml), rendered by the
// real Helm: `promtool check rules` on the plain rules file, and `promtool test rules` with
// tests/metrics/alerts.test.yaml, which plays each alert's story (a stalled job, a
// straggler, restarts, memory near the device limit, an old checkpoint) and lists the
// alerts expected at each time. The PrometheusRule carries the same rules.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "tests/k8s/chart.h"

namespace difftrain::k8s {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ShellQuote;

class AlertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(RunCommand("command -v promtool").exit_code, 0)
        << "promtool is not installed: run scripts/install-deps.sh";
    if (std::string error = PrepareTools(); !error.empty()) FAIL() << error;
  }

  // The plain rules file of release "dit" (the ConfigMap's difftrain.rules.yaml).
  std::string RulesFile(const std::vector<std::string>& set = {}) {
    std::vector<std::string> args = {"-f", "cpu.yaml", "--set", "alerts.configMap.enabled=true"};
    for (const std::string& s : set) {
      args.push_back("--set");
      args.push_back(s);
    }
    const Rendered r = RenderChart(args);
    EXPECT_EQ(r.exit_code, 0) << r.text;
    const YAML::Node map = r.Find("ConfigMap", "dit-difftrain-alerts");
    if (!map) return "";
    return map["data"]["difftrain.rules.yaml"].as<std::string>();
  }

  fs::path Dir() const { return dir_.path(); }

  TempDir dir_;
};

TEST_F(AlertsTest, RulesPassPromtoolCheckAndTheirUnitTests) {
  const std::string rules = RulesFile();
  ASSERT_FALSE(rules.empty());
  std::ofstream(Dir() / "difftrain.rules.yaml") << rules;
  fs::copy_file(kSourceDir / "tests/metrics/alerts.test.yaml", Dir() / "alerts.test.yaml");

  const testing::CommandResult check =
      RunCommand("promtool check rules " + ShellQuote((Dir() / "difftrain.rules.yaml").string()));
  EXPECT_EQ(check.exit_code, 0) << check.output << rules;
  EXPECT_THAT(check.output, HasSubstr("SUCCESS: 5 rules found"));

  // promtool resolves rule_files relative to the test file's directory.
  const testing::CommandResult test =
      RunCommand("cd " + ShellQuote(Dir().string()) + " && promtool test rules alerts.test.yaml");
  EXPECT_EQ(test.exit_code, 0) << test.output << rules;
  EXPECT_THAT(test.output, HasSubstr("SUCCESS"));
}

// The unit tests can fail: a rule that fires a little later than the story expects.
TEST_F(AlertsTest, UnitTestsFailWhenARuleChanges) {
  std::ofstream(Dir() / "difftrain.rules.yaml") << RulesFile({"alerts.straggler.for=30m"});
  fs::copy_file(kSourceDir / "tests/metrics/alerts.test.yaml", Dir() / "alerts.test.yaml");
  const testing::CommandResult test =
      RunCommand("cd " + ShellQuote(Dir().string()) + " && promtool test rules alerts.test.yaml");
  EXPECT_NE(test.exit_code, 0) << test.output;
  EXPECT_THAT(test.output, HasSubstr("alertname: DifftrainStraggler, time: 20m"));
}

TEST_F(AlertsTest, PrometheusRuleHoldsTheRulesOfTheRulesFile) {
  const Rendered r = RenderChart({"-f", "gpu.yaml", "--set", "alerts.configMap.enabled=true"});
  ASSERT_EQ(r.exit_code, 0) << r.text;
  const YAML::Node rule = r.Find("PrometheusRule", "dit-difftrain");
  ASSERT_TRUE(rule) << "gpu.yaml enables the PrometheusRule\n" << r.text;
  EXPECT_EQ(rule["apiVersion"].as<std::string>(), "monitoring.coreos.com/v1");
  EXPECT_EQ(rule["metadata"]["labels"]["release"].as<std::string>(), "kube-prometheus-stack");
  const YAML::Node file =
      YAML::Load(r.Find("ConfigMap", "dit-difftrain-alerts")["data"]["difftrain.rules.yaml"]
                     .as<std::string>());
  EXPECT_EQ(YAML::Dump(rule["spec"]), YAML::Dump(file));
  EXPECT_EQ(rule["spec"]["groups"][0]["rules"].size(), 5u);
}

TEST_F(AlertsTest, ThresholdsComeFromTheValuesAndRulesSelectTheReleasesJob) {
  const std::string rules = RulesFile({"alerts.checkpointMaxAge=30m", "alerts.straggler.ratio=2",
                                       "alerts.memory.deviceBytes=1000"});
  EXPECT_THAT(rules, HasSubstr("{job=\"dit\"})\n          > 1800\n"));
  EXPECT_THAT(rules, HasSubstr("difftrain_job_straggler_ratio{job=\"dit\"} > 2\n"));
  EXPECT_THAT(rules, HasSubstr("> 0.95 * 1000\n"));

  const Rendered bad = RenderChart({"-f", "cpu.yaml", "--set", "alerts.configMap.enabled=true",
                                    "--set", "alerts.checkpointMaxAge=soon"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.text, HasSubstr("alerts: \"soon\" is not a duration like 30s, 15m, 2h or 1d"));
}

}  // namespace
}  // namespace difftrain::k8s
