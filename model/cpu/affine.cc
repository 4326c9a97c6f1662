#include "model/cpu/affine.h"

#include <algorithm>
#include <cstddef>

namespace difftrain::cpu {

template <typename T>
void ChannelAffineForward(T* out, const T* in, const T* weight, const T* bias, int outer, int C,
                          int inner) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int o = 0; o < outer; ++o) {
    for (int c = 0; c < C; ++c) {
      const size_t base = (static_cast<size_t>(o) * C + c) * inner;
      for (int i = 0; i < inner; ++i)
        out[base + i] = in[base + i] * weight[c] + bias[c];
    }
  }
}

// inner 1 (a LayerNorm's affine over rows of C): each thread takes a block of channels and
// walks the rows, so the reads are contiguous; each channel still sums its terms in row order.
template <typename T>
void RowAffineBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                       int rows, int C) {
  constexpr int kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    const int width = std::min(kBlock, C - c0);
    double sum_w[kBlock] = {}, sum_b[kBlock] = {};
    for (int r = 0; r < rows; ++r) {
      const size_t base = static_cast<size_t>(r) * C + c0;
#pragma omp simd
      for (int c = 0; c < width; ++c) {
        sum_w[c] += static_cast<double>(dout[base + c]) * in[base + c];
        sum_b[c] += dout[base + c];
        din[base + c] += dout[base + c] * weight[c0 + c];
      }
    }
    for (int c = 0; c < width; ++c) {
      dweight[c0 + c] += static_cast<T>(sum_w[c]);
      dbias[c0 + c] += static_cast<T>(sum_b[c]);
    }
  }
}

template <typename T>
void ChannelAffineBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in,
                           const T* weight, int outer, int C, int inner) {
  if (inner == 1) return RowAffineBackward(din, dweight, dbias, dout, in, weight, outer, C);
  // Each thread owns whole channels, so the parameter sums need no reduction across threads.
  // They run in double: a channel sums outer·inner terms of both signs (B·H·W in a GroupNorm),
  // and in float their rounding alone exceeded 1e-5 of the UNet's small norm gradients.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    double sum_w = 0, sum_b = 0;
    for (int o = 0; o < outer; ++o) {
      const size_t base = (static_cast<size_t>(o) * C + c) * inner;
      for (int i = 0; i < inner; ++i) {
        sum_w += static_cast<double>(dout[base + i]) * in[base + i];
        sum_b += dout[base + i];
        din[base + i] += dout[base + i] * weight[c];
      }
    }
    dweight[c] += static_cast<T>(sum_w);
    dbias[c] += static_cast<T>(sum_b);
  }
}

template void ChannelAffineForward<float>(float*, const float*, const float*, const float*, int,
                                          int, int);
template void ChannelAffineForward<double>(double*, const double*, const double*, const double*,
                                           int, int, int);
template void ChannelAffineBackward<float>(float*, float*, float*, const float*, const float*,
                                           const float*, int, int, int);
template void ChannelAffineBackward<double>(double*, double*, double*, const double*, const double*,
                                            const double*, int, int, int);

}  // namespace difftrain::cpu
