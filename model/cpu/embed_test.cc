// The DiT's reshapes and fixed embeddings: Patchify against a Conv2d patch embed, Unpatchify
// against DiT's reshape + einsum and its backward as the adjoint, the sin-cos position embedding
// and the timestep frequencies against their formulas, the label embedding's gradient (shared
// labels accumulate), the += contracts, and the float instantiations against the double ones.
#include "model/cpu/embed.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

// A non-square image: a 3 × 5 grid of 2 × 2 patches.
constexpr int B = 2, C = 3, H = 6, W = 10, P = 2;
constexpr int kGridH = H / P, kGridW = W / P, kTokens = kGridH * kGridW, kFeatures = C * P * P;
constexpr size_t kImage = static_cast<size_t>(B) * C * H * W;
constexpr size_t kPatches = static_cast<size_t>(B) * kTokens * kFeatures;

template <typename Real>
struct PatchResult {
  std::vector<Real> patches, unpatched, dtokens;
};

class PatchTest : public ::testing::Test {
 protected:
  // Patchify img_, Unpatchify tokens_ and its backward from dimg = dimg_, in precision Real.
  template <typename Real>
  PatchResult<Real> Run() const {
    const auto img = gradcheck::Convert<Real>(img_), tokens = gradcheck::Convert<Real>(tokens_),
               dimg = gradcheck::Convert<Real>(dimg_);
    PatchResult<Real> r{std::vector<Real>(kPatches), std::vector<Real>(kImage),
                        std::vector<Real>(kPatches)};
    Patchify(r.patches.data(), img.data(), B, C, H, W, P);
    UnpatchifyForward(r.unpatched.data(), tokens.data(), B, C, H, W, P);
    UnpatchifyBackward(r.dtokens.data(), dimg.data(), B, C, H, W, P);
    return r;
  }

  double Img(int b, int c, int y, int x) const {
    return img_[((static_cast<size_t>(b) * C + c) * H + y) * W + x];
  }

  std::mt19937 rng_{606};
  Vector img_ = gradcheck::Random(kImage, rng_);
  Vector tokens_ = gradcheck::Random(kPatches, rng_);
  Vector dimg_ = gradcheck::Random(kImage, rng_);
};

// A Conv2d with kernel and stride P and weight [D, C, P, P] must equal a Linear over the patch
// features with that weight flattened to [D, C·P·P], token t = i·(W/P) + j holding output
// pixel (i, j) (timm's PatchEmbed: conv, then flatten(2).transpose(1, 2)).
TEST_F(PatchTest, PatchifyIsConv2dOrder) {
  constexpr int kOut = 7;
  const Vector weight = gradcheck::Random(static_cast<size_t>(kOut) * kFeatures, rng_);
  const auto conv_weight = [&](int d, int c, int ki, int kj) {
    return weight[((static_cast<size_t>(d) * C + c) * P + ki) * P + kj];
  };
  const Vector patches = Run<double>().patches;
  Vector conv, linear;
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < kGridH; ++i) {
      for (int j = 0; j < kGridW; ++j) {
        const int t = i * kGridW + j;
        for (int d = 0; d < kOut; ++d) {
          double by_conv = 0, by_linear = 0;
          for (int c = 0; c < C; ++c) {
            for (int ki = 0; ki < P; ++ki) {
              for (int kj = 0; kj < P; ++kj)
                by_conv += conv_weight(d, c, ki, kj) * Img(b, c, i * P + ki, j * P + kj);
            }
          }
          for (int f = 0; f < kFeatures; ++f) {
            by_linear += patches[(static_cast<size_t>(b) * kTokens + t) * kFeatures + f] *
                         weight[static_cast<size_t>(d) * kFeatures + f];
          }
          conv.push_back(by_conv);
          linear.push_back(by_linear);
        }
      }
    }
  }
  EXPECT_TRUE(gradcheck::Near(linear, conv, 1e-13));
}

// DiT: x.reshape(N, h, w, p, p, c); einsum("nhwpqc->nchpwq"); reshape(N, c, h·p, w·p).
TEST_F(PatchTest, UnpatchifyMatchesDiTReshape) {
  Vector img(kImage);
  size_t k = 0;  // tokens_ read in memory order is the reshape to [N, h, w, p, p, c]
  for (int n = 0; n < B; ++n) {
    for (int i = 0; i < kGridH; ++i) {
      for (int j = 0; j < kGridW; ++j) {
        for (int pi = 0; pi < P; ++pi) {
          for (int q = 0; q < P; ++q) {
            for (int c = 0; c < C; ++c)
              img[((static_cast<size_t>(n) * C + c) * H + i * P + pi) * W + j * P + q] =
                  tokens_[k++];
          }
        }
      }
    }
  }
  EXPECT_TRUE(gradcheck::Near(Run<double>().unpatched, img, 0.0));
}

