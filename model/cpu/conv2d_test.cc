// Conv2d: forward against the direct sum, every gradient (input, weight, bias) against central
// differences, the += contract and float against double, for 3×3 and 1×1 kernels, stride 1
// and 2, with and without padding.
#include "model/cpu/conv2d.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/gradcheck.h"

namespace difftrain::cpu {
namespace {

using gradcheck::Vector;

struct ConvCase {
  const char* name;
  Conv2dShape shape;
};

void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << c.name;
}

class Conv2dTest : public ::testing::TestWithParam<ConvCase> {
 protected:
  const Conv2dShape s_ = GetParam().shape;
  const size_t in_size_ = size_t(s_.B) * s_.C * s_.H * s_.W;
  const size_t out_size_ = size_t(s_.B) * s_.Co * s_.Ho() * s_.Wo();
  const size_t w_size_ = size_t(s_.Co) * s_.C * s_.K * s_.K;
  std::mt19937 rng_{77};
  Vector in_ = gradcheck::Random(in_size_, rng_);
  Vector weight_ = gradcheck::Random(w_size_, rng_);
  Vector bias_ = gradcheck::Random(s_.Co, rng_);
  Vector dout_ = gradcheck::Random(out_size_, rng_);

  void Forward(Vector& out) const {
    Conv2dForward(out.data(), in_.data(), weight_.data(), bias_.data(), s_);
  }
  gradcheck::ForwardFn forward_ = [this](Vector& out) { Forward(out); };

