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

// Cross-attention through the general form: queries [B, Tq, D] of their own, keys and values
// side by side in [B, Tk, 2·D] (the UNet's to_q and to_k/to_v), Tq ≠ Tk. Forward against the
// self-attention form on a packed copy; q, k and v gradients against central differences.
TEST(CrossAttention, SeparateQueriesAndTextKeys) {
  constexpr int Tq = 6, Tk = 3;
  std::mt19937 rng(606);
  Vector q = gradcheck::Random(size_t(B) * Tq * D, rng, -1.5, 1.5);
  Vector kv = gradcheck::Random(size_t(B) * Tk * 2 * D, rng, -1.5, 1.5);
  Vector dout = gradcheck::Random(size_t(B) * Tq * D, rng);
  const auto forward = [&](Vector& out) {
    Vector probs(size_t(B) * H * Tq * Tk);
    AttentionForward(out.data(), probs.data(), q.data(), D, kv.data(), kv.data() + D, 2 * D, B, Tq,
                     Tk, D, H);
  };
  // The same attention in the packed [B, T, 3·D] form of the self-attention kernel.
  Vector q_packed(size_t(B) * Tq * 3 * D), kv_packed(size_t(B) * Tk * 3 * D);
  for (size_t r = 0; r < size_t(B) * Tq; ++r)
    std::copy_n(q.begin() + r * D, D, q_packed.begin() + r * 3 * D);
  for (size_t r = 0; r < size_t(B) * Tk; ++r)
    std::copy_n(kv.begin() + r * 2 * D, 2 * D, kv_packed.begin() + r * 3 * D + D);
  Vector out(size_t(B) * Tq * D), expected(out.size()), probs(size_t(B) * H * Tq * Tk);
  forward(out);
  AttentionForward(expected.data(), probs.data(), q_packed.data(), kv_packed.data(), B, Tq, Tk, D,
                   H);
  EXPECT_TRUE(gradcheck::Near(out, expected, 1e-14));

  Vector dq(q.size()), dkv(kv.size());
  AttentionBackward(dq.data(), dkv.data(), dkv.data() + D, dout.data(), q.data(), D, kv.data(),
                    kv.data() + D, 2 * D, probs.data(), B, Tq, Tk, D, H);
  EXPECT_TRUE(gradcheck::GradientMatches(q, dq, dout, forward)) << "dq";
  EXPECT_TRUE(gradcheck::GradientMatches(kv, dkv, dout, forward)) << "dk and dv";
}

}  // namespace
}  // namespace difftrain::cpu
