// Modulate and GatedResidual with shift, scale and gate read from inside an adaLN output buffer
// at the model's strides: forward against the formula, every gradient against central
// differences, the += contract, a null dx, and the float instantiation against the double one.
#include "model/cpu/modulate.h"

#include <ostream>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

constexpr int B = 2, T = 5, D = 12;
constexpr size_t kTokens = static_cast<size_t>(B) * T * D;

// Where shift, scale and gate sit inside the adaLN output [B, chunks·D], in units of D.
struct AdaLayout {
  const char* name;
  int chunks, shift, scale, gate;
};

// gtest names each case and prints its parameter by this.
void PrintTo(const AdaLayout& layout, std::ostream* os) {
  *os << layout.name;
}

// A block's MLP branch (shift_mlp, scale_mlp, gate_mlp: chunks 3, 4, 5 of six) and the final
// layer (shift, scale: two chunks). The final layer has no gate; its gated-residual cases read
// the gate from chunk 1 to run the op at stride 2·D.
constexpr AdaLayout kBlockMlp{"BlockMlp", 6, 3, 4, 5};
constexpr AdaLayout kFinalLayer{"FinalLayer", 2, 0, 1, 1};

template <typename Real>
struct ModulateResult {
  std::vector<Real> out, dx, dada;
};

template <typename Real>
struct GatedResidualResult {
  std::vector<Real> out, dx, dy, dada;
};

class AdaLNTest : public ::testing::TestWithParam<AdaLayout> {
 protected:
  int Stride() const { return GetParam().chunks * D; }

  // The start of a chunk of the adaLN buffer (or of its gradient) for sample 0.
  template <typename Real>
  static Real* Chunk(std::vector<Real>& ada, int chunk) {
    return ada.data() + static_cast<size_t>(chunk) * D;
  }
  template <typename Real>
  static const Real* Chunk(const std::vector<Real>& ada, int chunk) {
    return ada.data() + static_cast<size_t>(chunk) * D;
  }

  // Forward, then backward from dout = w_ into zeroed gradients, in precision Real.
  template <typename Real>
  ModulateResult<Real> RunModulate() const {
    const AdaLayout& at = GetParam();
    const auto x = gradcheck::Convert<Real>(x_), ada = gradcheck::Convert<Real>(ada_),
               dout = gradcheck::Convert<Real>(w_);
    ModulateResult<Real> r{std::vector<Real>(kTokens), std::vector<Real>(kTokens),
                           std::vector<Real>(ada.size())};
    ModulateForward(r.out.data(), x.data(), Chunk(ada, at.shift), Chunk(ada, at.scale), Stride(), B,
                    T, D);
    ModulateBackward(r.dx.data(), Chunk(r.dada, at.shift), Chunk(r.dada, at.scale), dout.data(),
                     x.data(), Chunk(ada, at.scale), Stride(), B, T, D);
    return r;
  }

  template <typename Real>
  GatedResidualResult<Real> RunGatedResidual() const {
    const AdaLayout& at = GetParam();
    const auto x = gradcheck::Convert<Real>(x_), y = gradcheck::Convert<Real>(y_),
               ada = gradcheck::Convert<Real>(ada_), dout = gradcheck::Convert<Real>(w_);
    GatedResidualResult<Real> r{std::vector<Real>(kTokens), std::vector<Real>(kTokens),
                                std::vector<Real>(kTokens), std::vector<Real>(ada.size())};
    GatedResidualForward(r.out.data(), x.data(), y.data(), Chunk(ada, at.gate), Stride(), B, T, D);
    GatedResidualBackward(r.dx.data(), r.dy.data(), Chunk(r.dada, at.gate), dout.data(), y.data(),
                          Chunk(ada, at.gate), Stride(), B, T, D);
    return r;
  }

  // ada_[b, chunk, d], indexed as the model's adaLN output is.
  double Ada(int b, int chunk, int d) const {
    return ada_[static_cast<size_t>(b) * Stride() + static_cast<size_t>(chunk) * D + d];
  }

  std::mt19937 rng_{404};
  Vector x_ = gradcheck::Random(kTokens, rng_);
  Vector y_ = gradcheck::Random(kTokens, rng_);
  Vector ada_ = gradcheck::Random(static_cast<size_t>(B) * GetParam().chunks * D, rng_);
  Vector w_ = gradcheck::Random(kTokens, rng_);  // the loss weights, fed to backward as dout
  gradcheck::ForwardFn modulate_ = [this](Vector& out) {
    ModulateForward(out.data(), x_.data(), Chunk(ada_, GetParam().shift),
                    Chunk(ada_, GetParam().scale), Stride(), B, T, D);
  };
  gradcheck::ForwardFn gated_residual_ = [this](Vector& out) {
    GatedResidualForward(out.data(), x_.data(), y_.data(), Chunk(ada_, GetParam().gate), Stride(),
                         B, T, D);
  };
};