// <Unpatchify(a), b> == <a, UnpatchifyBackward(b)> for all a and b.
TEST_F(PatchTest, UnpatchifyBackwardIsAdjoint) {
  const PatchResult<double> r = Run<double>();
  double image_side = 0, token_side = 0;
  for (size_t i = 0; i < kImage; ++i)
    image_side += r.unpatched[i] * dimg_[i];
  for (size_t i = 0; i < kPatches; ++i)
    token_side += tokens_[i] * r.dtokens[i];
  EXPECT_NEAR(image_side, token_side, 1e-12);
}

TEST_F(PatchTest, UnpatchifyBackwardAddsIntoGradient) {
  Vector dtokens(kPatches);
  EXPECT_TRUE(gradcheck::Accumulates({{"dtokens", &dtokens}}, [&] {
    UnpatchifyBackward(dtokens.data(), dimg_.data(), B, C, H, W, P);
  }));
}

TEST_F(PatchTest, FloatMatchesDouble) {
  const PatchResult<float> f = Run<float>();
  const PatchResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.patches, d.patches, 1e-7));
  EXPECT_TRUE(gradcheck::Near(f.unpatched, d.unpatched, 1e-7));
  EXPECT_TRUE(gradcheck::Near(f.dtokens, d.dtokens, 1e-7));
}

// MAE: for a grid position (row i, column j), features [0, D/2) encode j and [D/2, D) encode i,
// each half as [sin(pos·ω_k) for k < D/4, cos(pos·ω_k) for k < D/4], ω_k = 10000^(−k/(D/4)).
TEST(SinCos2DPositionEmbedding, MatchesMaeFormula) {
  constexpr int kGrid = 5, kDim = 24, kQuarter = kDim / 4;
  std::vector<float> table(static_cast<size_t>(kGrid) * kGrid * kDim);
  SinCos2DPositionEmbedding(table.data(), kGrid, kDim);
  const auto at = [&](int i, int j, int feature) {
    return table[(static_cast<size_t>(i) * kGrid + j) * kDim + feature];
  };
  for (int i = 0; i < kGrid; ++i) {
    for (int j = 0; j < kGrid; ++j) {
      for (int k = 0; k < kQuarter; ++k) {
        const double omega = std::pow(10000.0, -static_cast<double>(k) / kQuarter);
        EXPECT_NEAR(at(i, j, k), std::sin(j * omega), 1e-7);
        EXPECT_NEAR(at(i, j, kQuarter + k), std::cos(j * omega), 1e-7);
        EXPECT_NEAR(at(i, j, 2 * kQuarter + k), std::sin(i * omega), 1e-7);
        EXPECT_NEAR(at(i, j, 3 * kQuarter + k), std::cos(i * omega), 1e-7);
      }
    }
  }
  // Spot checks that do not go through the formula: ω_0 = 1, so feature 0 is sin(j) and
  // feature D/2 is sin(i) at row 2, column 3.
  EXPECT_FLOAT_EQ(at(2, 3, 0), std::sin(3.0f));
  EXPECT_FLOAT_EQ(at(2, 3, kQuarter), std::cos(3.0f));
  EXPECT_FLOAT_EQ(at(2, 3, 2 * kQuarter), std::sin(2.0f));
  EXPECT_FLOAT_EQ(at(2, 3, 3 * kQuarter), std::cos(2.0f));
  EXPECT_FLOAT_EQ(at(0, 0, kQuarter + 1), 1.0f);
  EXPECT_FLOAT_EQ(at(0, 0, 1), 0.0f);
}

// Latte's temporal embedding: row f is [sin(f·ω_k) for k < D/2, cos(f·ω_k) for k < D/2],
// ω_k = 10000^(−k/(D/2)) ([sin, cos] order, unlike the timestep's [cos, sin]).
TEST(SinCos1DEmbedding, MatchesLatteFormula) {
  constexpr int kFrames = 6, kDim = 10, kHalf = kDim / 2;
  std::vector<float> table(static_cast<size_t>(kFrames) * kDim);
  SinCos1DEmbedding(table.data(), kFrames, kDim);
  for (int f = 0; f < kFrames; ++f) {
    for (int k = 0; k < kHalf; ++k) {
      const double omega = std::pow(10000.0, -static_cast<double>(k) / kHalf);
      EXPECT_NEAR(table[f * kDim + k], std::sin(f * omega), 1e-7);
      EXPECT_NEAR(table[f * kDim + kHalf + k], std::cos(f * omega), 1e-7);
    }
  }
  // Frame 0 is [0…, 1…]; frame 3's feature 0 is sin(3).
  EXPECT_FLOAT_EQ(table[0], 0.0f);
  EXPECT_FLOAT_EQ(table[kHalf], 1.0f);
  EXPECT_FLOAT_EQ(table[3 * kDim], std::sin(3.0f));
}

