#include "model/cpu/affine.h"

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

template <typename T>
void ChannelAffineBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in,
                           const T* weight, int outer, int C, int inner) {
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
