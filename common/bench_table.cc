#include "common/bench_table.h"

#include <algorithm>

#include <fmt/format.h>

namespace difftrain {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The columns of every format, in order, as text.
const std::vector<std::string>& Header() {
  static const std::vector<std::string> header = {"device",
                                                  "model",
                                                  "precision",
                                                  "data",
                                                  "layout",
                                                  "devices",
                                                  "nodes",
                                                  "micro batch",
                                                  "global batch",
                                                  "samples/GPU/s",
                                                  "TFLOP/s/GPU",
                                                  "MFU",
                                                  "peak memory (GiB)",
                                                  "planned memory (GiB)",
                                                  "outcome",
                                                  "command"};
  return header;
}

std::vector<std::string> Cells(const BenchRow& r) {
  const BenchConfig& c = r.config;
  const BenchFigures& f = r.figures;
  const bool ok = r.outcome == "ok";
  auto figure = [ok](const std::string& text) { return ok ? text : std::string("-"); };
  return {c.device,
          c.model,
          c.precision,
          c.data,
          c.layout,
          std::to_string(c.devices),
          std::to_string(c.nodes),
          std::to_string(c.micro_batch),
          std::to_string(c.global_batch),
          figure(fmt::format("{:.2f}", f.samples_per_second_per_device)),
          figure(fmt::format("{:.4f}", f.tflops_per_device)),
          figure(fmt::format("{:.1f}%", 100 * f.mfu)),
          figure(fmt::format("{:.2f}", f.peak_memory_bytes / (1 << 30))),
          c.planned_memory_bytes > 0 ? fmt::format("{:.2f}", c.planned_memory_bytes / (1 << 30))
                                     : std::string("-"),
          r.outcome,
          c.command};
}

// A CSV field: quoted when it holds a comma, a quote or a line break.
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s)
    out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

}  // namespace

Result<BenchFigures> SummarizeMetrics(const std::vector<nlohmann::json>& lines, int warmup,
                                      const BenchConfig& config) {
  std::vector<double> step_seconds;
  double peak = 0, memory = 0;
  for (const nlohmann::json& line : lines) {
    const int64_t step = line.value("step", int64_t{0});
    memory = std::max(memory, line.value("host_resident_bytes", 0.0));
    if (line.value("rank", 0) != 0 || step <= warmup) continue;
    step_seconds.push_back(line.value("step_seconds", 0.0));
    peak = line.value("peak_flops_per_second", 0.0);
  }
  if (step_seconds.empty()) {
    return Errorf("no measured step in the metrics (rank 0 reported {} lines, warm-up {})",
                  lines.size(), warmup);
  }
  BenchFigures f;
  f.measured_steps = static_cast<int>(step_seconds.size());
  f.step_seconds = Median(step_seconds);
  f.samples_per_second_per_device = config.global_batch / f.step_seconds / config.devices;
  f.tflops_per_device = f.samples_per_second_per_device * config.flops_per_sample / 1e12;
  f.mfu = peak > 0 ? f.tflops_per_device * 1e12 / peak : 0;
  f.peak_memory_bytes = memory;
  return f;
}

std::string BenchMarkdown(const std::vector<BenchRow>& rows) {
  std::string out = "|";
  std::string rule = "|";
  for (const std::string& h : Header()) {
    out += " " + h + " |";
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  for (const BenchRow& r : rows) {
    out += "|";
    for (std::string cell : Cells(r)) {
      // A pipe would end the cell early.
      for (size_t at = 0; (at = cell.find('|', at)) != std::string::npos; at += 2)
        cell.replace(at, 1, "\\|");
      out += " " + cell + " |";
    }
    out += "\n";
  }
  return out;
}

std::string BenchCsv(const std::vector<BenchRow>& rows) {
  std::string out;
  auto line = [&out](const std::vector<std::string>& fields) {
    for (size_t i = 0; i < fields.size(); ++i)
      out += (i ? "," : "") + CsvField(fields[i]);
    out += "\n";
  };
  line(Header());
  for (const BenchRow& r : rows)
    line(Cells(r));
  return out;
}

nlohmann::json BenchJson(const std::vector<BenchRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const BenchRow& r : rows) {
    const BenchConfig& c = r.config;
    nlohmann::json row = {{"device", c.device},
                          {"model", c.model},
                          {"precision", c.precision},
                          {"data", c.data},
                          {"layout", c.layout},
                          {"devices", c.devices},
                          {"nodes", c.nodes},
                          {"micro_batch", c.micro_batch},
                          {"global_batch", c.global_batch},
                          {"flops_per_sample", c.flops_per_sample},
                          {"planned_memory_bytes", c.planned_memory_bytes},
                          {"memory_budget_bytes", c.memory_budget_bytes},
                          {"outcome", r.outcome},
                          {"command", c.command}};
    if (r.outcome == "ok") {
      const BenchFigures& f = r.figures;
      row.update({{"measured_steps", f.measured_steps},
                  {"step_seconds", f.step_seconds},
                  {"samples_per_second_per_device", f.samples_per_second_per_device},
                  {"tflops_per_device", f.tflops_per_device},
                  {"mfu", f.mfu},
                  {"peak_memory_bytes", f.peak_memory_bytes}});
    }
    out.push_back(row);
  }
  return out;
}

}  // namespace difftrain
