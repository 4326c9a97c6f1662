#include "model/cpu/activation.h"

#include <cmath>

#include "model/cpu/vec_math.h"

namespace difftrain::cpu {
namespace {
// GELU(x) = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
template <typename T>
constexpr T kGeluScale = T(0.7978845608028654);  // √(2/π)
template <typename T>
constexpr T kGeluCubic = T(0.044715);
}  // namespace

template <typename T>
void GeluForward(T* out, const T* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T u = kGeluScale<T> * (x + kGeluCubic<T> * x * x * x);
    out[i] = T(0.5) * x * (T(1) + VecTanh(u));
  }
}

template <typename T>
void GeluBackward(T* din, const T* dout, const T* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T u = kGeluScale<T> * (x + kGeluCubic<T> * x * x * x);
    const T th = VecTanh(u);
    const T du = kGeluScale<T> * (T(1) + T(3) * kGeluCubic<T> * x * x);
    din[i] += dout[i] * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du);
  }
}

template <typename T>
void SiluForward(T* out, const T* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i)
    out[i] = in[i] * VecSigmoid(in[i]);
}

template <typename T>
void SiluBackward(T* din, const T* dout, const T* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T sig = VecSigmoid(in[i]);
    din[i] += dout[i] * sig * (T(1) + in[i] * (T(1) - sig));
  }
}

template <typename T>
void GegluForward(T* out, const T* in, size_t N, size_t F) {
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; ++n) {
    const T* x = in + n * 2 * F;
    const T* gate = x + F;
    for (size_t f = 0; f < F; ++f)
      out[n * F + f] = x[f] * T(0.5) * gate[f] * (T(1) + std::erf(gate[f] * T(M_SQRT1_2)));
  }
}

template <typename T>
void GegluBackward(T* din, const T* dout, const T* in, size_t N, size_t F) {
  // GELU'(g) = Φ(g) + g · φ(g), φ the standard normal density.
  const T inv_sqrt_2pi = T(0.5 * M_2_SQRTPI * M_SQRT1_2);
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; ++n) {
    const T* x = in + n * 2 * F;
    const T* gate = x + F;
    T* dx = din + n * 2 * F;
    T* dgate = dx + F;
    for (size_t f = 0; f < F; ++f) {
      const T g = gate[f], dy = dout[n * F + f];
      const T cdf = T(0.5) * (T(1) + std::erf(g * T(M_SQRT1_2)));
      dx[f] += dy * g * cdf;
      dgate[f] += dy * x[f] * (cdf + g * inv_sqrt_2pi * std::exp(T(-0.5) * g * g));
    }
  }
}

template void GeluForward<float>(float*, const float*, size_t);
template void GeluForward<double>(double*, const double*, size_t);
template void GeluBackward<float>(float*, const float*, const float*, size_t);
template void GeluBackward<double>(double*, const double*, const double*, size_t);
template void SiluForward<float>(float*, const float*, size_t);
template void SiluForward<double>(double*, const double*, size_t);
template void SiluBackward<float>(float*, const float*, const float*, size_t);
template void SiluBackward<double>(double*, const double*, const double*, size_t);
template void GegluForward<float>(float*, const float*, size_t, size_t);
template void GegluForward<double>(double*, const double*, size_t, size_t);
template void GegluBackward<float>(float*, const float*, const float*, size_t, size_t);
template void GegluBackward<double>(double*, const double*, const double*, size_t, size_t);

}  // namespace difftrain::cpu
