// LayerNormModulate and GatedResidual on the GPU against the CPU's LayerNorm, Modulate and
// GatedResidual (in double), at a small odd shape (scalar path), a float4-able one, and
// DiT-XL's block shape with the adaLN slices at their model offsets.
#include "model/cuda/modulate.h"

#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "model/cpu/layernorm.h"
#include "model/cpu/modulate.h"
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

struct Shape {
  const char* name;
  int B, T, D, chunks, shift, scale, gate;  // slices in units of D
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.name;
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

class ModulateTest : public ::testing::TestWithParam<Shape> {
 protected:
  const Shape& s() const { return GetParam(); }
  int Stride() const { return s().chunks * s().D; }
  size_t Tokens() const { return static_cast<size_t>(s().B) * s().T * s().D; }
  size_t Rows() const { return static_cast<size_t>(s().B) * s().T; }
  size_t AdaSize() const { return static_cast<size_t>(s().B) * Stride(); }
};

TEST_P(ModulateTest, LayerNormModulateForward) {
  DT_SKIP_WITHOUT_GPU();
  const auto [name, B, T, D, chunks, shift, scale, gate] = s();
  const std::vector<float> x = RandomVector(Tokens(), 1, 2.0);
  std::vector<float> x_shifted = x;  // a non-zero mean exercises the two-pass variance
  for (float& v : x_shifted)
    v += 3.0f;
  const std::vector<float> ada = RandomVector(AdaSize(), 2, 0.5);

  const std::vector<double> xd = ToDouble(x_shifted), adad = ToDouble(ada);
  std::vector<double> ln(Tokens()), mean(Rows()), rstd(Rows()), out(Tokens());
  cpu::LayerNormForward<double>(ln.data(), mean.data(), rstd.data(), xd.data(), B * T, D, 1e-6);
  cpu::ModulateForward<double>(out.data(), ln.data(), adad.data() + shift * D,
                               adad.data() + scale * D, Stride(), B, T, D);

  DeviceBuffer<float> d_x = UploadFloat(x_shifted), d_ada = UploadFloat(ada);
  DeviceBuffer<bf16> d_out(Tokens());
  DeviceBuffer<float> d_mean(Rows()), d_rstd(Rows());
  Poison(d_out);
  Poison(d_mean);
  Poison(d_rstd);
  LayerNormModulateForward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(), d_ada.data(),
                           shift * D, scale * D, Stride(), B, T, D, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_out), ToFloat(out)), 1e-2);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_mean), ToFloat(mean)), 1e-5);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_rstd), ToFloat(rstd)), 1e-5);
}

TEST_P(ModulateTest, LayerNormModulateBackward) {
  DT_SKIP_WITHOUT_GPU();
  const auto [name, B, T, D, chunks, shift, scale, gate] = s();
  const std::vector<float> x = RandomVector(Tokens(), 3, 1.5);
  const std::vector<float> ada = RandomVector(AdaSize(), 4, 0.5);
  const std::vector<float> dout = RoundToBf16(RandomVector(Tokens(), 5));
  const std::vector<float> dx0 = RandomVector(Tokens(), 6), dada0 = RandomVector(AdaSize(), 7);

  // The statistics the GPU reads are the forward's, rounded to float; the reference uses them.
  const std::vector<double> xd = ToDouble(x), adad = ToDouble(ada), doutd = ToDouble(dout);
  std::vector<double> ln(Tokens()), mean(Rows()), rstd(Rows());
  cpu::LayerNormForward<double>(ln.data(), mean.data(), rstd.data(), xd.data(), B * T, D, 1e-6);
  const std::vector<float> mean_f = ToFloat(mean), rstd_f = ToFloat(rstd);
  mean = ToDouble(mean_f);
  rstd = ToDouble(rstd_f);
  for (size_t r = 0; r < Rows(); ++r) {
    for (int d = 0; d < D; ++d)
      ln[r * D + d] = (xd[r * D + d] - mean[r]) * rstd[r];
  }
  std::vector<double> dln(Tokens(), 0.0), dx = ToDouble(dx0), dada = ToDouble(dada0);
  cpu::ModulateBackward<double>(dln.data(), dada.data() + shift * D, dada.data() + scale * D,
                                doutd.data(), ln.data(), adad.data() + scale * D, Stride(), B, T,
                                D);
  cpu::LayerNormBackward<double>(dx.data(), dln.data(), xd.data(), mean.data(), rstd.data(), B * T,
                                 D);

  DeviceBuffer<float> d_x = UploadFloat(x), d_ada = UploadFloat(ada);
  DeviceBuffer<float> d_mean = UploadFloat(mean_f), d_rstd = UploadFloat(rstd_f);
  DeviceBuffer<bf16> d_dout = UploadBf16(dout);
  DeviceBuffer<float> d_dx = UploadFloat(dx0), d_dada = UploadFloat(dada0);
  LayerNormModulateBackward(d_dx.data(), d_dada.data(), d_dout.data(), d_x.data(), d_mean.data(),
                            d_rstd.data(), d_ada.data(), shift * D, scale * D, Stride(), B, T, D,
                            nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dx), ToFloat(dx)), 1e-5);
  // The whole buffer: the other slices must keep their starting values.
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dada), ToFloat(dada)), 1e-5);
  // The increments alone, so that a small error is not hidden by the starting values.
  const std::vector<float> got = DownloadAsFloat(d_dada);
  std::vector<float> got_inc(AdaSize()), want_inc(AdaSize());
  for (size_t i = 0; i < AdaSize(); ++i) {
    got_inc[i] = got[i] - dada0[i];
    want_inc[i] = static_cast<float>(dada[i] - dada0[i]);
  }
  EXPECT_LE(RelativeL2(got_inc, want_inc), 1e-4);
}

