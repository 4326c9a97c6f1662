#include "model/cpu/attention.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "common/check.h"
#include "model/cpu/gemm.h"
#include "model/cpu/vec_math.h"

namespace difftrain::cpu {
namespace {

template <typename T>
void SoftmaxRows(T* x, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    T* row = x + static_cast<size_t>(r) * cols;
    T max = row[0];
#pragma omp simd reduction(max : max)
    for (int c = 1; c < cols; ++c)
      max = row[c] > max ? row[c] : max;
    // The sum in an order of our own, the same whatever vector width and unrolling the
    // compiler picks (an `omp simd reduction` leaves the order, and so the last bits, to the
    // compiler, its flags and the CPU -march=native targets): lane l adds columns l,
    // l + kLanes, ..., and the lanes are added pairwise.
    constexpr int kLanes = 16;
    T lanes[kLanes] = {};
    int c = 0;
    for (; c + kLanes <= cols; c += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        row[c + l] = VecExp(row[c + l] - max);
        lanes[l] += row[c + l];
      }
    }
    for (int l = 0; c < cols; ++c, ++l) {
      row[c] = VecExp(row[c] - max);
      lanes[l] += row[c];
    }
    for (int width = kLanes / 2; width > 0; width /= 2)
      for (int l = 0; l < width; ++l)
        lanes[l] += lanes[l + width];
    const T inv = T(1) / lanes[0];
    for (int c = 0; c < cols; ++c)
      row[c] *= inv;
  }
}

}  // namespace

// Each (sample, head) pair is independent: one OpenMP task each, with single-threaded GEMMs
// inside (OpenBLAS does not spawn threads inside a parallel region).
template <typename T>
void AttentionForward(T* out, T* probs, const T* q_buf, int ldq, const T* k_buf, const T* v_buf,
                      int ldkv, int B, int Tq, int Tk, int D, int H) {
  DT_CHECK(D % H == 0, "hidden size {} is not divisible by {} heads", D, H);
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const T* q = q_buf + static_cast<size_t>(b) * Tq * ldq + h * hd;
      const size_t kv_base = static_cast<size_t>(b) * Tk * ldkv + h * hd;
      const T* k = k_buf + kv_base;
      const T* v = v_buf + kv_base;
      T* p = probs + (static_cast<size_t>(b) * H + h) * Tq * Tk;
      Gemm(false, true, Tq, Tk, hd, scale, q, ldq, k, ldkv, T(0), p, Tk);
      SoftmaxRows(p, Tq, Tk);
      Gemm(false, false, Tq, hd, Tk, T(1), p, Tk, v, ldkv, T(0),
           out + static_cast<size_t>(b) * Tq * D + h * hd, D);
    }
  }
}

template <typename T>
void AttentionBackward(T* dq_buf, T* dk_buf, T* dv_buf, const T* dout, const T* q_buf, int ldq,
                       const T* k_buf, const T* v_buf, int ldkv, const T* probs, int B, int Tq,
                       int Tk, int D, int H) {
  DT_CHECK(D % H == 0, "hidden size {} is not divisible by {} heads", D, H);
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel
  {
    std::vector<T> dp(static_cast<size_t>(Tq) * Tk);  // one [Tq, Tk] scratch per thread
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const size_t q_base = static_cast<size_t>(b) * Tq * ldq + h * hd;
        const size_t kv_base = static_cast<size_t>(b) * Tk * ldkv + h * hd;
        const T* q = q_buf + q_base;
        const T* k = k_buf + kv_base;
        const T* v = v_buf + kv_base;
        T* dq = dq_buf + q_base;
        T* dk = dk_buf + kv_base;
        T* dv = dv_buf + kv_base;
        const T* p = probs + (static_cast<size_t>(b) * H + h) * Tq * Tk;
        const T* dO = dout + static_cast<size_t>(b) * Tq * D + h * hd;
        // dV = Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ⊙ (dP − rowsum(dP ⊙ P));  dQ = s·dS·K;  dK = s·dSᵀ·Q
        Gemm(true, false, Tk, hd, Tq, T(1), p, Tk, dO, D, T(1), dv, ldkv);
        Gemm(false, true, Tq, Tk, hd, T(1), dO, D, v, ldkv, T(0), dp.data(), Tk);
        for (int i = 0; i < Tq; ++i) {
          T* dpi = dp.data() + static_cast<size_t>(i) * Tk;
          const T* pi = p + static_cast<size_t>(i) * Tk;
          T dot = 0;
          for (int j = 0; j < Tk; ++j)
            dot += dpi[j] * pi[j];
          for (int j = 0; j < Tk; ++j)
            dpi[j] = pi[j] * (dpi[j] - dot);
        }
        Gemm(false, false, Tq, hd, Tk, scale, dp.data(), Tk, k, ldkv, T(1), dq, ldq);
        Gemm(true, false, Tk, hd, Tq, scale, dp.data(), Tk, q, ldq, T(1), dk, ldkv);
      }
    }
  }
}

template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* kv, int B, int Tq, int Tk, int D,
                      int H) {
  AttentionForward(out, probs, q, 3 * D, kv + D, kv + 2 * D, 3 * D, B, Tq, Tk, D, H);
}

template <typename T>
void AttentionBackward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* probs, int B,
                       int Tq, int Tk, int D, int H) {
  AttentionBackward(dq, dkv + D, dkv + 2 * D, dout, q, 3 * D, kv + D, kv + 2 * D, 3 * D, probs, B,
                    Tq, Tk, D, H);
}

template void AttentionForward<float>(float*, float*, const float*, const float*, int, int, int,
                                      int, int);
template void AttentionForward<double>(double*, double*, const double*, const double*, int, int,
                                       int, int, int);
template void AttentionBackward<float>(float*, float*, const float*, const float*, const float*,
                                       const float*, int, int, int, int, int);
template void AttentionBackward<double>(double*, double*, const double*, const double*,
                                        const double*, const double*, int, int, int, int, int);

template void AttentionForward<float>(float*, float*, const float*, int, const float*, const float*,
                                      int, int, int, int, int, int);
template void AttentionForward<double>(double*, double*, const double*, int, const double*,
                                       const double*, int, int, int, int, int, int);
template void AttentionBackward<float>(float*, float*, float*, const float*, const float*, int,
                                       const float*, const float*, int, const float*, int, int, int,
                                       int, int);
template void AttentionBackward<double>(double*, double*, double*, const double*, const double*,
                                        int, const double*, const double*, int, const double*, int,
                                        int, int, int, int);

}  // namespace difftrain::cpu
