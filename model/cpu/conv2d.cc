#include "model/cpu/conv2d.h"

#include <cstddef>
#include <vector>

#include "model/cpu/gemm.h"

namespace difftrain::cpu {
namespace {

bool IsPointwise(const Conv2dShape& s) {
  return s.K == 1 && s.S == 1 && s.P == 0;
}

// col[(c·K + ki)·K + kj, i·Wo + j] = in[c, i·S + ki − P, j·S + kj − P] (0 outside), one sample.
template <typename T>
void Im2Col(T* col, const T* in, const Conv2dShape& s) {
  const int Ho = s.Ho(), Wo = s.Wo(), rows = s.C * s.K * s.K;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const int c = r / (s.K * s.K), ki = r / s.K % s.K, kj = r % s.K;
    const T* plane = in + static_cast<size_t>(c) * s.H * s.W;
    T* dst = col + static_cast<size_t>(r) * Ho * Wo;
    for (int i = 0; i < Ho; ++i) {
      const int y = i * s.S + ki - s.P;
      for (int j = 0; j < Wo; ++j) {
        const int x = j * s.S + kj - s.P;
        dst[i * Wo + j] = (y >= 0 && y < s.H && x >= 0 && x < s.W) ? plane[y * s.W + x] : T(0);
      }
    }
  }
}

// The adjoint of Im2Col: din[c, y, x] += every col entry that read it. Rows of one channel
// touch the same plane, so threads split the channels.
template <typename T>
void Col2Im(T* din, const T* col, const Conv2dShape& s) {
  const int Ho = s.Ho(), Wo = s.Wo();
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s.C; ++c) {
    T* plane = din + static_cast<size_t>(c) * s.H * s.W;
    for (int k = 0; k < s.K * s.K; ++k) {
      const int ki = k / s.K, kj = k % s.K;
      const T* src = col + (static_cast<size_t>(c) * s.K * s.K + k) * Ho * Wo;
      for (int i = 0; i < Ho; ++i) {
        const int y = i * s.S + ki - s.P;
        if (y < 0 || y >= s.H) continue;
        for (int j = 0; j < Wo; ++j) {
          const int x = j * s.S + kj - s.P;
          if (x >= 0 && x < s.W) plane[y * s.W + x] += src[i * Wo + j];
        }
      }
    }
  }
}

// One im2col matrix, reused by every call on this thread.
template <typename T>
T* ColumnScratch(size_t n) {
  thread_local std::vector<T> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

}  // namespace

template <typename T>
void Conv2dForward(T* out, const T* in, const T* weight, const T* bias, const Conv2dShape& s) {
  const int HWo = s.Ho() * s.Wo(), KK = s.C * s.K * s.K;
  const size_t in_sample = static_cast<size_t>(s.C) * s.H * s.W;
  T* col = IsPointwise(s) ? nullptr : ColumnScratch<T>(static_cast<size_t>(KK) * HWo);
  for (int b = 0; b < s.B; ++b) {
    const T* x = in + b * in_sample;
    T* y = out + static_cast<size_t>(b) * s.Co * HWo;
    if (col != nullptr) Im2Col(col, x, s);
    T beta = 0;
    if (bias != nullptr) {
      for (int o = 0; o < s.Co; ++o) {
        for (int k = 0; k < HWo; ++k)
          y[static_cast<size_t>(o) * HWo + k] = bias[o];
      }
      beta = 1;
    }
    Gemm(false, false, s.Co, HWo, KK, T(1), weight, KK, col ? col : x, HWo, beta, y, HWo);
  }
}

template <typename T>
void Conv2dBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                    const Conv2dShape& s) {
  const int HWo = s.Ho() * s.Wo(), KK = s.C * s.K * s.K;
  const size_t in_sample = static_cast<size_t>(s.C) * s.H * s.W;
  const bool pointwise = IsPointwise(s);
  T* col = pointwise ? nullptr : ColumnScratch<T>(static_cast<size_t>(KK) * HWo);
  for (int b = 0; b < s.B; ++b) {
    const T* x = in + b * in_sample;
    const T* dy = dout + static_cast<size_t>(b) * s.Co * HWo;
    if (dweight != nullptr) {
      if (!pointwise) Im2Col(col, x, s);
      Gemm(false, true, s.Co, KK, HWo, T(1), dy, HWo, pointwise ? x : col, HWo, T(1), dweight, KK);
    }
    if (dbias != nullptr) {
      // In double, as ChannelAffineBackward's sums (model/cpu/affine.cc).
      for (int o = 0; o < s.Co; ++o) {
        double sum = 0;
        for (int k = 0; k < HWo; ++k)
          sum += dy[static_cast<size_t>(o) * HWo + k];
        dbias[o] += static_cast<T>(sum);
      }
    }
    if (din != nullptr) {
      T* dx = din + b * in_sample;
      if (pointwise) {
        Gemm(true, false, KK, HWo, s.Co, T(1), weight, KK, dy, HWo, T(1), dx, HWo);
      } else {
        Gemm(true, false, KK, HWo, s.Co, T(1), weight, KK, dy, HWo, T(0), col, HWo);
        Col2Im(dx, col, s);
      }
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
