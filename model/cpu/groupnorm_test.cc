// GroupNorm with affine weights and the per-channel affine map it shares with LayerNorm:
// forward against the formula, every gradient against central differences, the += contract
// and float against double. LayerNorm with affine weights is LayerNorm followed by the affine
// map over the last dimension; that composition is checked here too.
#include "model/cpu/groupnorm.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/affine.h"
#include "model/cpu/gradcheck.h"
#include "model/cpu/layernorm.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

constexpr GroupNormShape kShape{2, 6, 10, 3};  // B, C, H·W, G
constexpr size_t kSize = size_t(kShape.B) * kShape.C * kShape.HW;
constexpr double kEps = 1e-5;

class GroupNormTest : public ::testing::Test {
 protected:
  std::mt19937 rng_{31};
  Vector in_ = gradcheck::Random(kSize, rng_, -2.0, 3.0);
  Vector weight_ = gradcheck::Random(kShape.C, rng_);
  Vector bias_ = gradcheck::Random(kShape.C, rng_);
  Vector dout_ = gradcheck::Random(kSize, rng_);

  template <typename Real>
  struct Result {
    std::vector<Real> out, din, dweight, dbias;
  };

  template <typename Real>
  Result<Real> Run() const {
    const auto in = gradcheck::Convert<Real>(in_), w = gradcheck::Convert<Real>(weight_),
               b = gradcheck::Convert<Real>(bias_), dout = gradcheck::Convert<Real>(dout_);
    std::vector<Real> xhat(kSize), mean(kShape.B * kShape.G), rstd(mean.size()), dxhat(kSize);
    Result<Real> r{std::vector<Real>(kSize), std::vector<Real>(kSize), std::vector<Real>(kShape.C),
                   std::vector<Real>(kShape.C)};
    GroupNormForward(r.out.data(), xhat.data(), mean.data(), rstd.data(), in.data(), w.data(),
                     b.data(), kShape, Real(kEps));
    GroupNormBackward(r.din.data(), r.dweight.data(), r.dbias.data(), dxhat.data(), dout.data(),
                      in.data(), xhat.data(), mean.data(), rstd.data(), w.data(), kShape);
    return r;
  }

  gradcheck::ForwardFn forward_ = [this](Vector& out) {
    Vector xhat(kSize), mean(kShape.B * kShape.G), rstd(mean.size());
    GroupNormForward(out.data(), xhat.data(), mean.data(), rstd.data(), in_.data(), weight_.data(),
                     bias_.data(), kShape, kEps);
  };
};

TEST_F(GroupNormTest, ForwardMatchesFormula) {
  const int per_group = kShape.C / kShape.G * kShape.HW;
  Vector expected(kSize);
  for (int g = 0; g < kShape.B * kShape.G; ++g) {
    const double* x = in_.data() + size_t(g) * per_group;
    double mean = 0, var = 0;
    for (int k = 0; k < per_group; ++k)
      mean += x[k] / per_group;
    for (int k = 0; k < per_group; ++k)
      var += (x[k] - mean) * (x[k] - mean) / per_group;
    for (int k = 0; k < per_group; ++k) {
      const int c = g % kShape.G * (kShape.C / kShape.G) + k / kShape.HW;
      expected[size_t(g) * per_group + k] =
          (x[k] - mean) / std::sqrt(var + kEps) * weight_[c] + bias_[c];
    }
  }
  EXPECT_TRUE(gradcheck::Near(Run<double>().out, expected, 1e-13));
}

TEST_F(GroupNormTest, GradientsMatchFiniteDifferences) {
  const Result<double> r = Run<double>();
  EXPECT_TRUE(gradcheck::GradientMatches(in_, r.din, dout_, forward_)) << "din";
  EXPECT_TRUE(gradcheck::GradientMatches(weight_, r.dweight, dout_, forward_)) << "dweight";
  EXPECT_TRUE(gradcheck::GradientMatches(bias_, r.dbias, dout_, forward_)) << "dbias";
}

TEST_F(GroupNormTest, BackwardAddsIntoGradients) {
  const Result<double> r = Run<double>();
  Vector xhat(kSize), mean(kShape.B * kShape.G), rstd(mean.size()), out(kSize), dxhat(kSize);
  GroupNormForward(out.data(), xhat.data(), mean.data(), rstd.data(), in_.data(), weight_.data(),
                   bias_.data(), kShape, kEps);
  Vector din(kSize), dweight(kShape.C), dbias(kShape.C);
  EXPECT_TRUE(
      gradcheck::Accumulates({{"din", &din}, {"dweight", &dweight}, {"dbias", &dbias}}, [&] {
        GroupNormBackward(din.data(), dweight.data(), dbias.data(), dxhat.data(), dout_.data(),
                          in_.data(), xhat.data(), mean.data(), rstd.data(), weight_.data(),
                          kShape);
      }));
}

TEST_F(GroupNormTest, FloatMatchesDouble) {
  const Result<float> f = Run<float>();
  const Result<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.din, d.din, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.dweight, d.dweight, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.dbias, d.dbias, 1e-5));
}

// LayerNorm with affine weights (the UNet's transformer norms): LayerNorm over rows of C, then
// the affine map with outer = rows, inner = 1; its gradients through both ops.
TEST(LayerNormAffine, GradientsMatchFiniteDifferences) {
  constexpr int N = 6, C = 8;
  std::mt19937 rng(5);
  Vector in = gradcheck::Random(N * C, rng, -1.0, 2.0), w = gradcheck::Random(C, rng),
         b = gradcheck::Random(C, rng), dout = gradcheck::Random(N * C, rng);
  Vector xhat(N * C), mean(N), rstd(N);
  const auto forward = [&](Vector& out) {
    LayerNormForward(xhat.data(), mean.data(), rstd.data(), in.data(), N, C, 1e-5);
    ChannelAffineForward(out.data(), xhat.data(), w.data(), b.data(), N, C, 1);
  };
  Vector out(N * C), dxhat(N * C), din(N * C), dw(C), db(C);
  forward(out);
  ChannelAffineBackward(dxhat.data(), dw.data(), db.data(), dout.data(), xhat.data(), w.data(), N,
                        C, 1);
  LayerNormBackward(din.data(), dxhat.data(), in.data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(gradcheck::GradientMatches(in, din, dout, forward)) << "din";
  EXPECT_TRUE(gradcheck::GradientMatches(w, dw, dout, forward)) << "dweight";
  EXPECT_TRUE(gradcheck::GradientMatches(b, db, dout, forward)) << "dbias";
}

}  // namespace
}  // namespace difftrain::cpu