// DiT: [cos(t·f_k) for k < half, sin(t·f_k) for k < half], f_k = exp(−ln(10⁴)·k/half). The
// float instantiation computes in double and rounds once, so every value is within half a
// float ulp of 1 of the exact one, even at t = 999 where a float computation would be off by
// about 1e-4.
TEST(TimestepFrequencies, MatchFormulaAndRoundOnce) {
  constexpr int kDim = 256, kHalf = kDim / 2;
  const std::vector<double> t = {0.0, 1.5, 999.0};
  const int batch = static_cast<int>(t.size());
  Vector expected(t.size() * kDim);
  for (int b = 0; b < batch; ++b) {
    for (int k = 0; k < kHalf; ++k) {
      const double f = std::exp(-std::log(1e4) * k / kHalf);
      expected[static_cast<size_t>(b) * kDim + k] = std::cos(t[b] * f);
      expected[static_cast<size_t>(b) * kDim + kHalf + k] = std::sin(t[b] * f);
    }
  }
  Vector in_double(expected.size());
  TimestepFrequencies(in_double.data(), t.data(), batch, kDim);
  std::vector<float> in_float(expected.size());
  const std::vector<float> t_float = gradcheck::Convert<float>(t);
  TimestepFrequencies(in_float.data(), t_float.data(), batch, kDim);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(in_double[i], expected[i], 1e-12) << "element " << i;
    EXPECT_NEAR(in_float[i], expected[i], 6e-8) << "element " << i;
  }
  // f_0 = 1: the first cos and sin are those of t itself.
  EXPECT_DOUBLE_EQ(in_double[kDim + 0], std::cos(1.5));
  EXPECT_DOUBLE_EQ(in_double[kDim + kHalf], std::sin(1.5));
}

constexpr int kClasses = 5, kEmbedDim = 12;
// Samples 0 and 2 share label 3; label 2 and 4 are not used.
const std::vector<int32_t> kLabels = {3, 1, 3, 0};
const int kBatch = static_cast<int>(kLabels.size());

template <typename Real>
struct EmbeddingResult {
  std::vector<Real> out, dtable;
};

class EmbeddingTest : public ::testing::Test {
 protected:
  // Forward, then backward from dout = w_ into a zeroed dtable, in precision Real.
  template <typename Real>
  EmbeddingResult<Real> Run() const {
    const auto table = gradcheck::Convert<Real>(table_), dout = gradcheck::Convert<Real>(w_);
    EmbeddingResult<Real> r{std::vector<Real>(w_.size()), std::vector<Real>(table_.size())};
    EmbeddingForward(r.out.data(), table.data(), kLabels.data(), kBatch, kEmbedDim);
    EmbeddingBackward(r.dtable.data(), dout.data(), kLabels.data(), kBatch, kEmbedDim);
    return r;
  }

  void Forward(Vector& out) const {
    EmbeddingForward(out.data(), table_.data(), kLabels.data(), kBatch, kEmbedDim);
  }

  std::mt19937 rng_{707};
  Vector table_ = gradcheck::Random(static_cast<size_t>(kClasses) * kEmbedDim, rng_);
  Vector w_ = gradcheck::Random(static_cast<size_t>(kBatch) * kEmbedDim, rng_);
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_F(EmbeddingTest, ForwardCopiesRows) {
  const Vector out = Run<double>().out;
  for (int b = 0; b < kBatch; ++b) {
    for (int d = 0; d < kEmbedDim; ++d)
      EXPECT_EQ(out[b * kEmbedDim + d], table_[kLabels[b] * kEmbedDim + d]) << "sample " << b;
  }
}

TEST_F(EmbeddingTest, GradientMatchesFiniteDifferences) {
  EXPECT_TRUE(gradcheck::GradientMatches(table_, Run<double>().dtable, w_, forward_));
}

TEST_F(EmbeddingTest, SharedLabelAccumulates) {
  const Vector dtable = Run<double>().dtable;
  for (int d = 0; d < kEmbedDim; ++d) {
    EXPECT_DOUBLE_EQ(dtable[3 * kEmbedDim + d], w_[0 * kEmbedDim + d] + w_[2 * kEmbedDim + d]);
    EXPECT_EQ(dtable[2 * kEmbedDim + d], 0.0);
    EXPECT_EQ(dtable[4 * kEmbedDim + d], 0.0);
  }
}

TEST_F(EmbeddingTest, BackwardAddsIntoGradient) {
  Vector dtable(table_.size());
  EXPECT_TRUE(gradcheck::Accumulates({{"dtable", &dtable}}, [&] {
    EmbeddingBackward(dtable.data(), w_.data(), kLabels.data(), kBatch, kEmbedDim);
  }));
}

TEST_F(EmbeddingTest, FloatMatchesDouble) {
  const EmbeddingResult<float> f = Run<float>();
  const EmbeddingResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-7));
  EXPECT_TRUE(gradcheck::Near(f.dtable, d.dtable, 1e-7));
}

}  // namespace
}  // namespace difftrain::cpu
