// Linear: forward against a triple loop, din, dweight and dbias against central differences,
// the += contract, a null din, and the float instantiation against the double one.
#include "model/cpu/linear.h"

#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

// N = B·T rows for B = 2, T = 5. O > 64 so that the bias gradient spans two column blocks.
constexpr int N = 10, I = 12, O = 70;

template <typename Real>
struct LinearResult {
  std::vector<Real> out, din, dweight, dbias;
};

class LinearTest : public ::testing::Test {
 protected:
  // Forward, then backward from dout = w_ into zeroed gradients, in precision Real.
  template <typename Real>
  LinearResult<Real> Run() const {
    using gradcheck::Convert;
    const auto in = Convert<Real>(in_), weight = Convert<Real>(weight_),
               bias = Convert<Real>(bias_), dout = Convert<Real>(w_);
    LinearResult<Real> r{std::vector<Real>(N * O), std::vector<Real>(N * I),
                         std::vector<Real>(O * I), std::vector<Real>(O)};
    LinearForward(r.out.data(), in.data(), weight.data(), bias.data(), N, I, O);
    LinearBackward(r.din.data(), r.dweight.data(), r.dbias.data(), dout.data(), in.data(),
                   weight.data(), N, I, O);
    return r;
  }

  // out[n, o] = Σ_i in[n, i] · weight[o, i] (+ bias[o]).
  Vector Reference(bool with_bias) const {
    Vector out(N * O);
    for (int n = 0; n < N; ++n) {
      for (int o = 0; o < O; ++o) {
        double sum = with_bias ? bias_[o] : 0.0;
        for (int i = 0; i < I; ++i)
          sum += in_[n * I + i] * weight_[o * I + i];
        out[n * O + o] = sum;
      }
    }
    return out;
  }

  void Forward(Vector& out) const {
    LinearForward(out.data(), in_.data(), weight_.data(), bias_.data(), N, I, O);
  }

  std::mt19937 rng_{101};
  Vector in_ = gradcheck::Random(N * I, rng_);
  Vector weight_ = gradcheck::Random(O * I, rng_);
  Vector bias_ = gradcheck::Random(O, rng_);
  Vector w_ = gradcheck::Random(N * O, rng_);  // the loss weights, fed to backward as dout
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_F(LinearTest, ForwardMatchesTripleLoop) {
  EXPECT_TRUE(gradcheck::Near(Run<double>().out, Reference(true), 1e-13));
}

// Without a bias the GEMM runs with beta = 0 and must not read what the buffer held before.
TEST_F(LinearTest, ForwardWithoutBiasOverwritesOutput) {
  Vector out(N * O, std::numeric_limits<double>::quiet_NaN());
  LinearForward<double>(out.data(), in_.data(), weight_.data(), nullptr, N, I, O);
  EXPECT_TRUE(gradcheck::Near(out, Reference(false), 1e-13));
}

TEST_F(LinearTest, GradientsMatchFiniteDifferences) {
  const LinearResult<double> r = Run<double>();
  EXPECT_TRUE(gradcheck::GradientMatches(in_, r.din, w_, forward_));
  EXPECT_TRUE(gradcheck::GradientMatches(weight_, r.dweight, w_, forward_));
  EXPECT_TRUE(gradcheck::GradientMatches(bias_, r.dbias, w_, forward_));
}

TEST_F(LinearTest, NullInputGradientIsSkipped) {
  const LinearResult<double> r = Run<double>();
  Vector dweight(O * I), dbias(O);
  LinearBackward<double>(nullptr, dweight.data(), dbias.data(), w_.data(), in_.data(),
                         weight_.data(), N, I, O);
  EXPECT_TRUE(gradcheck::Near(dweight, r.dweight, 0.0));
  EXPECT_TRUE(gradcheck::Near(dbias, r.dbias, 0.0));
}

TEST_F(LinearTest, BackwardAddsIntoGradients) {
  Vector din(N * I), dweight(O * I), dbias(O);
  EXPECT_TRUE(
      gradcheck::Accumulates({{"din", &din}, {"dweight", &dweight}, {"dbias", &dbias}}, [&] {
        LinearBackward(din.data(), dweight.data(), dbias.data(), w_.data(), in_.data(),
                       weight_.data(), N, I, O);
      }));
}

TEST_F(LinearTest, FloatMatchesDouble) {
  const LinearResult<float> f = Run<float>();
  const LinearResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.din, d.din, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.dweight, d.dweight, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.dbias, d.dbias, 1e-5));
}

}  // namespace
}  // namespace difftrain::cpu
