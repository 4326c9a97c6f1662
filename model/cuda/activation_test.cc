// SiLU, GELU, the bias gradient and the casts on the GPU against model/cpu/activation.h (in
// double) and plain loops, at a small odd size and a large one that is not a multiple of the
// block size.
#include "model/cuda/activation.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/cpu/activation.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::Poison;
using testing::RandomVector;
using testing::RelativeL2;
using testing::RoundToBf16;
using testing::UploadBf16;
using testing::UploadFloat;

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

class ActivationTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ActivationTest, Silu) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<float> in = RandomVector(n, 1, 3.0), dout = RandomVector(n, 2);
  const std::vector<float> din0 = RandomVector(n, 3);
  const std::vector<double> ind = ToDouble(in), doutd = ToDouble(dout);
  std::vector<double> out(n), din = ToDouble(din0);
  cpu::SiluForward<double>(out.data(), ind.data(), n);
  cpu::SiluBackward<double>(din.data(), doutd.data(), ind.data(), n);

  DeviceBuffer<float> d_in = UploadFloat(in), d_dout = UploadFloat(dout);
  DeviceBuffer<float> d_din = UploadFloat(din0);
  DeviceBuffer<bf16> d_out(n);
  Poison(d_out);
  SiluForward(d_out.data(), d_in.data(), n, nullptr);
  SiluBackward(d_din.data(), d_dout.data(), d_in.data(), n, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_out), ToFloat(out)), 1e-2);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_din), ToFloat(din)), 1e-5);
}

TEST_P(ActivationTest, Gelu) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<float> in = RoundToBf16(RandomVector(n, 4, 3.0));
  const std::vector<float> dout = RoundToBf16(RandomVector(n, 5));
  const std::vector<double> ind = ToDouble(in), doutd = ToDouble(dout);
  std::vector<double> out(n), din(n, 0.0);
  cpu::GeluForward<double>(out.data(), ind.data(), n);
  cpu::GeluBackward<double>(din.data(), doutd.data(), ind.data(), n);

  DeviceBuffer<bf16> d_in = UploadBf16(in), d_dout = UploadBf16(dout), d_out(n), d_din(n);
  Poison(d_out);
  Poison(d_din);
  GeluForward(d_out.data(), d_in.data(), n, nullptr);
  GeluBackward(d_din.data(), d_dout.data(), d_in.data(), n, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_out), ToFloat(out)), 1e-2);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_din), ToFloat(din)), 1e-2);
}

TEST_P(ActivationTest, Casts) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<float> in = RandomVector(n, 6), start = RandomVector(n, 7);
  const std::vector<float> rounded = RoundToBf16(in);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i)
    sum[i] = start[i] + rounded[i];

  DeviceBuffer<float> d_in = UploadFloat(in), d_written(n), d_sum = UploadFloat(start);
  DeviceBuffer<bf16> d_bf16(n);
  Poison(d_bf16);
  Poison(d_written);
  CastToBf16(d_bf16.data(), d_in.data(), n, nullptr);
  CastToFloat(d_written.data(), d_bf16.data(), n, /*accumulate=*/false, nullptr);
  CastToFloat(d_sum.data(), d_bf16.data(), n, /*accumulate=*/true, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(d_bf16), rounded);  // round to nearest even, as on the host
  EXPECT_EQ(DownloadAsFloat(d_written), rounded);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_sum), sum), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ActivationTest, ::testing::Values(size_t{37}, size_t{1000003}));

struct BiasShape {
  int N, O;
};

class BiasGradientTest : public ::testing::TestWithParam<BiasShape> {};

// dbias += column sums, from bf16 and from fp32 gradients.
TEST_P(BiasGradientTest, ColumnSums) {
  DT_SKIP_WITHOUT_GPU();
  const auto [N, O] = GetParam();
  const size_t size = static_cast<size_t>(N) * O;
  const std::vector<float> dout_f = RandomVector(size, 8);
  const std::vector<float> dout_b = RoundToBf16(RandomVector(size, 9));
  const std::vector<float> start = RandomVector(O, 10);
  std::vector<double> want_f(start.begin(), start.end()), want_b = want_f;
  for (int r = 0; r < N; ++r) {
    for (int o = 0; o < O; ++o) {
      want_f[o] += dout_f[static_cast<size_t>(r) * O + o];
      want_b[o] += dout_b[static_cast<size_t>(r) * O + o];
    }
  }
  DeviceBuffer<float> d_dout_f = UploadFloat(dout_f);
  DeviceBuffer<bf16> d_dout_b = UploadBf16(dout_b);
  DeviceBuffer<float> d_bias_f = UploadFloat(start), d_bias_b = UploadFloat(start);
  BiasGradient(d_bias_f.data(), d_dout_f.data(), N, O, nullptr);
  BiasGradient(d_bias_b.data(), d_dout_b.data(), N, O, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_bias_f), ToFloat(want_f)), 1e-5);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_bias_b), ToFloat(want_b)), 1e-5);
}

// Rows that start off a 16-byte boundary (a view one element into a buffer) take the general
// kernel and still sum right.
TEST(BiasGradientAlignment, MisalignedRows) {
  DT_SKIP_WITHOUT_GPU();
  const int N = 64, O = 1152;
  const std::vector<float> dout = RoundToBf16(RandomVector(size_t(N) * O + 1, 11));
  std::vector<double> want(O, 0.0);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < O; ++o)
      want[o] += dout[1 + static_cast<size_t>(r) * O + o];
  DeviceBuffer<bf16> d_dout = UploadBf16(dout);
  DeviceBuffer<float> d_bias = UploadFloat(std::vector<float>(O, 0.0f));
  BiasGradient(d_bias.data(), d_dout.data() + 1, N, O, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_bias), ToFloat(want)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasGradientTest,
                         ::testing::Values(BiasShape{1, 1}, BiasShape{13, 45},
                                           BiasShape{1024, 4608}, BiasShape{4, 6912},
                                           BiasShape{8192, 1152}, BiasShape{300, 72},
                                           BiasShape{3, 20}, BiasShape{517, 12}));

}  // namespace
}  // namespace difftrain::cuda
