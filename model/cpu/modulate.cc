#include "model/cpu/modulate.h"

#include <cstddef>

namespace difftrain::cpu {
namespace {
// The per-sample reductions over tokens run over (sample, block of D) pairs, so there is
// parallel work even for a micro-batch of one.
constexpr int kBlock = 64;
}  // namespace

template <typename T>
void ModulateForward(T* out, const T* x, const T* shift, const T* scale, int stride, int B, int T_,
                     int D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T_; ++t) {
      const size_t row = (static_cast<size_t>(b) * T_ + t) * D;
      const T* sh = shift + static_cast<size_t>(b) * stride;
      const T* sc = scale + static_cast<size_t>(b) * stride;
      for (int d = 0; d < D; ++d)
        out[row + d] = x[row + d] * (T(1) + sc[d]) + sh[d];
    }
  }
}

template <typename T>
void ModulateBackward(T* dx, T* dshift, T* dscale, const T* dout, const T* x, const T* scale,
                      int stride, int B, int T_, int D) {
  const int blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < blocks; ++k) {
      const int d0 = k * kBlock, width = D - d0 < kBlock ? D - d0 : kBlock;
      const T* sc = scale + static_cast<size_t>(b) * stride + d0;
      T sum_shift[kBlock] = {}, sum_scale[kBlock] = {};
      for (int t = 0; t < T_; ++t) {
        const size_t row = (static_cast<size_t>(b) * T_ + t) * D + d0;
        for (int j = 0; j < width; ++j) {
          const T g = dout[row + j];
          dx[row + j] += g * (T(1) + sc[j]);
          sum_shift[j] += g;
          sum_scale[j] += g * x[row + j];
        }
      }
      for (int j = 0; j < width; ++j) {
        dshift[static_cast<size_t>(b) * stride + d0 + j] += sum_shift[j];
        dscale[static_cast<size_t>(b) * stride + d0 + j] += sum_scale[j];
      }
    }
  }
}

template <typename T>
void GatedResidualForward(T* out, const T* x, const T* y, const T* gate, int stride, int B, int T_,
                          int D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T_; ++t) {
      const size_t row = (static_cast<size_t>(b) * T_ + t) * D;
      const T* g = gate + static_cast<size_t>(b) * stride;
      for (int d = 0; d < D; ++d)
        out[row + d] = x[row + d] + g[d] * y[row + d];
    }
  }
}

template <typename T>
void GatedResidualBackward(T* dx, T* dy, T* dgate, const T* dout, const T* y, const T* gate,
                           int stride, int B, int T_, int D) {
  const int blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < blocks; ++k) {
      const int d0 = k * kBlock, width = D - d0 < kBlock ? D - d0 : kBlock;
      const T* g = gate + static_cast<size_t>(b) * stride + d0;
      T sum_gate[kBlock] = {};
      for (int t = 0; t < T_; ++t) {
        const size_t row = (static_cast<size_t>(b) * T_ + t) * D + d0;
        for (int j = 0; j < width; ++j) {
          const T go = dout[row + j];
          if (dx != nullptr) dx[row + j] += go;
          dy[row + j] += go * g[j];
          sum_gate[j] += go * y[row + j];
        }
      }
      for (int j = 0; j < width; ++j)
        dgate[static_cast<size_t>(b) * stride + d0 + j] += sum_gate[j];
    }
  }
}

#define DIFFTRAIN_INSTANTIATE(T)                                                                   \
  template void ModulateForward<T>(T*, const T*, const T*, const T*, int, int, int, int);          \
  template void ModulateBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, int); \
  template void GatedResidualForward<T>(T*, const T*, const T*, const T*, int, int, int, int);     \
  template void GatedResidualBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,  \
                                         int);
DIFFTRAIN_INSTANTIATE(float)
DIFFTRAIN_INSTANTIATE(double)
#undef DIFFTRAIN_INSTANTIATE

}  // namespace difftrain::cpu