  void Backward(Vector& din, Vector& dweight, Vector& dbias) const {
    Conv2dBackward(din.data(), dweight.data(), dbias.data(), dout_.data(), in_.data(),
                   weight_.data(), s_);
  }
};

TEST_P(Conv2dTest, ForwardMatchesDirectSum) {
  Vector out(out_size_), expected(out_size_);
  Forward(out);
  const int Ho = s_.Ho(), Wo = s_.Wo();
  for (int b = 0; b < s_.B; ++b)
    for (int o = 0; o < s_.Co; ++o)
      for (int i = 0; i < Ho; ++i)
        for (int j = 0; j < Wo; ++j) {
          double sum = bias_[o];
          for (int c = 0; c < s_.C; ++c)
            for (int ki = 0; ki < s_.K; ++ki)
              for (int kj = 0; kj < s_.K; ++kj) {
                const int y = i * s_.S + ki - s_.P, x = j * s_.S + kj - s_.P;
                if (y < 0 || y >= s_.H || x < 0 || x >= s_.W) continue;
                sum += weight_[((o * s_.C + c) * s_.K + ki) * s_.K + kj] *
                       in_[((b * s_.C + c) * s_.H + y) * s_.W + x];
              }
          expected[((b * s_.Co + o) * Ho + i) * Wo + j] = sum;
        }
  EXPECT_TRUE(gradcheck::Near(out, expected, 1e-13));
}

TEST_P(Conv2dTest, GradientsMatchFiniteDifferences) {
  Vector din(in_size_), dweight(w_size_), dbias(s_.Co);
  Backward(din, dweight, dbias);
  EXPECT_TRUE(gradcheck::GradientMatches(in_, din, dout_, forward_)) << "din";
  EXPECT_TRUE(gradcheck::GradientMatches(weight_, dweight, dout_, forward_)) << "dweight";
  EXPECT_TRUE(gradcheck::GradientMatches(bias_, dbias, dout_, forward_)) << "dbias";
}

TEST_P(Conv2dTest, BackwardAddsIntoGradients) {
  Vector din(in_size_), dweight(w_size_), dbias(s_.Co);
  EXPECT_TRUE(gradcheck::Accumulates({{"din", &din}, {"dweight", &dweight}, {"dbias", &dbias}},
                                     [&] { Backward(din, dweight, dbias); }));
}

TEST_P(Conv2dTest, FloatMatchesDouble) {
  Vector out(out_size_), din(in_size_), dweight(w_size_), dbias(s_.Co);
  Forward(out);
  Backward(din, dweight, dbias);
  const auto in = gradcheck::Convert<float>(in_), w = gradcheck::Convert<float>(weight_),
             b = gradcheck::Convert<float>(bias_), dout = gradcheck::Convert<float>(dout_);
  std::vector<float> out_f(out_size_), din_f(in_size_), dw_f(w_size_), db_f(s_.Co);
  Conv2dForward(out_f.data(), in.data(), w.data(), b.data(), s_);
  Conv2dBackward(din_f.data(), dw_f.data(), db_f.data(), dout.data(), in.data(), w.data(), s_);
  EXPECT_TRUE(gradcheck::Near(out_f, out, 1e-5));
  EXPECT_TRUE(gradcheck::Near(din_f, din, 1e-5));
  EXPECT_TRUE(gradcheck::Near(dw_f, dweight, 1e-5));
  EXPECT_TRUE(gradcheck::Near(db_f, dbias, 1e-5));
}

// The UNet's convolutions: 3×3 padding 1 (resnets, conv_in/out, upsamplers), 3×3 stride 2
// padding 1 (downsamplers, also with an odd side), 1×1 (shortcuts, proj_in/out), and an
// unpadded 3×3 and a strided 1×1 for the general paths.
INSTANTIATE_TEST_SUITE_P(Shapes, Conv2dTest,
                         ::testing::Values(ConvCase{"K3S1P1", {2, 3, 6, 5, 4, 3, 1, 1}},
                                           ConvCase{"K3S2P1", {2, 3, 6, 6, 4, 3, 2, 1}},
                                           ConvCase{"K3S2P1OddSide", {1, 2, 7, 5, 3, 3, 2, 1}},
                                           ConvCase{"K1S1P0", {2, 5, 4, 3, 6, 1, 1, 0}},
                                           ConvCase{"K3S1P0", {2, 2, 5, 5, 3, 3, 1, 0}},
                                           ConvCase{"K1S2P0", {2, 3, 6, 6, 2, 1, 2, 0}}),
                         [](const ::testing::TestParamInfo<ConvCase>& info) {
                           return std::string(info.param.name);
                         });

// A batch whose im2col matrices do not fit one GEMM's scratch runs in groups of samples
// (two, then one, here); the result must be that of each sample alone (the weight gradient
// within float rounding of its 64k-term sums).
TEST(Conv2dGroupsTest, BatchInGroupsEqualsOneSampleAtATime) {
  const Conv2dShape s{3, 16, 146, 146, 2, 3, 1, 1};
  const Conv2dShape one{1, s.C, s.H, s.W, s.Co, s.K, s.S, s.P};
  const size_t in_sample = size_t(s.C) * s.H * s.W, out_sample = size_t(s.Co) * s.Ho() * s.Wo();
  std::mt19937 rng(5);
  const auto in = gradcheck::Convert<float>(gradcheck::Random(s.B * in_sample, rng));
  const auto w = gradcheck::Convert<float>(gradcheck::Random(size_t(s.Co) * s.C * 9, rng));
  const auto b = gradcheck::Convert<float>(gradcheck::Random(s.Co, rng));
  const auto dout = gradcheck::Convert<float>(gradcheck::Random(s.B * out_sample, rng));
  std::vector<float> out(s.B * out_sample), din(s.B * in_sample), dw(w.size()), db(s.Co);
  Conv2dForward(out.data(), in.data(), w.data(), b.data(), s);
  Conv2dBackward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), s);
  std::vector<float> out1(out.size()), din1(din.size()), dw1(w.size()), db1(s.Co);
  for (int i = 0; i < s.B; ++i) {
    Conv2dForward(out1.data() + i * out_sample, in.data() + i * in_sample, w.data(), b.data(),
                  one);
    Conv2dBackward(din1.data() + i * in_sample, dw1.data(), db1.data(),
                   dout.data() + i * out_sample, in.data() + i * in_sample, w.data(), one);
  }
  EXPECT_TRUE(gradcheck::Near(out, gradcheck::Convert<double>(out1), 1e-6));
  EXPECT_TRUE(gradcheck::Near(din, gradcheck::Convert<double>(din1), 1e-6));
  EXPECT_TRUE(gradcheck::Near(dw, gradcheck::Convert<double>(dw1), 1e-5));
  EXPECT_TRUE(gradcheck::Near(db, gradcheck::Convert<double>(db1), 1e-6));
}

}  // namespace
}  // namespace difftrain::cpu
