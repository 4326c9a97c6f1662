// What the tests of kernels run on the CPU emulator share (host code only): the relative L2
// error of a result against a reference in double, infinite where the result holds a NaN or an
// infinity (an element a kernel never wrote, its output having started as NaN).
#pragma once

#include <cmath>
#include <vector>

namespace difftrain::simt {

inline double RelativeL2(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace difftrain::simt
