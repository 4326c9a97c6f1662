// The FLOP rate a rank's MFU is measured against (docs/metrics.md): the dense BF16 peak of its GPU
// from a table, or on a CPU the rate OpenBLAS sgemm reaches on the rank's threads, measured once
// when the rank starts.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace difftrain {

struct PeakFlops {
  double flops_per_second = 0;
  std::string source;  // how it was obtained, for the log: "table: H100", "sgemm
                       // 1024^3 …"
};

// Dense BF16 FLOP/s of a GPU by its CUDA device name ("NVIDIA H100 80GB HBM3"): H100 and H200 989
// T, H20 148 T, A100 312 T; 0 for a GPU not in the table.
double GpuPeakFlops(std::string_view device_name);

// The median FLOP/s of `repeats` n×n×n OpenBLAS sgemm calls (after a warm-up) on this thread's
// OpenMP threads. n = 1024 takes a few tens of milliseconds per call on a core.
PeakFlops MeasureSgemmPeak(int n = 1024, int repeats = 3);

// The CPU peak the environment gives, DIFFTRAIN_CPU_PEAK_GFLOPS, in FLOP/s (a positive number of
// GFLOP/s: the same figure every run, and no ~0.2 s of sgemm a rank, which ranks sharing a
// node's cores also slow each other down in); none where it is unset or empty; an error naming
// the variable where it is not a positive number.
Result<std::optional<double>> CpuPeakFlopsGiven();

// A CPU rank's peak: CpuPeakFlopsGiven(), else MeasureSgemmPeak().
Result<PeakFlops> CpuPeakFlops();

}  // namespace difftrain
