#include "model/cpu/vec_math.h"

#include <cmath>

#include <gtest/gtest.h>

namespace difftrain::cpu {
namespace {

TEST(VecMathTest, ExpIsWithinTwoTenthsOfAMillionthOfLibm) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(VecExp(x) - exact) / exact);
  }
  EXPECT_LT(worst, 2.5e-7);
}

TEST(VecMathTest, ExpClampsInsteadOfOverflowing) {
  EXPECT_TRUE(std::isfinite(VecExp(1000.0f)));
  EXPECT_GT(VecExp(-1000.0f), 0.0f);
  EXPECT_LT(VecExp(-1000.0f), 1e-37f);
}

TEST(VecMathTest, TanhAndSigmoidMatchLibm) {
  double worst_tanh = 0, worst_sigmoid = 0;
  for (float x = -20.0f; x <= 20.0f; x += 0.001f) {
    worst_tanh = std::max(worst_tanh, std::abs(VecTanh(x) - std::tanh(double(x))));
    worst_sigmoid =
        std::max(worst_sigmoid, std::abs(VecSigmoid(x) - 1.0 / (1.0 + std::exp(-double(x)))));
  }
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_LT(worst_sigmoid, 2e-7);
  EXPECT_EQ(VecTanh(50.0f), 1.0f);
  EXPECT_EQ(VecTanh(-50.0f), -1.0f);
}

}  // namespace
}  // namespace difftrain::cpu
