// The arithmetic of the bench table on a fixed run's metrics, and its three formats.
#include "common/bench_table.h"

#include <gtest/gtest.h>

namespace difftrain {
namespace {

// Two ranks, five steps each; rank 1's figures must not count, nor the warm-up steps.
std::vector<nlohmann::json> FixedRun() {
  const double rank0[] = {9.0, 8.0, 2.0, 1.5, 0.5};
  std::vector<nlohmann::json> lines;
  for (int step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      lines.push_back({{"step", step},
                       {"rank", rank},
                       {"step_seconds", rank == 0 ? rank0[step - 1] : 100.0},
                       {"peak_flops_per_second", rank == 0 ? 10e12 : 1.0},
                       {"host_resident_bytes", (rank == 1 && step == 4) ? 3.0 * (1 << 30) : 1e9}});
    }
  }
  return lines;
}

BenchConfig FixedConfig() {
  BenchConfig c;
  c.device = "cpu";
  c.model = "DiT-S/4 32x32";
  c.precision = "fp32";
  c.data = "synthetic";
  c.layout = "tp 1 cp 1 pp 1 dp 2";
  c.devices = 2;
  c.micro_batch = 4;
  c.global_batch = 8;
  c.flops_per_sample = 1e12;
  c.command = "difftrain run job.yaml";
  return c;
}

TEST(BenchTableTest, FiguresAreMediansOverMeasuredStepsPerDevice) {
  Result<BenchFigures> f = SummarizeMetrics(FixedRun(), 2, FixedConfig());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->measured_steps, 3);
  EXPECT_DOUBLE_EQ(f->step_seconds, 1.5);  // median of 2.0, 1.5, 0.5
  // 8 samples per 1.5 s over 2 devices; 1 TFLOP per sample; against a 10 TFLOP/s peak.
  EXPECT_DOUBLE_EQ(f->samples_per_second_per_device, 8 / 1.5 / 2);
  EXPECT_DOUBLE_EQ(f->tflops_per_device, 8 / 1.5 / 2);
  EXPECT_DOUBLE_EQ(f->mfu, 8 / 1.5 / 2 / 10);
  EXPECT_DOUBLE_EQ(f->peak_memory_bytes, 3.0 * (1 << 30));
}

TEST(BenchTableTest, NoMeasuredStepIsAnError) {
  Result<BenchFigures> f = SummarizeMetrics(FixedRun(), 5, FixedConfig());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("no measured step"), std::string::npos);
}

TEST(BenchTableTest, FormatsCarryEveryRowAndOutcome) {
  BenchRow ok{FixedConfig(), "ok", *SummarizeMetrics(FixedRun(), 2, FixedConfig())};
  BenchRow failed{FixedConfig(), "error: a, \"quoted\" | piped reason", {}};
  const std::vector<BenchRow> rows = {ok, failed};
  const std::string md = BenchMarkdown(rows);
  EXPECT_NE(
      md.find("| cpu | DiT-S/4 32x32 | fp32 | synthetic | tp 1 cp 1 pp 1 dp 2 | 2 | 1 | 4 | 8 "
              "| 2.67 | 2.6667 | 26.7% | 3.00 | - | ok | difftrain run job.yaml |"),
      std::string::npos)
      << md;
  EXPECT_NE(md.find("| - | - | - | - | - | error: a, \"quoted\" \\| piped reason |"),
            std::string::npos)
      << md;
  const std::string csv = BenchCsv(rows);
  EXPECT_NE(csv.find(",\"error: a, \"\"quoted\"\" | piped reason\","), std::string::npos) << csv;
  const nlohmann::json json = BenchJson(rows);
  ASSERT_EQ(json.size(), 2u);
  EXPECT_DOUBLE_EQ(json[0]["mfu"].get<double>(), 8 / 1.5 / 2 / 10);
  EXPECT_FALSE(json[1].contains("mfu"));
}

}  // namespace
}  // namespace difftrain
