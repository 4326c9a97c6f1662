// The median of a benchmark's repeated measurements (the upper one of an even count), shared
// by the CPU and GPU bench programs.
#pragma once

#include <algorithm>
#include <vector>

namespace difftrain::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace difftrain::bench