TEST_P(AdaLNTest, ForwardsMatchFormulas) {
  const AdaLayout& at = GetParam();
  Vector modulated(kTokens), residual(kTokens);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int d = 0; d < D; ++d) {
        const size_t i = (static_cast<size_t>(b) * T + t) * D + d;
        modulated[i] = x_[i] * (1 + Ada(b, at.scale, d)) + Ada(b, at.shift, d);
        residual[i] = x_[i] + Ada(b, at.gate, d) * y_[i];
      }
    }
  }
  EXPECT_TRUE(gradcheck::Near(RunModulate<double>().out, modulated, 1e-14));
  EXPECT_TRUE(gradcheck::Near(RunGatedResidual<double>().out, residual, 1e-14));
}

// The adaLN buffer is checked whole: dshift and dscale land in their chunks, and the other
// chunks, which the op does not read, must get no gradient.
TEST_P(AdaLNTest, ModulateGradientsMatchFiniteDifferences) {
  const ModulateResult<double> r = RunModulate<double>();
  EXPECT_TRUE(gradcheck::GradientMatches(x_, r.dx, w_, modulate_));
  EXPECT_TRUE(gradcheck::GradientMatches(ada_, r.dada, w_, modulate_));
}

TEST_P(AdaLNTest, GatedResidualGradientsMatchFiniteDifferences) {
  const GatedResidualResult<double> r = RunGatedResidual<double>();
  EXPECT_TRUE(gradcheck::GradientMatches(x_, r.dx, w_, gated_residual_));
  EXPECT_TRUE(gradcheck::GradientMatches(y_, r.dy, w_, gated_residual_));
  EXPECT_TRUE(gradcheck::GradientMatches(ada_, r.dada, w_, gated_residual_));
}

// In the model the residual stream's gradient is dout itself and passes through unchanged:
// with dx null, backward must leave it as it is and still produce dy and dgate.
TEST_P(AdaLNTest, GatedResidualNullDxLeavesResidualGradientAlone) {
  const AdaLayout& at = GetParam();
  const GatedResidualResult<double> with_dx = RunGatedResidual<double>();
  const Vector residual_gradient = w_;
  Vector dy(kTokens), dada(ada_.size());
  GatedResidualBackward<double>(nullptr, dy.data(), Chunk(dada, at.gate), residual_gradient.data(),
                                y_.data(), Chunk(ada_, at.gate), Stride(), B, T, D);
  EXPECT_EQ(residual_gradient, w_);
  EXPECT_TRUE(gradcheck::Near(dy, with_dx.dy, 0.0));
  EXPECT_TRUE(gradcheck::Near(dada, with_dx.dada, 0.0));
}

TEST_P(AdaLNTest, ModulateBackwardAddsIntoGradients) {
  const AdaLayout& at = GetParam();
  Vector dx(kTokens), dada(ada_.size());
  EXPECT_TRUE(gradcheck::Accumulates({{"dx", &dx}, {"dada", &dada}}, [&] {
    ModulateBackward(dx.data(), Chunk(dada, at.shift), Chunk(dada, at.scale), w_.data(), x_.data(),
                     Chunk(ada_, at.scale), Stride(), B, T, D);
  }));
}

TEST_P(AdaLNTest, GatedResidualBackwardAddsIntoGradients) {
  const AdaLayout& at = GetParam();
  Vector dx(kTokens), dy(kTokens), dada(ada_.size());
  EXPECT_TRUE(gradcheck::Accumulates({{"dx", &dx}, {"dy", &dy}, {"dada", &dada}}, [&] {
    GatedResidualBackward(dx.data(), dy.data(), Chunk(dada, at.gate), w_.data(), y_.data(),
                          Chunk(ada_, at.gate), Stride(), B, T, D);
  }));
}

TEST_P(AdaLNTest, FloatMatchesDouble) {
  const ModulateResult<float> mf = RunModulate<float>();
  const ModulateResult<double> md = RunModulate<double>();
  EXPECT_TRUE(gradcheck::Near(mf.out, md.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(mf.dx, md.dx, 1e-5));
  EXPECT_TRUE(gradcheck::Near(mf.dada, md.dada, 1e-5));
  const GatedResidualResult<float> gf = RunGatedResidual<float>();
  const GatedResidualResult<double> gd = RunGatedResidual<double>();
  EXPECT_TRUE(gradcheck::Near(gf.out, gd.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(gf.dx, gd.dx, 1e-5));
  EXPECT_TRUE(gradcheck::Near(gf.dy, gd.dy, 1e-5));
  EXPECT_TRUE(gradcheck::Near(gf.dada, gd.dada, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Cpu, AdaLNTest, ::testing::Values(kBlockMlp, kFinalLayer),
                         ::testing::PrintToStringParamName());

}  // namespace
}  // namespace difftrain::cpu
