// FP8 on every machine: the formats' CPU conversion (model/cuda/fp8_format.h) against their
// definition and, where the CUDA headers are installed, against cuda_fp8.h's own conversion (the
// one the GPU kernels call) for every bf16 value; then the quantising and scale-update kernels
// (model/cuda/fp8_kernels.h) on the CPU emulator against loops over the format. The compiled
// kernels and the FP8 GEMMs run on a GPU in model/cuda/fp8_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/cuda/fp8_format.h"
#include "model/cuda/fp8_kernels.h"
#include "model/simt/simt.h"
#include "model/tensor/rng.h"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define DIFFTRAIN_TEST_HAVE_CUDA_FP8 1
#endif

namespace difftrain {
namespace {

using fp8::FromFloat;
using fp8::kE4M3;
using fp8::kE5M2;
using fp8::ToFloat;

bool IsNaNCode(uint8_t code, fp8::Format f) {
  return std::isnan(ToFloat(code, f));
}

TEST(Fp8FormatTest, KnownValues) {
  EXPECT_EQ(FromFloat(1.0f, kE4M3), 0x38);  // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(FromFloat(1.0f, kE5M2), 0x3C);  // exponent 15
  EXPECT_EQ(FromFloat(-2.0f, kE4M3), 0xC0);
  EXPECT_EQ(FromFloat(448.0f, kE4M3), 0x7E);
  EXPECT_EQ(FromFloat(57344.0f, kE5M2), 0x7B);
  EXPECT_EQ(FromFloat(std::ldexp(1.0f, -9), kE4M3), 0x01);  // the smallest subnormals
  EXPECT_EQ(FromFloat(std::ldexp(1.0f, -16), kE5M2), 0x01);
  EXPECT_EQ(FromFloat(std::ldexp(1.0f, -6), kE4M3), 0x08);  // the smallest normal
  // Ties go to the even mantissa: 1 + 1/16 lies between 1 (000) and 1.125 (001), 1 + 3/16
  // between 1.125 (001) and 1.25 (010).
  EXPECT_EQ(FromFloat(1.0625f, kE4M3), 0x38);
  EXPECT_EQ(FromFloat(1.1875f, kE4M3), 0x3A);
  // Below half the smallest subnormal: zero, keeping the sign; half of it is a tie with 0.
  EXPECT_EQ(FromFloat(std::ldexp(1.0f, -11), kE4M3), 0x00);
  EXPECT_EQ(FromFloat(-std::ldexp(1.0f, -10), kE4M3), 0x80);
  // Saturation: past the largest finite value, infinity included, is the largest.
  EXPECT_EQ(FromFloat(500.0f, kE4M3), 0x7E);
  EXPECT_EQ(FromFloat(464.0f, kE4M3), 0x7E);
  EXPECT_EQ(FromFloat(-INFINITY, kE4M3), 0xFE);
  EXPECT_EQ(FromFloat(INFINITY, kE5M2), 0x7B);
  EXPECT_EQ(FromFloat(1e30f, kE5M2), 0x7B);
  EXPECT_TRUE(IsNaNCode(FromFloat(std::nanf(""), kE4M3), kE4M3));
  EXPECT_TRUE(IsNaNCode(FromFloat(std::nanf(""), kE5M2), kE5M2));
  EXPECT_EQ(ToFloat(0x7E, kE4M3), 448.0f);
  EXPECT_EQ(ToFloat(0x7C, kE5M2), INFINITY);
  EXPECT_EQ(ToFloat(0x01, kE5M2), std::ldexp(1.0f, -16));
}

// Every finite code converts back to itself, and the codes increase with their values.
TEST(Fp8FormatTest, EveryCodeRoundTrips) {
  for (fp8::Format f : {kE4M3, kE5M2}) {
    float before = 0;
    for (int code = 0; code < 0x80; ++code) {
      const float v = ToFloat(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(FromFloat(v, f), code) << "format " << f << ", value " << v;
      EXPECT_EQ(FromFloat(-v, f), code | 0x80) << "format " << f << ", value " << -v;
      if (code > 0) {
        EXPECT_GT(v, before) << "format " << f << ", code " << code;
      }
      before = v;
    }
  }
}

float Bf16Value(uint16_t bits) {
  return simt::Bf16ToFloat(bits);
}

#ifdef DIFFTRAIN_TEST_HAVE_CUDA_FP8
// The conversion the kernels make on a GPU (cuda_fp8.h's, with saturation) is this file's, for
// every bf16 value times a few scales.
TEST(Fp8FormatTest, EqualsCudaFp8sConversionOnEveryBf16Value) {
  for (fp8::Format f : {kE4M3, kE5M2}) {
    const __nv_fp8_interpretation_t kind = f == kE4M3 ? __NV_E4M3 : __NV_E5M2;
    int mismatches = 0;
    for (float scale : {1.0f, 0.75f, 37.5f, 1.0f / 3}) {
      for (uint32_t bits = 0; bits < 0x10000; ++bits) {
        const float x = Bf16Value(static_cast<uint16_t>(bits)) * scale;
        const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind);
        const uint8_t got = FromFloat(x, f);
        const bool same = got == want || (IsNaNCode(got, f) && IsNaNCode(want, f));
        if (!same && ++mismatches <= 5) {
          ADD_FAILURE() << "format " << f << ": " << x << " gives 0x" << std::hex << int(got)
                        << ", cuda_fp8.h 0x" << int(want);
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "format " << f;
  }
}
#endif

struct Matrix {
  int rows, cols;
  std::vector<uint16_t> bf16;
};

Matrix RandomMatrix(int rows, int cols, uint64_t seed) {
  Rng rng(seed, RngStream::kData);
  Matrix m{rows, cols, std::vector<uint16_t>(size_t(rows) * cols)};
  for (uint16_t& b : m.bf16)
    b = simt::FloatToBf16(static_cast<float>(rng.Normal() * 3.0));
  return m;
}

constexpr uint8_t kUnwritten = 0x55;

void ExpectQuantizes(int rows, int cols, fp8::Format f, bool row_major, bool transposed) {
  SCOPED_TRACE(::testing::Message()
               << rows << " x " << cols << ", format " << f << (row_major ? ", row-major" : "")
               << (transposed ? ", transposed" : ""));
  const Matrix m = RandomMatrix(rows, cols, rows * 1000 + cols);
  const float scale = f == kE4M3 ? 150.0f : 14336.0f;  // |x| past 3 or 4 saturates
  const size_t n = m.bf16.size();
  std::vector<uint8_t> out(n, kUnwritten), out_t(n, kUnwritten);
  float amax = 0.25f;  // below every matrix's largest |x|
  const fp8::QuantizeArgs args{m.bf16.data(),
                               row_major ? out.data() : nullptr,
                               transposed ? out_t.data() : nullptr,
                               rows,
                               cols,
                               &scale,
                               &amax,
                               f};
  const simt::Dim3 grid{(cols + fp8::kTile - 1) / fp8::kTile, (rows + fp8::kTile - 1) / fp8::kTile,
                        1};
  simt::Launch(grid, fp8::kThreads, fp8::kQuantizeSharedBytes,
               [&] { fp8::Quantize<simt::Primitives>(args); });
  float want_amax = 0.25f;
  int saturated = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const float x = Bf16Value(m.bf16[size_t(r) * cols + c]);
      want_amax = std::max(want_amax, std::fabs(x));
      const uint8_t want = FromFloat(x * scale, f);
      saturated += (want & 0x7F) == fp8::MaxFiniteCode(f);
      if (row_major) {
        ASSERT_EQ(out[size_t(r) * cols + c], want) << "row " << r << ", column " << c;
      }
      if (transposed) {
        ASSERT_EQ(out_t[size_t(c) * rows + r], want) << "row " << r << ", column " << c;
      }
    }
  }
  EXPECT_EQ(amax, want_amax);
  EXPECT_GT(saturated, 0);  // the case is exercised
  if (!row_major) {
    EXPECT_EQ(out, std::vector<uint8_t>(n, kUnwritten));
  }
  if (!transposed) {
    EXPECT_EQ(out_t, std::vector<uint8_t>(n, kUnwritten));
  }
}

TEST(Fp8KernelTest, QuantizesInBothLayouts) {
  // Whole tiles, partial tiles in either direction, one 16 x 16 corner, several blocks.
  for (auto [rows, cols] : {std::pair{64, 64}, {16, 16}, {80, 48}, {144, 208}, {48, 128}}) {
    for (fp8::Format f : {kE4M3, kE5M2}) {
      ExpectQuantizes(rows, cols, f, true, true);
    }
  }
  ExpectQuantizes(80, 48, kE4M3, true, false);
  ExpectQuantizes(80, 48, kE5M2, false, true);
}

// The running amax is only raised: a matrix of smaller values leaves a larger one.
TEST(Fp8KernelTest, AmaxIsRaisedNeverLowered) {
  const Matrix m = RandomMatrix(32, 32, 3);
  std::vector<uint8_t> out(m.bf16.size());
  const float scale = 1.0f;
  float amax = 1000.0f;
  const fp8::QuantizeArgs args{m.bf16.data(), out.data(), nullptr, 32, 32, &scale, &amax, kE4M3};
  simt::Launch({1, 1, 1}, fp8::kThreads, fp8::kQuantizeSharedBytes,
               [&] { fp8::Quantize<simt::Primitives>(args); });
  EXPECT_EQ(amax, 1000.0f);
}

struct ScaleState {
  std::vector<float> amax, history, scale, scale_inv, limit;
  std::vector<int> count;
  int length;

  ScaleState(std::vector<float> limits, int history_length)
      : amax(limits.size(), 0.0f),
        history(limits.size() * history_length, 0.0f),
        scale(limits.size(), 1.0f),
        scale_inv(limits.size(), 1.0f),
        limit(std::move(limits)),
        count(limit.size(), 0),
        length(history_length) {}

  void Update() {
    const fp8::ScaleArgs args{amax.data(),      history.data(), count.data(), scale.data(),
                              scale_inv.data(), limit.data(),   length};
    simt::Launch({static_cast<int>(limit.size()), 1, 1}, fp8::kScaleThreads, fp8::kScaleSharedBytes,
                 [&] { fp8::UpdateScales<simt::Primitives>(args); });
  }
};

// Delayed scaling: the scale follows the largest amax of the last `length` updates, the running
// amax restarts at 0 each update, and a history of zeros or a non-finite amax keeps the scale.
TEST(Fp8KernelTest, ScalesFollowTheAmaxHistory) {
  const int length = 3;
  // Tensor 0 E4M3 (limit 448), tensor 1 E5M2 with margin 1 (57,344 / 2).
  ScaleState s({448.0f, 28672.0f}, length);
  s.Update();  // nothing quantised yet: the scales stay 1
  EXPECT_EQ(s.scale, (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(s.count, (std::vector<int>{1, 1}));
  const float amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f, 4.0f};
  std::vector<float> seen = {0.0f};  // the first update's
  for (float a : amaxes) {
    s.amax = {a, 2 * a};
    s.Update();
    seen.push_back(a);
    float window = 0;  // the last `length` updates'
    for (size_t i = seen.size() > size_t(length) ? seen.size() - length : 0; i < seen.size(); ++i)
      window = std::max(window, seen[i]);
    SCOPED_TRACE(::testing::Message() << "after amax " << a << ", window max " << window);
    EXPECT_EQ(s.scale[0], 448.0f / window);
    EXPECT_EQ(s.scale_inv[0], 1.0f / (448.0f / window));
    EXPECT_EQ(s.scale[1], 28672.0f / (2 * window));
    EXPECT_EQ(s.amax, (std::vector<float>{0.0f, 0.0f}));
  }
  const float kept = s.scale[0];
  s.amax = {INFINITY, 1.0f};
  s.Update();
  EXPECT_EQ(s.scale[0], kept);  // an infinite amax in the window keeps the scale
  EXPECT_EQ(s.count[0], 1 + 7);
}

}  // namespace
}  // namespace difftrain
