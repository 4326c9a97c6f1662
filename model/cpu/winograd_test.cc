// Winograd's F(2×2, 3×3) convolution against Conv2dForward (im2col and a GEMM): in double to
// 1e-12, in float to float's rounding, on even and odd sizes (partial tiles), one and several
// channels and samples, with and without a bias, in one pass and in several; and the shapes
// it refuses.
#include "model/cpu/winograd.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain::cpu {
namespace {

template <typename T>
double MaxRelative(const std::vector<T>& got, const std::vector<T>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / scale;
}

template <typename T>
double Compare(const Conv2dShape& s, bool with_bias, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  const auto random = [&](size_t n) {
    std::vector<T> v(n);
    for (T& x : v)
      x = static_cast<T>(normal(rng));
    return v;
  };
  const std::vector<T> in = random(size_t(s.B) * s.C * s.H * s.W);
  const std::vector<T> weight = random(size_t(s.Co) * s.C * 9);
  const std::vector<T> bias = random(s.Co);
  std::vector<T> want(size_t(s.B) * s.Co * s.H * s.W), got(want.size(), T(-7));
  Conv2dForward(want.data(), in.data(), weight.data(), with_bias ? bias.data() : nullptr, s);
  Conv2dForwardWinograd(got.data(), in.data(), weight.data(), with_bias ? bias.data() : nullptr, s);
  return MaxRelative(got, want);
}

TEST(WinogradTest, EqualsTheIm2colConvolution) {
  const std::vector<Conv2dShape> shapes = {
      {1, 1, 2, 2, 1, 3, 1, 1},      // one tile
      {1, 3, 5, 7, 4, 3, 1, 1},      // odd sizes: partial tiles at the bottom and right
      {2, 8, 8, 8, 16, 3, 1, 1},     // two samples
      {1, 32, 16, 12, 24, 3, 1, 1},  // wider channels
      {3, 5, 1, 9, 2, 3, 1, 1},      // one row
      // 35 tile rows of 129 tiles, taken in passes of 31 (kChunkFloats), the last partial.
      {1, 32, 69, 258, 32, 3, 1, 1},
      // 3 samples of 5 tile rows in passes of 31 rows: every sample in one pass.
      {3, 32, 9, 258, 32, 3, 1, 1},
      // 4 samples of 35 tile rows: passes that end inside a sample and start in the next.
      {4, 32, 69, 258, 32, 3, 1, 1},
  };
  for (const Conv2dShape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << s.B << "x" << s.C << "x" << s.H << "x" << s.W << " -> " << s.Co);
    for (bool with_bias : {true, false}) {
      EXPECT_LT(Compare<double>(s, with_bias, 3), 1e-12);
      EXPECT_LT(Compare<float>(s, with_bias, 4), 2e-6);
    }
  }
}

TEST(WinogradTest, TakesThreeByThreeStrideOnePaddingOneOnly) {
  EXPECT_TRUE(WinogradTakes({1, 4, 8, 8, 4, 3, 1, 1}));
  EXPECT_FALSE(WinogradTakes({1, 4, 8, 8, 4, 3, 2, 1}));
  EXPECT_FALSE(WinogradTakes({1, 4, 8, 8, 4, 3, 1, 0}));
  EXPECT_FALSE(WinogradTakes({1, 4, 8, 8, 4, 1, 1, 0}));
}

}  // namespace
}  // namespace difftrain::cpu
