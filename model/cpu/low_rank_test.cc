// The low-rank weight update: forward against a triple loop, ∂A and ∂B against central
// differences of L = Σ dout ⊙ W(A, B), the += contract, and the float instantiation against the
// double one; DoRA's magnitude and direction the same way, its row norms held constant.
#include "model/cpu/low_rank.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

constexpr int kOut = 9, kRank = 3, kIn = 14;  // a convolution's in·kh·kw is just a longer row
constexpr double kScale = 0.75;

class LowRankTest : public ::testing::Test {
 protected:
  void Forward(Vector& w) const {
    LowRankForward(w.data(), w0_.data(), a_.data(), b_.data(), kOut, kRank, kIn, kScale);
  }

  std::mt19937 rng_{17};
  Vector w0_ = gradcheck::Random(kOut * kIn, rng_);
  Vector a_ = gradcheck::Random(kRank * kIn, rng_);
  Vector b_ = gradcheck::Random(kOut * kRank, rng_);
  Vector dout_ = gradcheck::Random(kOut * kIn, rng_);
};

TEST_F(LowRankTest, ForwardIsTheFrozenWeightPlusTheScaledProduct) {
  Vector w(kOut * kIn);
  Forward(w);
  Vector expected(kOut * kIn);
  for (int o = 0; o < kOut; ++o) {
    for (int i = 0; i < kIn; ++i) {
      double sum = 0;
      for (int r = 0; r < kRank; ++r)
        sum += b_[o * kRank + r] * a_[r * kIn + i];
      expected[o * kIn + i] = w0_[o * kIn + i] + kScale * sum;
    }
  }
  EXPECT_TRUE(gradcheck::Near(w, expected, 1e-15));
  // In place: w0 is the output arena.
  Vector in_place = w0_;
  LowRankForward(in_place.data(), in_place.data(), a_.data(), b_.data(), kOut, kRank, kIn, kScale);
  EXPECT_EQ(in_place, w);
}

TEST_F(LowRankTest, GradientsMatchCentralDifferences) {
  Vector da(a_.size()), db(b_.size());
  LowRankBackward(da.data(), db.data(), dout_.data(), a_.data(), b_.data(), kOut, kRank, kIn,
                  kScale);
  const auto forward = [this](Vector& w) { Forward(w); };
  EXPECT_TRUE(gradcheck::GradientMatches(a_, da, dout_, forward)) << "A";
  EXPECT_TRUE(gradcheck::GradientMatches(b_, db, dout_, forward)) << "B";
  // A zero B (peft's initialisation) gives A no gradient, but B one.
  std::fill(b_.begin(), b_.end(), 0.0);
  std::fill(da.begin(), da.end(), 0.0);
  std::fill(db.begin(), db.end(), 0.0);
  LowRankBackward(da.data(), db.data(), dout_.data(), a_.data(), b_.data(), kOut, kRank, kIn,
                  kScale);
  EXPECT_EQ(da, Vector(a_.size(), 0.0));
  EXPECT_TRUE(gradcheck::GradientMatches(b_, db, dout_, forward)) << "B at B = 0";
}

TEST_F(LowRankTest, BackwardAddsIntoItsGradients) {
  Vector da(a_.size()), db(b_.size());
  EXPECT_TRUE(gradcheck::Accumulates({{"da", &da}, {"db", &db}}, [&] {
    LowRankBackward(da.data(), db.data(), dout_.data(), a_.data(), b_.data(), kOut, kRank, kIn,
                    kScale);
  }));
}

TEST_F(LowRankTest, FloatAgreesWithDouble) {
  using gradcheck::Convert;
  const auto w0 = Convert<float>(w0_), a = Convert<float>(a_), b = Convert<float>(b_),
             dout = Convert<float>(dout_);
  std::vector<float> w(w0.size()), da(a.size()), db(b.size());
  LowRankForward(w.data(), w0.data(), a.data(), b.data(), kOut, kRank, kIn, float(kScale));
  LowRankBackward(da.data(), db.data(), dout.data(), a.data(), b.data(), kOut, kRank, kIn,
                  float(kScale));
  Vector w_ref(w0_.size()), da_ref(a_.size()), db_ref(b_.size());
  Forward(w_ref);
  LowRankBackward(da_ref.data(), db_ref.data(), dout_.data(), a_.data(), b_.data(), kOut, kRank,
                  kIn, kScale);
  EXPECT_TRUE(gradcheck::Near(w, w_ref, 1e-6));
  EXPECT_TRUE(gradcheck::Near(da, da_ref, 1e-6));
  EXPECT_TRUE(gradcheck::Near(db, db_ref, 1e-6));
}

// DoRA: W = (m / n) ⊙ (W0 + s·B·A), n the rows' norms at the point, held constant in the
// backward (peft's detach): its gradients are central differences of that function, n fixed.
class DoraTest : public LowRankTest {
 protected:
  DoraTest() {
    for (int o = 0; o < kOut; ++o)
      magnitude_[o] = 0.5 + 0.1 * o;
    DoraNorms(norms_.data(), w0_.data(), a_.data(), b_.data(), kOut, kRank, kIn, kScale);
  }
  void DoraForwardAt(Vector& w) const {
    DoraForward(w.data(), w0_.data(), a_.data(), b_.data(), magnitude_.data(), kOut, kRank, kIn,
                kScale, norms_.data());
  }
  void Backward(Vector& da, Vector& db, Vector& dm) {
    DoraBackward(da.data(), db.data(), dm.data(), dout_.data(), w0_.data(), a_.data(), b_.data(),
                 magnitude_.data(), kOut, kRank, kIn, kScale);
  }
  Vector magnitude_ = Vector(kOut), norms_ = Vector(kOut);
};

