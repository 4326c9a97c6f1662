// DiT's ε-MSE on the GPU against a double-precision loop, with and without learned-variance
// channels (which must get a zero gradient).
#include "model/cuda/loss.h"

#include <gtest/gtest.h>

#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::RandomVector;
using testing::RelativeL2;
using testing::UploadFloat;

struct Shape {
  int B, out_channels, C, HW;
};

class LossTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LossTest, MatchesDoublePrecisionLoop) {
  DT_SKIP_WITHOUT_GPU();
  const auto [B, Co, C, HW] = GetParam();
  const std::vector<float> out = RandomVector(size_t(B) * Co * HW, 1);
  const std::vector<float> target = RandomVector(size_t(B) * C * HW, 2);
  const double n = double(B) * C * HW;
  double sum = 0;
  std::vector<float> want_dout(out.size(), 0.0f);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < C * HW; ++i) {
      const size_t o = size_t(b) * Co * HW + i;
      const double e = double(out[o]) - target[size_t(b) * C * HW + i];
      sum += e * e;
      want_dout[o] = static_cast<float>(2 * e / n);
    }
  }
  DeviceBuffer<float> d_out = UploadFloat(out), d_target = UploadFloat(target);
  DeviceBuffer<float> d_dout(out.size()), d_loss(1);
  testing::Poison(d_dout);
  testing::Poison(d_loss);
  EpsilonMseLoss(d_loss.data(), d_dout.data(), d_out.data(), d_target.data(), B, Co, C, HW,
                 nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_loss), {static_cast<float>(sum / n)}), 1e-6);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dout), want_dout), 1e-6);  // zeros included
}

INSTANTIATE_TEST_SUITE_P(Shapes, LossTest,
                         ::testing::Values(Shape{3, 1, 1, 49},           // one channel
                                           Shape{2, 4, 4, 64},           // no learned sigma
                                           Shape{256, 8, 4, 32 * 32}));  // DiT-XL/2's, learn_sigma
}  // namespace
}  // namespace difftrain::cuda
