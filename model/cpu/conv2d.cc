#include "model/cpu/conv2d.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "model/cpu/gemm.h"

namespace difftrain::cpu {
namespace {

// The im2col matrix of a group of samples is [C·K·K, n·Ho·Wo]: one GEMM per group instead of
// one per sample, so OpenBLAS gets columns enough to use every thread (a UNet's small-channel
// convolutions at 32×32 are [16, 144] × [144, 1024] per sample, too small to split) and the
// OpenMP regions around it are entered once per group. A group holds as many samples as keep
// its scratch under this many floats, and at least one.
constexpr size_t kGroupFloats = size_t{8} << 20;

int GroupSize(const Conv2dShape& s) {
  const size_t per_sample = size_t(std::max(s.C * s.K * s.K, s.Co)) * s.Ho() * s.Wo();
  return static_cast<int>(std::clamp<size_t>(kGroupFloats / per_sample, 1, s.B));
}

// The output columns j of one output row that read input column x = j·S + kj − P inside
// [0, W): j in [first, end).
struct ColumnRange {
  int first, end;
};
ColumnRange ValidColumns(const Conv2dShape& s, int kj) {
  const int Wo = s.Wo();
  // x ≥ 0 ⇔ j ≥ ceil((P − kj) / S);  x < W ⇔ j ≤ floor((W − 1 + P − kj) / S).
  const int lo = s.P - kj, hi = s.W - 1 + s.P - kj;
  const int first = lo <= 0 ? 0 : (lo + s.S - 1) / s.S;
  const int end = hi < 0 ? 0 : hi / s.S + 1;
  const int f = std::min(first, Wo);
  return {f, std::clamp(end, f, Wo)};
}

// col[(c·K + ki)·K + kj, b·Ho·Wo + i·Wo + j] = in[b, c, i·S + ki − P, j·S + kj − P] (0 outside)
// for the n samples at `in`. Threads split (sample, channel) pairs.
template <typename T>
void Im2Col(T* col, const T* in, int n, const Conv2dShape& s) {
  const int Ho = s.Ho(), Wo = s.Wo(), KK = s.K * s.K;
  const size_t HWo = size_t(Ho) * Wo, row_stride = n * HWo;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < n; ++b) {
    for (int c = 0; c < s.C; ++c) {
      const T* plane = in + (size_t(b) * s.C + c) * s.H * s.W;
      for (int k = 0; k < KK; ++k) {
        const int ki = k / s.K, kj = k % s.K;
        const ColumnRange valid = ValidColumns(s, kj);
        T* dst = col + (size_t(c) * KK + k) * row_stride + b * HWo;
        for (int i = 0; i < Ho; ++i) {
          T* row = dst + size_t(i) * Wo;
          const int y = i * s.S + ki - s.P;
          if (y < 0 || y >= s.H) {
            std::fill(row, row + Wo, T(0));
            continue;
          }
          std::fill(row, row + valid.first, T(0));
          const T* src = plane + size_t(y) * s.W + valid.first * s.S + kj - s.P;
          if (s.S == 1) {
            std::memcpy(row + valid.first, src, sizeof(T) * (valid.end - valid.first));
          } else {
            for (int j = valid.first; j < valid.end; ++j)
              row[j] = src[(j - valid.first) * s.S];
          }
          std::fill(row + valid.end, row + Wo, T(0));
        }
      }
    }
  }
}

// The adjoint of Im2Col: din[b, c, y, x] += every col entry that read it. The rows of one
// (sample, channel) pair touch only its plane, so threads split the pairs.
template <typename T>
void Col2Im(T* din, const T* col, int n, const Conv2dShape& s) {
  const int Ho = s.Ho(), Wo = s.Wo(), KK = s.K * s.K;
  const size_t HWo = size_t(Ho) * Wo, row_stride = n * HWo;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < n; ++b) {
    for (int c = 0; c < s.C; ++c) {
      T* plane = din + (size_t(b) * s.C + c) * s.H * s.W;
      for (int k = 0; k < KK; ++k) {
        const int ki = k / s.K, kj = k % s.K;
        const ColumnRange valid = ValidColumns(s, kj);
        const T* src = col + (size_t(c) * KK + k) * row_stride + b * HWo;
        for (int i = 0; i < Ho; ++i) {
          const int y = i * s.S + ki - s.P;
          if (y < 0 || y >= s.H) continue;
          const T* row = src + size_t(i) * Wo;
          T* dst = plane + size_t(y) * s.W + valid.first * s.S + kj - s.P;
          for (int j = valid.first; j < valid.end; ++j)
            dst[(j - valid.first) * s.S] += row[j];
        }
      }
    }
  }
}