TEST_F(DoraTest, ForwardScalesEachRowOfTheLowRankWeightToItsMagnitude) {
  Vector w(kOut * kIn), v(kOut * kIn);
  DoraForwardAt(w);
  Forward(v);
  for (int o = 0; o < kOut; ++o) {
    double norm = 0;
    for (int i = 0; i < kIn; ++i)
      norm += v[o * kIn + i] * v[o * kIn + i];
    EXPECT_NEAR(norms_[o], std::sqrt(norm), 1e-14);
    double row = 0;
    for (int i = 0; i < kIn; ++i) {
      EXPECT_NEAR(w[o * kIn + i], magnitude_[o] / std::sqrt(norm) * v[o * kIn + i], 1e-14);
      row += w[o * kIn + i] * w[o * kIn + i];
    }
    EXPECT_NEAR(std::sqrt(row), magnitude_[o], 1e-14) << "row " << o << " has its magnitude";
  }
  // peft's initialisation, m = ‖W0‖ with B = 0, leaves W0 as it is.
  std::fill(b_.begin(), b_.end(), 0.0);
  DoraNorms(norms_.data(), w0_.data(), a_.data(), b_.data(), kOut, kRank, kIn, kScale);
  magnitude_ = norms_;
  DoraForwardAt(w);
  EXPECT_TRUE(gradcheck::Near(w, w0_, 1e-15));
}

TEST_F(DoraTest, GradientsMatchCentralDifferencesWithTheNormsHeld) {
  Vector da(a_.size()), db(b_.size()), dm(kOut);
  Backward(da, db, dm);
  const auto forward = [this](Vector& w) { DoraForwardAt(w); };
  EXPECT_TRUE(gradcheck::GradientMatches(a_, da, dout_, forward)) << "A";
  EXPECT_TRUE(gradcheck::GradientMatches(b_, db, dout_, forward)) << "B";
  EXPECT_TRUE(gradcheck::GradientMatches(magnitude_, dm, dout_, forward)) << "magnitude";
  // Not the gradient with the norms recomputed: that one differs (the check can fail).
  const auto recomputed = [this](Vector& w) {
    DoraForward(w.data(), w0_.data(), a_.data(), b_.data(), magnitude_.data(), kOut, kRank, kIn,
                kScale);
  };
  EXPECT_FALSE(gradcheck::GradientMatches(b_, db, dout_, recomputed));
}

TEST_F(DoraTest, AZeroRowIsZeroAndGetsNoGradient) {
  std::fill(w0_.begin(), w0_.begin() + kIn, 0.0);
  std::fill(b_.begin(), b_.begin() + kRank, 0.0);  // row 0 of B·A is zero too
  Vector w(kOut * kIn);
  DoraNorms(norms_.data(), w0_.data(), a_.data(), b_.data(), kOut, kRank, kIn, kScale);
  EXPECT_EQ(norms_[0], 0.0);
  DoraForwardAt(w);
  EXPECT_EQ(Vector(w.begin(), w.begin() + kIn), Vector(kIn, 0.0));
  Vector da(a_.size()), db(b_.size()), dm(kOut);
  Backward(da, db, dm);
  EXPECT_EQ(dm[0], 0.0);
  EXPECT_EQ(Vector(db.begin(), db.begin() + kRank), Vector(kRank, 0.0));
  for (double x : da)
    EXPECT_TRUE(std::isfinite(x));
}

TEST_F(DoraTest, FloatAgreesWithDouble) {
  using gradcheck::Convert;
  const auto w0 = Convert<float>(w0_), a = Convert<float>(a_), b = Convert<float>(b_),
             dout = Convert<float>(dout_), m = Convert<float>(magnitude_);
  std::vector<float> w(w0.size()), da(a.size()), db(b.size()), dm(kOut);
  DoraForward(w.data(), w0.data(), a.data(), b.data(), m.data(), kOut, kRank, kIn, float(kScale));
  DoraBackward(da.data(), db.data(), dm.data(), dout.data(), w0.data(), a.data(), b.data(),
               m.data(), kOut, kRank, kIn, float(kScale));
  Vector w_ref(w0_.size()), da_ref(a_.size()), db_ref(b_.size()), dm_ref(kOut);
  DoraForwardAt(w_ref);
  Backward(da_ref, db_ref, dm_ref);
  EXPECT_TRUE(gradcheck::Near(w, w_ref, 1e-6));
  EXPECT_TRUE(gradcheck::Near(da, da_ref, 1e-6));
  EXPECT_TRUE(gradcheck::Near(db, db_ref, 1e-6));
  EXPECT_TRUE(gradcheck::Near(dm, dm_ref, 1e-6));
}

TEST_F(DoraTest, BackwardAddsIntoItsGradients) {
  Vector da(a_.size()), db(b_.size()), dm(kOut);
  EXPECT_TRUE(gradcheck::Accumulates({{"da", &da}, {"db", &db}, {"dm", &dm}},
                                     [&] { Backward(da, db, dm); }));
}

}  // namespace
}  // namespace difftrain::cpu
