// LayerNorm: forward (output, mean, rstd) against the direct formula, din against central
// differences, the += contract, and the float instantiation against the double one.
#include "model/cpu/layernorm.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

// N = B·T rows for B = 2, T = 5.
constexpr int N = 10, C = 12;
constexpr double kEps = 1e-6;

template <typename Real>
struct LayerNormResult {
  std::vector<Real> out, mean, rstd, din;
};

class LayerNormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Rows with their own offset and spread, as a residual stream has.
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < C; ++c)
        in_[n * C + c] = 0.5 * n - 2.0 + (0.2 + 0.3 * n) * in_[n * C + c];
    }
  }

  // Forward, then backward from dout = w_ into a zeroed din, in precision Real.
  template <typename Real>
  LayerNormResult<Real> Run() const {
    const auto in = gradcheck::Convert<Real>(in_), dout = gradcheck::Convert<Real>(w_);
    LayerNormResult<Real> r{std::vector<Real>(N * C), std::vector<Real>(N), std::vector<Real>(N),
                            std::vector<Real>(N * C)};
    LayerNormForward(r.out.data(), r.mean.data(), r.rstd.data(), in.data(), N, C, Real(kEps));
    LayerNormBackward(r.din.data(), dout.data(), in.data(), r.mean.data(), r.rstd.data(), N, C);
    return r;
  }

  void Forward(Vector& out) const {
    Vector mean(N), rstd(N);
    LayerNormForward(out.data(), mean.data(), rstd.data(), in_.data(), N, C, kEps);
  }

  std::mt19937 rng_{202};
  Vector in_ = gradcheck::Random(N * C, rng_);
  Vector w_ = gradcheck::Random(N * C, rng_);  // the loss weights, fed to backward as dout
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_F(LayerNormTest, ForwardMatchesFormula) {
  Vector out(N * C), mean(N), rstd(N);
  for (int n = 0; n < N; ++n) {
    double sum = 0;
    for (int c = 0; c < C; ++c)
      sum += in_[n * C + c];
    mean[n] = sum / C;
    double var = 0;
    for (int c = 0; c < C; ++c)
      var += (in_[n * C + c] - mean[n]) * (in_[n * C + c] - mean[n]);
    rstd[n] = 1.0 / std::sqrt(var / C + kEps);
    for (int c = 0; c < C; ++c)
      out[n * C + c] = (in_[n * C + c] - mean[n]) * rstd[n];
  }
  const LayerNormResult<double> r = Run<double>();
  EXPECT_TRUE(gradcheck::Near(r.out, out, 1e-13));
  EXPECT_TRUE(gradcheck::Near(r.mean, mean, 1e-13));
  EXPECT_TRUE(gradcheck::Near(r.rstd, rstd, 1e-13));
}

TEST_F(LayerNormTest, GradientMatchesFiniteDifferences) {
  EXPECT_TRUE(gradcheck::GradientMatches(in_, Run<double>().din, w_, forward_));
}

TEST_F(LayerNormTest, BackwardAddsIntoGradient) {
  const LayerNormResult<double> r = Run<double>();
  Vector din(N * C);
  EXPECT_TRUE(gradcheck::Accumulates({{"din", &din}}, [&] {
    LayerNormBackward(din.data(), w_.data(), in_.data(), r.mean.data(), r.rstd.data(), N, C);
  }));
}

TEST_F(LayerNormTest, FloatMatchesDouble) {
  const LayerNormResult<float> f = Run<float>();
  const LayerNormResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.mean, d.mean, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.rstd, d.rstd, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.din, d.din, 1e-5));
}

}  // namespace
}  // namespace difftrain::cpu
