#include "model/cpu/linear.h"

#include "model/cpu/gemm.h"

namespace difftrain::cpu {

template <typename T>
void LinearForward(T* out, const T* in, const T* weight, const T* bias, int N, int I, int O) {
  // Seed every row with the bias, then accumulate the product on top (beta = 1).
  T beta = 0;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      for (int o = 0; o < O; ++o)
        out[static_cast<size_t>(n) * O + o] = bias[o];
    }
    beta = 1;
  }
  Gemm(false, true, N, O, I, T(1), in, I, weight, I, beta, out, O);
}

template <typename T>
void LinearBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                    int N, int I, int O) {
  if (din != nullptr) Gemm(false, false, N, I, O, T(1), dout, O, weight, I, T(1), din, I);
  if (dweight != nullptr) Gemm(true, false, O, I, N, T(1), dout, O, in, I, T(1), dweight, I);
  if (dbias != nullptr) {
    // Column blocks per thread, rows read in order: contiguous loads that vectorise.
    constexpr int kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < O; o0 += kBlock) {
      const int width = O - o0 < kBlock ? O - o0 : kBlock;
      T sum[kBlock] = {};
      for (int n = 0; n < N; ++n) {
        const T* row = dout + static_cast<size_t>(n) * O + o0;
        for (int j = 0; j < width; ++j)
          sum[j] += row[j];
      }
      for (int j = 0; j < width; ++j)
        dbias[o0 + j] += sum[j];
    }
  }
}

template void LinearForward<float>(float*, const float*, const float*, const float*, int, int, int);
template void LinearForward<double>(double*, const double*, const double*, const double*, int, int,
                                    int);
template void LinearBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int);
template void LinearBackward<double>(double*, double*, double*, const double*, const double*,
                                     const double*, int, int, int);

}  // namespace difftrain::cpu
