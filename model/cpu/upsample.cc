#include "model/cpu/upsample.h"

#include <cstddef>

namespace difftrain::cpu {

template <typename T>
void Upsample2xForward(T* out, const T* in, int P, int H, int W) {
  const int W2 = 2 * W;
#pragma omp parallel for collapse(2) schedule(static)
  for (int p = 0; p < P; ++p) {
    for (int i = 0; i < H; ++i) {
      const T* src = in + (static_cast<size_t>(p) * H + i) * W;
      T* top = out + (static_cast<size_t>(p) * 2 * H + 2 * i) * W2;
      T* bottom = top + W2;
      for (int j = 0; j < W; ++j) {
        top[2 * j] = top[2 * j + 1] = bottom[2 * j] = bottom[2 * j + 1] = src[j];
      }
    }
  }
}

template <typename T>
void Upsample2xBackward(T* din, const T* dout, int P, int H, int W) {
  const int W2 = 2 * W;
#pragma omp parallel for collapse(2) schedule(static)
  for (int p = 0; p < P; ++p) {
    for (int i = 0; i < H; ++i) {
      T* dst = din + (static_cast<size_t>(p) * H + i) * W;
      const T* top = dout + (static_cast<size_t>(p) * 2 * H + 2 * i) * W2;
      const T* bottom = top + W2;
      for (int j = 0; j < W; ++j)
        dst[j] += top[2 * j] + top[2 * j + 1] + bottom[2 * j] + bottom[2 * j + 1];
    }
  }
}

template void Upsample2xForward<float>(float*, const float*, int, int, int);
template void Upsample2xForward<double>(double*, const double*, int, int, int);
template void Upsample2xBackward<float>(float*, const float*, int, int, int);
template void Upsample2xBackward<double>(double*, const double*, int, int, int);

}  // namespace difftrain::cpu