// [n, Co, HWo] ↔ [Co, n·HWo]: the GEMM's output layout and the tensors'.
template <typename T>
void FromChannelMajor(T* out, const T* y, const T* bias, int n, int Co, size_t HWo) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < n; ++b) {
    for (int o = 0; o < Co; ++o) {
      const T* src = y + size_t(o) * n * HWo + b * HWo;
      T* dst = out + (size_t(b) * Co + o) * HWo;
      const T add = bias != nullptr ? bias[o] : T(0);
      for (size_t k = 0; k < HWo; ++k)
        dst[k] = src[k] + add;
    }
  }
}
template <typename T>
void ToChannelMajor(T* y, const T* in, int n, int Co, size_t HWo) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < n; ++b) {
    for (int o = 0; o < Co; ++o)
      std::memcpy(y + size_t(o) * n * HWo + b * HWo, in + (size_t(b) * Co + o) * HWo,
                  sizeof(T) * HWo);
  }
}

// Scratch reused by every call on this thread: the im2col matrix and the output in
// channel-major order.
template <typename T>
struct Scratch {
  std::vector<T> col, y;
};
template <typename T>
Scratch<T>& ThreadScratch(size_t col, size_t y) {
  thread_local Scratch<T> scratch;
  if (scratch.col.size() < col) scratch.col.resize(col);
  if (scratch.y.size() < y) scratch.y.resize(y);
  return scratch;
}

}  // namespace

template <typename T>
void Conv2dForward(T* out, const T* in, const T* weight, const T* bias, const Conv2dShape& s) {
  const int KK = s.C * s.K * s.K, group = GroupSize(s);
  const size_t HWo = size_t(s.Ho()) * s.Wo(), in_sample = size_t(s.C) * s.H * s.W;
  Scratch<T>& scratch = ThreadScratch<T>(KK * HWo * group, s.Co * HWo * group);
  for (int b0 = 0; b0 < s.B; b0 += group) {
    const int n = std::min(group, s.B - b0);
    const int N = static_cast<int>(n * HWo);
    Im2Col(scratch.col.data(), in + b0 * in_sample, n, s);
    Gemm(false, false, s.Co, N, KK, T(1), weight, KK, scratch.col.data(), N, T(0),
         scratch.y.data(), N);
    FromChannelMajor(out + b0 * s.Co * HWo, scratch.y.data(), bias, n, s.Co, HWo);
  }
}

template <typename T>
void Conv2dBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                    const Conv2dShape& s) {
  const int KK = s.C * s.K * s.K, group = GroupSize(s);
  const size_t HWo = size_t(s.Ho()) * s.Wo(), in_sample = size_t(s.C) * s.H * s.W;
  Scratch<T>& scratch = ThreadScratch<T>(KK * HWo * group, s.Co * HWo * group);
  T* col = scratch.col.data();
  T* dy = scratch.y.data();
  for (int b0 = 0; b0 < s.B; b0 += group) {
    const int n = std::min(group, s.B - b0);
    const int N = static_cast<int>(n * HWo);
    ToChannelMajor(dy, dout + b0 * s.Co * HWo, n, s.Co, HWo);
    if (dbias != nullptr) {
      // In double, as ChannelAffineBackward's sums (model/cpu/affine.cc).
#pragma omp parallel for schedule(static)
      for (int o = 0; o < s.Co; ++o) {
        double sum = 0;
        for (int k = 0; k < N; ++k)
          sum += dy[size_t(o) * N + k];
        dbias[o] += static_cast<T>(sum);
      }
    }
    if (dweight != nullptr) {
      Im2Col(col, in + b0 * in_sample, n, s);
      Gemm(false, true, s.Co, KK, N, T(1), dy, N, col, N, T(1), dweight, KK);
    }
    if (din != nullptr) {
      // The column gradient overwrites the im2col matrix, which dweight no longer needs.
      Gemm(true, false, KK, N, s.Co, T(1), weight, KK, dy, N, T(0), col, N);
      Col2Im(din + b0 * in_sample, col, n, s);
    }
  }
}

template void Conv2dForward<float>(float*, const float*, const float*, const float*,
                                   const Conv2dShape&);
template void Conv2dForward<double>(double*, const double*, const double*, const double*,
                                    const Conv2dShape&);
template void Conv2dBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, const Conv2dShape&);
template void Conv2dBackward<double>(double*, double*, double*, const double*, const double*,
                                     const double*, const Conv2dShape&);

}  // namespace difftrain::cpu
