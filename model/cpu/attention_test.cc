// Attention: forward (output and probabilities) against a naive softmax(Q·Kᵀ/√hd)·V per head,
// the q, k and v parts of dqkv against central differences, the += contract, and the float
// instantiation against the double one.
#include "model/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

constexpr int B = 2, T = 5, D = 12, H = 3, kHeadDim = D / H;
constexpr size_t kQkv = static_cast<size_t>(B) * T * 3 * D;
constexpr size_t kOut = static_cast<size_t>(B) * T * D;
constexpr size_t kProbs = static_cast<size_t>(B) * H * T * T;

// The parts of qkv, in the order they sit along its last dimension.
enum Part { kQ = 0, kK = 1, kV = 2 };

template <typename Real>
struct AttentionResult {
  std::vector<Real> out, probs, dqkv;
};

class AttentionTest : public ::testing::Test {
 protected:
  // Forward, then backward from dout = w_ into a zeroed dqkv, in precision Real.
  template <typename Real>
  AttentionResult<Real> Run() const {
    const auto qkv = gradcheck::Convert<Real>(qkv_), dout = gradcheck::Convert<Real>(w_);
    AttentionResult<Real> r{std::vector<Real>(kOut), std::vector<Real>(kProbs),
                            std::vector<Real>(kQkv)};
    AttentionForward(r.out.data(), r.probs.data(), qkv.data(), qkv.data(), B, T, T, D, H);
    AttentionBackward(r.dqkv.data(), r.dqkv.data(), dout.data(), qkv.data(), qkv.data(),
                      r.probs.data(), B, T, T, D, H);
    return r;
  }

  // Element d of head h of part (q, k or v) of token t of sample b.
  double Qkv(int b, int t, Part part, int h, int d) const {
    return qkv_[(static_cast<size_t>(b) * T + t) * 3 * D + part * D + h * kHeadDim + d];
  }

  // out and probs by the definition, one (sample, head, query) at a time.
  void Reference(Vector& out, Vector& probs) const {
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < T; ++i) {
          double scores[T], max = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int j = 0; j < T; ++j) {
            double dot = 0;
            for (int d = 0; d < kHeadDim; ++d)
              dot += Qkv(b, i, kQ, h, d) * Qkv(b, j, kK, h, d);
            scores[j] = dot / std::sqrt(static_cast<double>(kHeadDim));
            max = std::max(max, scores[j]);
          }
          for (int j = 0; j < T; ++j)
            sum += std::exp(scores[j] - max);
          double* p = probs.data() + ((static_cast<size_t>(b) * H + h) * T + i) * T;
          for (int j = 0; j < T; ++j)
            p[j] = std::exp(scores[j] - max) / sum;
          for (int d = 0; d < kHeadDim; ++d) {
            double o = 0;
            for (int j = 0; j < T; ++j)
              o += p[j] * Qkv(b, j, kV, h, d);
            out[(static_cast<size_t>(b) * T + i) * D + h * kHeadDim + d] = o;
          }
        }
      }
    }
  }

  void Forward(Vector& out) const {
    Vector probs(kProbs);
    AttentionForward(out.data(), probs.data(), qkv_.data(), qkv_.data(), B, T, T, D, H);
  }

  std::mt19937 rng_{505};
  // Wide enough that the softmax rows are far from uniform.
  Vector qkv_ = gradcheck::Random(kQkv, rng_, -1.5, 1.5);
  Vector w_ = gradcheck::Random(kOut, rng_);  // the loss weights, fed to backward as dout
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };
};

TEST_F(AttentionTest, ForwardMatchesNaiveSoftmax) {
  Vector out(kOut), probs(kProbs);
  Reference(out, probs);
  const AttentionResult<double> r = Run<double>();
  EXPECT_TRUE(gradcheck::Near(r.out, out, 1e-13));
  EXPECT_TRUE(gradcheck::Near(r.probs, probs, 1e-13));
}

// Each part is checked at every one of its elements, so that a failure names the part.
TEST_F(AttentionTest, GradientMatchesFiniteDifferences) {
  const AttentionResult<double> r = Run<double>();
  for (Part part : {kQ, kK, kV}) {
    SCOPED_TRACE(::testing::Message() << "part "
                                      << "qkv"[part]);
    std::vector<size_t> indices;
    for (size_t i = 0; i < kQkv; ++i) {
      if (static_cast<int>(i / D % 3) == part) indices.push_back(i);
    }
    EXPECT_TRUE(gradcheck::GradientMatches(qkv_, r.dqkv, w_, forward_, indices));
  }
}

TEST_F(AttentionTest, BackwardAddsIntoGradient) {
  const AttentionResult<double> r = Run<double>();
  Vector dqkv(kQkv);
  EXPECT_TRUE(gradcheck::Accumulates({{"dqkv", &dqkv}}, [&] {
    AttentionBackward(dqkv.data(), dqkv.data(), w_.data(), qkv_.data(), qkv_.data(), r.probs.data(),
                      B, T, T, D, H);
  }));
}

TEST_F(AttentionTest, FloatMatchesDouble) {
  const AttentionResult<float> f = Run<float>();
  const AttentionResult<double> d = Run<double>();
  EXPECT_TRUE(gradcheck::Near(f.out, d.out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.probs, d.probs, 1e-5));
  EXPECT_TRUE(gradcheck::Near(f.dqkv, d.dqkv, 1e-5));
}

}  // namespace
}  // namespace difftrain::cpu
