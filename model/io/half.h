// IEEE binary16 and bfloat16 (a safetensors F16 or BF16 tensor's element) and fp32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace difftrain::io {

// binary16 bits to fp32, exactly, by integer arithmetic: normal numbers, subnormals, zeros and
// infinities; a NaN stays a NaN with its payload (the compiler's _Float16 conversion, which the
// loaders use where the compiler has it, quiets a signalling one).
constexpr float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // A subnormal, mantissa · 2^-24: shifted up to its leading one, 2^(-14 - shifts) · 1.m.
  uint32_t shifts = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shifts;
  }
  return std::bit_cast<float>(sign | ((113 - shifts) << 23) | ((mantissa & 0x3ffu) << 13));
}

// The conversion the loaders use: the compiler's _Float16 where it has one (GCC on x86-64:
// the F16C instruction with -march=native), HalfBitsToFloat otherwise (clang 14 on x86-64,
// which builds the fuzz targets, has no _Float16 there).
inline float HalfToFloat(uint16_t h) {
#if defined(__FLT16_MANT_DIG__)
  return static_cast<float>(std::bit_cast<_Float16>(h));
#else
  return HalfBitsToFloat(h);
#endif
}

// fp32 to bfloat16 bits, rounded to nearest even; a NaN stays a NaN (quieted), as torch's
// .bfloat16().
constexpr uint16_t FloatToBf16Bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// n floats to F16 bits (`bf16` false: IEEE binary16, rounded to nearest even, as torch's
// .half()) or BF16 bits (FloatToBf16Bits): `difftrain export --dtype`'s conversion
// (model/io/half.cc; the compiler's _Float16, which GCC has on x86-64).
void RoundFloats(const float* src, size_t n, bool bf16, uint16_t* dst);

}  // namespace difftrain::io
