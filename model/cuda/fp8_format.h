// The two 8-bit floating-point formats of Hopper's tensor cores (the OCP FP8 formats, NVIDIA's
// __nv_fp8_e4m3 and __nv_fp8_e5m2), written out on the CPU: the reference the GPU's conversions
// are checked against (model/simt/fp8_kernel_test.cc compares this with cuda_fp8.h's
// conversion for every bf16 value, and runs the quantising kernel on the CPU emulator with it).
//
// E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, 0x7F/0xFF is NaN, the
// largest finite value 448, subnormals down to 2⁻⁹. E5M2: 5 exponent bits (bias 15), 2 mantissa
// bits, IEEE-like (infinities, NaNs), the largest finite value 57,344, subnormals to 2⁻¹⁶.
// Conversion rounds to nearest, ties to even, and saturates: a magnitude at or past the largest
// finite value (infinity too) becomes the largest finite value of its sign, as the GPU's
// cvt.rn.satfinite does; NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>

namespace difftrain::fp8 {

enum Format : int { kE4M3 = 0, kE5M2 = 1 };

inline constexpr int MantissaBits(Format f) {
  return f == kE4M3 ? 3 : 2;
}
inline constexpr int ExponentBias(Format f) {
  return f == kE4M3 ? 7 : 15;
}
// The largest finite value, and its code (sign bit clear).
inline constexpr float MaxFinite(Format f) {
  return f == kE4M3 ? 448.0f : 57344.0f;
}
inline constexpr uint8_t MaxFiniteCode(Format f) {
  return f == kE4M3 ? 0x7E : 0x7B;
}
inline constexpr uint8_t kNaNCode = 0x7F;  // a NaN in both formats

inline float ToFloat(uint8_t code, Format f) {
  const int m_bits = MantissaBits(f), bias = ExponentBias(f);
  const float sign = (code & 0x80) != 0 ? -1.0f : 1.0f;
  const int exponent = (code & 0x7F) >> m_bits;
  const int mantissa = code & ((1 << m_bits) - 1);
  if (f == kE4M3 && (code & 0x7F) == 0x7F) return std::nanf("");
  if (f == kE5M2 && exponent == 31) return mantissa == 0 ? sign * INFINITY : std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - bias - m_bits);
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << m_bits)), exponent - bias - m_bits);
}

inline uint8_t FromFloat(float x, Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | kNaNCode;
  const float a = std::fabs(x);
  if (a >= MaxFinite(f)) return sign | MaxFiniteCode(f);
  const int m_bits = MantissaBits(f), min_exponent = 1 - ExponentBias(f);
  // The spacing of representable values around a (that of the subnormals below 2^min_exponent);
  // a / quantum is exact (a power-of-two scaling), nearbyint rounds it to nearest even.
  int e = 0;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1): floor(log2 a) = e − 1
  const int exponent = e - 1 > min_exponent ? e - 1 : min_exponent;
  const float steps = std::nearbyint(std::ldexp(a, m_bits - exponent));
  const float r = std::ldexp(steps, exponent - m_bits);
  if (r >= MaxFinite(f)) return sign | MaxFiniteCode(f);  // rounded up to the largest, or past
  if (r == 0) return sign;
  std::frexp(r, &e);  // rounding may have carried into the next binade
  if (e - 1 < min_exponent)
    return sign | static_cast<uint8_t>(std::ldexp(r, m_bits - min_exponent));
  const int mantissa = static_cast<int>(std::ldexp(r, m_bits - (e - 1))) - (1 << m_bits);
  return sign | static_cast<uint8_t>(((e - 1 + ExponentBias(f)) << m_bits) | mantissa);
}

}  // namespace difftrain::fp8
