#include "model/train/peak_flops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "model/cpu/gemm.h"
#include "model/tensor/buffer.h"

namespace difftrain {

double GpuPeakFlops(std::string_view device_name) {
  // Longest names first: "H200" must not be taken for "H20".
  static const std::pair<std::string_view, double> kTable[] = {
      {"H200", 989e12}, {"H100", 989e12}, {"H20", 148e12}, {"A100", 312e12}};
  for (const auto& [model, flops] : kTable) {
    if (device_name.find(model) != std::string_view::npos) return flops;
  }
  return 0;
}

PeakFlops MeasureSgemmPeak(int n, int repeats) {
  using Clock = std::chrono::steady_clock;
  const size_t elements = static_cast<size_t>(n) * n;
  Buffer<float> a(elements), b(elements), c(elements);
  for (size_t i = 0; i < elements; ++i)
    a[i] = b[i] = 1.0f / static_cast<float>(1 + i % 7);
  cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const Clock::time_point t0 = Clock::now();
    cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n / std::max(seconds, 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  PeakFlops peak;
  peak.flops_per_second = rates[rates.size() / 2];
  peak.source = fmt::format("OpenBLAS sgemm {}^3 on {} thread(s), median of {}", n,
                            omp_get_max_threads(), rates.size());
  return peak;
}

Result<std::optional<double>> CpuPeakFlopsGiven() {
  const char* given = std::getenv("DIFFTRAIN_CPU_PEAK_GFLOPS");
  if (given == nullptr || *given == '\0') return std::optional<double>();
  char* end = nullptr;
  const double gflops = std::strtod(given, &end);
  if (*end != '\0' || !std::isfinite(gflops) || gflops <= 0) {
    return Errorf("DIFFTRAIN_CPU_PEAK_GFLOPS='{}': expected a positive number of GFLOP/s", given);
  }
  return std::optional<double>(gflops * 1e9);
}

Result<PeakFlops> CpuPeakFlops() {
  DT_ASSIGN_OR_RETURN(const std::optional<double> given, CpuPeakFlopsGiven());
  if (!given) return MeasureSgemmPeak();
  return PeakFlops{*given, "DIFFTRAIN_CPU_PEAK_GFLOPS"};
}

}  // namespace difftrain
