// Nearest ×2 upsampling: forward copies each pixel into its 2 × 2 block; backward against
// central differences and the += contract.
#include "model/cpu/upsample.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

constexpr int P = 3, H = 3, W = 4;

TEST(Upsample2x, ForwardRepeatsPixels) {
  std::mt19937 rng(3);
  const Vector in = gradcheck::Random(P * H * W, rng);
  Vector out(4 * P * H * W);
  Upsample2xForward(out.data(), in.data(), P, H, W);
  for (int p = 0; p < P; ++p)
    for (int y = 0; y < 2 * H; ++y)
      for (int x = 0; x < 2 * W; ++x)
        EXPECT_EQ(out[(p * 2 * H + y) * 2 * W + x], in[(p * H + y / 2) * W + x / 2]);
}

TEST(Upsample2x, GradientMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(4);
  Vector in = gradcheck::Random(P * H * W, rng), dout = gradcheck::Random(4 * P * H * W, rng);
  Vector din(in.size());
  Upsample2xBackward(din.data(), dout.data(), P, H, W);
  EXPECT_TRUE(gradcheck::GradientMatches(
      in, din, dout, [&](Vector& out) { Upsample2xForward(out.data(), in.data(), P, H, W); }));
  EXPECT_TRUE(gradcheck::Accumulates(
      {{"din", &din}}, [&] { Upsample2xBackward(din.data(), dout.data(), P, H, W); }));
}

}  // namespace
}  // namespace difftrain::cpu