TEST_P(ModulateTest, GatedResidualForward) {
  DT_SKIP_WITHOUT_GPU();
  const auto [name, B, T, D, chunks, shift, scale, gate] = s();
  const std::vector<float> x = RandomVector(Tokens(), 8);
  const std::vector<float> y = RoundToBf16(RandomVector(Tokens(), 9));
  const std::vector<float> ada = RandomVector(AdaSize(), 10);
  const std::vector<double> xd = ToDouble(x), yd = ToDouble(y), adad = ToDouble(ada);
  std::vector<double> out(Tokens());
  cpu::GatedResidualForward<double>(out.data(), xd.data(), yd.data(), adad.data() + gate * D,
                                    Stride(), B, T, D);

  DeviceBuffer<float> d_x = UploadFloat(x), d_ada = UploadFloat(ada), d_out(Tokens());
  DeviceBuffer<bf16> d_y = UploadBf16(y);
  Poison(d_out);
  GatedResidualForward(d_out.data(), d_x.data(), d_y.data(), d_ada.data(), gate * D, Stride(), B, T,
                       D, nullptr);
  // In place: x becomes the output.
  GatedResidualForward(d_x.data(), d_x.data(), d_y.data(), d_ada.data(), gate * D, Stride(), B, T,
                       D, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_out), ToFloat(out)), 1e-5);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_x), ToFloat(out)), 1e-5);
}

TEST_P(ModulateTest, GatedResidualBackward) {
  DT_SKIP_WITHOUT_GPU();
  const auto [name, B, T, D, chunks, shift, scale, gate] = s();
  const std::vector<float> dout = RandomVector(Tokens(), 11);
  const std::vector<float> y = RoundToBf16(RandomVector(Tokens(), 12));
  const std::vector<float> ada = RandomVector(AdaSize(), 13);
  const std::vector<float> dada0 = RandomVector(AdaSize(), 14);
  const std::vector<double> doutd = ToDouble(dout), yd = ToDouble(y), adad = ToDouble(ada);
  std::vector<double> dy(Tokens(), 0.0), dada = ToDouble(dada0);
  cpu::GatedResidualBackward<double>(nullptr, dy.data(), dada.data() + gate * D, doutd.data(),
                                     yd.data(), adad.data() + gate * D, Stride(), B, T, D);

  DeviceBuffer<float> d_dout = UploadFloat(dout), d_ada = UploadFloat(ada);
  DeviceBuffer<float> d_dada = UploadFloat(dada0);
  DeviceBuffer<bf16> d_y = UploadBf16(y), d_dy(Tokens());
  Poison(d_dy);
  GatedResidualBackward(d_dy.data(), d_dada.data(), d_dout.data(), d_y.data(), d_ada.data(),
                        gate * D, Stride(), B, T, D, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dy), ToFloat(dy)), 1e-2);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dada), ToFloat(dada)), 1e-5);
  const std::vector<float> got = DownloadAsFloat(d_dada);
  std::vector<float> got_inc(AdaSize()), want_inc(AdaSize());
  for (size_t i = 0; i < AdaSize(); ++i) {
    got_inc[i] = got[i] - dada0[i];
    want_inc[i] = static_cast<float>(dada[i] - dada0[i]);
  }
  EXPECT_LE(RelativeL2(got_inc, want_inc), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ModulateTest,
    ::testing::Values(Shape{"OddScalar", 3, 7, 42, 6, 0, 1, 2},  // D % 4 != 0: scalar path
                      Shape{"SmallFinalLayer", 2, 9, 36, 2, 0, 1, 1},
                      Shape{"DitXLAttention", 4, 256, 1152, 6, 0, 1, 2},
                      Shape{"DitXLMlp", 4, 256, 1152, 6, 3, 4, 5}),
    [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name; });

}  // namespace
}  // namespace difftrain::cuda
