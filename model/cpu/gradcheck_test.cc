// The gradient-check helpers must be able to fail: a correct gradient passes, a gradient that is
// off by far less than any real bug does not, and a backward that overwrites instead of adding
// is caught.
#include "model/cpu/gradcheck.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain::cpu::gradcheck {
namespace {

// A small op with coupled elements: out_k = sin(x_k) · x_{k+1} (indices cyclic).
class GradCheckTest : public ::testing::Test {
 protected:
  static constexpr size_t kN = 37;

  void Forward(Vector& out) const {
    for (size_t k = 0; k < kN; ++k)
      out[k] = std::sin(x_[k]) * x_[(k + 1) % kN];
  }

  // dx_i = w_i · cos(x_i) · x_{i+1} + w_{i−1} · sin(x_{i−1}), added into dx.
  void Backward(Vector& dx) const {
    for (size_t i = 0; i < kN; ++i) {
      const size_t prev = (i + kN - 1) % kN;
      dx[i] += w_[i] * std::cos(x_[i]) * x_[(i + 1) % kN] + w_[prev] * std::sin(x_[prev]);
    }
  }

  Vector Gradient() const {
    Vector dx(kN);
    Backward(dx);
    return dx;
  }

  std::mt19937 rng_{5};
  Vector x_ = Random(kN, rng_, -2.0, 2.0);
  Vector w_ = Random(kN, rng_);
  ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_F(GradCheckTest, CorrectGradientPasses) {
  EXPECT_TRUE(GradientMatches(x_, Gradient(), w_, forward_));
}

TEST_F(GradCheckTest, PerturbedGradientFails) {
  Vector dx = Gradient();
  dx[11] *= 1 + 1e-5;
  EXPECT_FALSE(GradientMatches(x_, dx, w_, forward_));
}

TEST_F(GradCheckTest, MissingTermFails) {
  Vector dx(kN);
  for (size_t i = 0; i < kN; ++i)
    dx[i] = w_[i] * std::cos(x_[i]) * x_[(i + 1) % kN];
  EXPECT_FALSE(GradientMatches(x_, dx, w_, forward_));
}

TEST_F(GradCheckTest, NaNFails) {
  Vector dx = Gradient();
  dx[3] = std::nan("");
  EXPECT_FALSE(GradientMatches(x_, dx, w_, forward_));
}

TEST_F(GradCheckTest, InputsAreRestored) {
  const Vector before = x_;
  NumericalGradient(x_, SampleIndices(kN, kN, rng_), w_, forward_);
  EXPECT_EQ(x_, before);
}

TEST_F(GradCheckTest, LargeTensorsAreSampled) {
  const std::vector<size_t> picked = SampleIndices(1000, kMaxChecks, rng_);
  ASSERT_EQ(picked.size(), kMaxChecks);
  for (size_t k = 1; k < picked.size(); ++k)
    EXPECT_LT(picked[k - 1], picked[k]);
}

TEST_F(GradCheckTest, AccumulatingBackwardPasses) {
  Vector dx(kN);
  EXPECT_TRUE(Accumulates({{"dx", &dx}}, [&] { Backward(dx); }));
}

TEST_F(GradCheckTest, OverwritingBackwardFails) {
  Vector dx(kN);
  EXPECT_FALSE(Accumulates({{"dx", &dx}}, [&] { dx = Gradient(); }));
}

}  // namespace
}  // namespace difftrain::cpu::gradcheck
