// GELU (tanh approximation) and SiLU: forward against the formula, din against central
// differences, the += contract, and the float instantiation against the double one. One
// parameterised suite serves both activations.
#include "model/cpu/activation.h"

#include <cmath>
#include <numbers>
#include <ostream>
#include <random>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

template <typename Real>
struct ActivationOps {
  void (*forward)(Real* out, const Real* in, size_t n);
  void (*backward)(Real* din, const Real* dout, const Real* in, size_t n);
};

struct Activation {
  const char* name;
  double (*formula)(double x);
  ActivationOps<float> f32;
  ActivationOps<double> f64;

  template <typename Real>
  const ActivationOps<Real>& Ops() const {
    if constexpr (std::is_same_v<Real, float>) {
      return f32;
    } else {
      return f64;
    }
  }
};

// gtest names each case and prints its parameter by this.
void PrintTo(const Activation& activation, std::ostream* os) {
  *os << activation.name;
}

double GeluFormula(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

double SiluFormula(double x) {
  return x / (1.0 + std::exp(-x));
}

const Activation kGelu{"Gelu",
                       GeluFormula,
                       {GeluForward<float>, GeluBackward<float>},
                       {GeluForward<double>, GeluBackward<double>}};
const Activation kSilu{"Silu",
                       SiluFormula,
                       {SiluForward<float>, SiluBackward<float>},
                       {SiluForward<double>, SiluBackward<double>}};

// An odd count, so that vectorised loops have a remainder; values reach into both tails.
constexpr size_t kN = 77;

template <typename Real>
struct ActivationResult {
  std::vector<Real> out, din;
};

class ActivationTest : public ::testing::TestWithParam<Activation> {
 protected:
  // Forward, then backward from dout = w_ into a zeroed din, in precision Real.
  template <typename Real>
  ActivationResult<Real> Run() const {
    const ActivationOps<Real>& ops = GetParam().Ops<Real>();
    const auto in = gradcheck::Convert<Real>(in_), dout = gradcheck::Convert<Real>(w_);
    ActivationResult<Real> r{std::vector<Real>(kN), std::vector<Real>(kN)};
    ops.forward(r.out.data(), in.data(), kN);
    ops.backward(r.din.data(), dout.data(), in.data(), kN);
    return r;
  }

  void Forward(Vector& out) const { GetParam().Ops<double>().forward(out.data(), in_.data(), kN); }

  std::mt19937 rng_{303};
  Vector in_ = gradcheck::Random(kN, rng_, -6.0, 6.0);
  Vector w_ = gradcheck::Random(kN, rng_);  // the loss weights, fed to backward as dout
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_P(ActivationTest, ForwardMatchesFormula) {
  Vector expected(kN);
  for (size_t i = 0; i < kN; ++i)
    expected[i] = GetParam().formula(in_[i]);
  EXPECT_TRUE(gradcheck::Near(Run<double>().out, expected, 1e-14));
}

TEST_P(ActivationTest, GradientMatchesFiniteDifferences) {
  EXPECT_TRUE(gradcheck::GradientMatches(in_, Run<double>().din, w_, forward_));
}

TEST_P(ActivationTest, BackwardAddsIntoGradient) {
  Vector din(kN);
  EXPECT_TRUE(gradcheck::Accumulates({{"din", &din}}, [&] {
    GetParam().Ops<double>().backward(din.data(), w_.data(), in_.data(), kN);
  }));
}

TEST_P(ActivationTest, FloatMatchesDouble) {
  const ActivationResult<float> f = Run<float>();
  const ActivationResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.din, d.din, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Cpu, ActivationTest, ::testing::Values(kGelu, kSilu),
                         ::testing::PrintToStringParamName());

// GEGLU over rows (x, gate) of 2F: out = x · GELU_erf(gate), both halves' gradients, the +=
// contract, float against double.
TEST(Geglu, ForwardGradientAccumulationAndFloat) {
  constexpr size_t N = 3, F = 7;
  std::mt19937 rng(404);
  Vector in = gradcheck::Random(N * 2 * F, rng, -4.0, 4.0), dout = gradcheck::Random(N * F, rng);
  Vector out(N * F), expected(N * F), din(N * 2 * F);
  GegluForward(out.data(), in.data(), N, F);
  for (size_t n = 0; n < N; ++n)
    for (size_t f = 0; f < F; ++f) {
      const double g = in[n * 2 * F + F + f];
      expected[n * F + f] = in[n * 2 * F + f] * 0.5 * g * std::erfc(-g / std::sqrt(2.0));
    }
  EXPECT_TRUE(gradcheck::Near(out, expected, 1e-14));
  GegluBackward(din.data(), dout.data(), in.data(), N, F);
  EXPECT_TRUE(gradcheck::GradientMatches(
      in, din, dout, [&](Vector& o) { GegluForward(o.data(), in.data(), N, F); }));
  EXPECT_TRUE(gradcheck::Accumulates(
      {{"din", &din}}, [&] { GegluBackward(din.data(), dout.data(), in.data(), N, F); }));
  const auto in_f = gradcheck::Convert<float>(in), dout_f = gradcheck::Convert<float>(dout);
  std::vector<float> out_f(N * F), din_f(N * 2 * F);
  Vector din_d(N * 2 * F);
  GegluForward(out_f.data(), in_f.data(), N, F);
  GegluBackward(din_f.data(), dout_f.data(), in_f.data(), N, F);
  GegluBackward(din_d.data(), dout.data(), in.data(), N, F);
  EXPECT_TRUE(gradcheck::Near(out_f, out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(din_f, din_d, 1e-5));
}

}  // namespace
}  // namespace difftrain::cpu
