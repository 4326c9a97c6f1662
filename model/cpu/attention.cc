#include "model/cpu/attention.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "common/check.h"
#include "model/cpu/gemm.h"

namespace difftrain::cpu {
namespace {

template <typename T>
void SoftmaxRows(T* x, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    T* row = x + static_cast<size_t>(r) * cols;
    T max = row[0];
    for (int c = 1; c < cols; ++c)
      max = row[c] > max ? row[c] : max;
    T sum = 0;
    for (int c = 0; c < cols; ++c) {
      row[c] = std::exp(row[c] - max);
      sum += row[c];
    }
    const T inv = T(1) / sum;
    for (int c = 0; c < cols; ++c)
      row[c] *= inv;
  }
}

}  // namespace

// Each (sample, head) pair is independent: one OpenMP task each, with single-threaded GEMMs
// inside (OpenBLAS does not spawn threads inside a parallel region).
template <typename T>
void AttentionForward(T* out, T* probs, const T* qkv, int B, int T_, int D, int H) {
  DT_CHECK(D % H == 0, "hidden size {} is not divisible by {} heads", D, H);
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const T* q = qkv + static_cast<size_t>(b) * T_ * 3 * D + h * hd;
      const T* k = q + D;
      const T* v = q + 2 * D;
      T* p = probs + (static_cast<size_t>(b) * H + h) * T_ * T_;
      Gemm(false, true, T_, T_, hd, scale, q, 3 * D, k, 3 * D, T(0), p, T_);
      SoftmaxRows(p, T_, T_);
      Gemm(false, false, T_, hd, T_, T(1), p, T_, v, 3 * D, T(0),
           out + static_cast<size_t>(b) * T_ * D + h * hd, D);
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* probs, int B, int T_, int D,
                       int H) {
  DT_CHECK(D % H == 0, "hidden size {} is not divisible by {} heads", D, H);
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel
  {
    std::vector<T> dp(static_cast<size_t>(T_) * T_);  // one [T, T] scratch per thread
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const size_t base = static_cast<size_t>(b) * T_ * 3 * D + h * hd;
        const T* q = qkv + base;
        const T* k = q + D;
        const T* v = q + 2 * D;
        T* dq = dqkv + base;
        T* dk = dq + D;
        T* dv = dq + 2 * D;
        const T* p = probs + (static_cast<size_t>(b) * H + h) * T_ * T_;
        const T* dO = dout + static_cast<size_t>(b) * T_ * D + h * hd;
        // dV = Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ⊙ (dP − rowsum(dP ⊙ P));  dQ = s·dS·K;  dK = s·dSᵀ·Q
        Gemm(true, false, T_, hd, T_, T(1), p, T_, dO, D, T(1), dv, 3 * D);
        Gemm(false, true, T_, T_, hd, T(1), dO, D, v, 3 * D, T(0), dp.data(), T_);
        for (int i = 0; i < T_; ++i) {
          T* dpi = dp.data() + static_cast<size_t>(i) * T_;
          const T* pi = p + static_cast<size_t>(i) * T_;
          T dot = 0;
          for (int j = 0; j < T_; ++j)
            dot += dpi[j] * pi[j];
          for (int j = 0; j < T_; ++j)
            dpi[j] = pi[j] * (dpi[j] - dot);
        }
        Gemm(false, false, T_, hd, T_, scale, dp.data(), T_, k, 3 * D, T(1), dq, 3 * D);
        Gemm(true, false, T_, hd, T_, scale, dp.data(), T_, q, 3 * D, T(1), dk, 3 * D);
      }
    }
  }
}

template void AttentionForward<float>(float*, float*, const float*, int, int, int, int);
template void AttentionForward<double>(double*, double*, const double*, int, int, int, int);
template void AttentionBackward<float>(float*, const float*, const float*, const float*, int, int,
                                       int, int);
template void AttentionBackward<double>(double*, const double*, const double*, const double*, int,
                                        int, int, int);

}  // namespace difftrain::cpu
