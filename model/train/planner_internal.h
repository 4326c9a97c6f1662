// Pieces of the layout planner (model/train/planner.h) that its families' cost models share:
// model/train/planner.cc (DiT and Latte) and model/train/planner_unet.cc (the UNet).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/train/planner.h"

namespace difftrain::planner {

inline constexpr double kFloat = 4;  // bytes of every element: the arenas are fp32

// Whether a group of `size` ranks, `stride` apart in the rank order, lies inside one node
// (node i holds ranks [i·G, (i+1)·G)).
inline bool InsideNode(int stride, int size, int devices_per_node) {
  return size == 1 || devices_per_node % (stride * size) == 0;
}

// Ring collectives: the bytes each member sends for a buffer of `bytes`.
inline double AllReduceBytes(double bytes, int g) {
  return 2.0 * (g - 1) / g * bytes;
}
inline double AllGatherBytes(double bytes, int g) {
  return static_cast<double>(g - 1) / g * bytes;
}

// The fraction of the device's peak that GEMMs of `rows` full-width rows reach.
inline double Efficiency(const DeviceSpec& d, double rows) {
  return d.efficiency * rows / (rows + d.half_efficiency_rows);
}

// The divisors of n, ascending: those up to √n and their cofactors (n reaches 2^31 − 1, the
// tokens or the global batch of a job file).
inline std::vector<int> Divisors(int n) {
  std::vector<int> small, large;
  for (int i = 1; int64_t{i} * i <= n; ++i) {
    if (n % i != 0) continue;
    small.push_back(i);
    if (i != n / i) large.push_back(n / i);
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

// The candidates of one dimension: the fixed value, or every value from `all`.
inline std::vector<int> Choices(const std::optional<int>& fixed, const std::vector<int>& all) {
  return fixed ? std::vector<int>{*fixed} : all;
}

// Checks what every request needs whatever its model: the cluster, the batch, the device.
Status CheckCommonRequest(const PlanRequest& r);

// The UNet's layouts (data-parallel only: tp, cp and pp fixed above 1 are refused), with
// their memory and time (model/train/planner_unet.cc).
Result<std::vector<PlannedLayout>> EnumerateUNetLayouts(const PlanRequest& r);
MemoryEstimate PredictUNetMemory(const ModelSpec& model, const Layout& layout);

// A data-parallel rank's memory as the family's GPU step allocates it at micro-batch
// `micro_batch` (ModelFamily::GpuStepBytes; fp8: train.precision fp8), for `trainable`
// parameters; none where the build has no GPU step for the family.
std::optional<MemoryEstimate> GpuStepMemory(const ModelSpec& model, int micro_batch,
                                            double trainable, bool fp8);

}  // namespace difftrain::planner
