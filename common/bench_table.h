// The table of `difftrain bench` (docs/bench.md): one row per configuration of a sweep,
// its throughput figures taken from the training processes' metrics files (JSON lines,
// docs/metrics.md), printed as Markdown and written as CSV and JSON.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

// What a row describes: the configuration, and how to run it again.
struct BenchConfig {
  std::string device;     // "cpu", or the GPU's name
  std::string model;      // "DiT-S/4 32x32"
  std::string precision;  // "fp32"
  std::string data;       // "synthetic"
  std::string layout;     // "tp 1 cp 1 pp 1 dp 2"
  int devices = 1, nodes = 1;
  int micro_batch = 1, global_batch = 1;
  double flops_per_sample = 0;  // training FLOPs (6 × forward MACs)
  // The arenas a rank allocates (parameters, gradients, optimizer, EMA, activations) by the
  // trainer's memory model, and the budget they were held against; 0 when unknown.
  double planned_memory_bytes = 0, memory_budget_bytes = 0;
  std::string command;  // reproduces the row
};

// The figures of a configuration that ran: medians over the measured steps.
struct BenchFigures {
  int measured_steps = 0;
  double step_seconds = 0;
  double samples_per_second_per_device = 0;
  double tflops_per_device = 0;
  double mfu = 0;                // against the peak the ranks measured
  double peak_memory_bytes = 0;  // the largest resident memory any rank reported
};

struct BenchRow {
  BenchConfig config;
  std::string
      outcome;  // "ok", "OOM" (planned over the budget, or an allocation failed), "error: <reason>"
  BenchFigures figures;  // when ok
};

// The figures of a run from its ranks' metrics lines (one JSON object per rank and step),
// skipping each rank's first `warmup` steps. The step time is rank 0's median; samples per
// device per second = global batch / step time / devices; TFLOP/s per device = that ×
// FLOPs per sample; MFU = TFLOP/s per device / rank 0's peak. Fails when no measured step
// is there.
Result<BenchFigures> SummarizeMetrics(const std::vector<nlohmann::json>& lines, int warmup,
                                      const BenchConfig& config);

std::string BenchMarkdown(const std::vector<BenchRow>& rows);
std::string BenchCsv(const std::vector<BenchRow>& rows);
nlohmann::json BenchJson(const std::vector<BenchRow>& rows);

}  // namespace difftrain
