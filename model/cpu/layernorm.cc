#include "model/cpu/layernorm.h"

#include <cmath>
#include <cstddef>

namespace difftrain::cpu {

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* in, int N, int C, T eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = in + static_cast<size_t>(n) * C;
    T* y = out + static_cast<size_t>(n) * C;
    // Two passes (mean, then centred variance) are as exact as PyTorch's, unlike E[x²]−E[x]².
    T sum = 0;
    for (int c = 0; c < C; ++c)
      sum += x[c];
    const T m = sum / C;
    T var = 0;
    for (int c = 0; c < C; ++c)
      var += (x[c] - m) * (x[c] - m);
    const T s = T(1) / std::sqrt(var / C + eps);
    for (int c = 0; c < C; ++c)
      y[c] = (x[c] - m) * s;
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void LayerNormBackward(T* din, const T* dout, const T* in, const T* mean, const T* rstd, int N,
                       int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = in + static_cast<size_t>(n) * C;
    const T* dy = dout + static_cast<size_t>(n) * C;
    T* dx = din + static_cast<size_t>(n) * C;
    const T m = mean[n], s = rstd[n];
    // din = rstd · (dy − mean(dy) − x̂ · mean(dy · x̂))
    T sum_dy = 0, sum_dy_xhat = 0;
    for (int c = 0; c < C; ++c) {
      sum_dy += dy[c];
      sum_dy_xhat += dy[c] * (x[c] - m) * s;
    }
    const T mean_dy = sum_dy / C, mean_dy_xhat = sum_dy_xhat / C;
    for (int c = 0; c < C; ++c)
      dx[c] += s * (dy[c] - mean_dy - (x[c] - m) * s * mean_dy_xhat);
  }
}

template void LayerNormForward<float>(float*, float*, float*, const float*, int, int, float);
template void LayerNormForward<double>(double*, double*, double*, const double*, int, int, double);
template void LayerNormBackward<float>(float*, const float*, const float*, const float*,
                                       const float*, int, int);
template void LayerNormBackward<double>(double*, const double*, const double*, const double*,
                                        const double*, int, int);

}  // namespace difftrain::cpu
