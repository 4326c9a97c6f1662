// FP8 on a GPU (model/cuda/fp8.h): the quantising kernel against the CPU's conversion
// (model/cuda/fp8_format.h; the same kernel body runs on the CPU emulator in
// model/simt/fp8_kernel_test.cc), the scales' update, and cuBLASLt's FP8 products against double
// products of exactly the values their FP8 operands hold, dequantised on the CPU.
//
// Tolerances (relative L2): an FP8 value times its scale_inv is exact in fp32, and so is a
// product of two (4 + 4 significand bits), so the products differ from the reference only by
// fp32 accumulation (the forward's "fast" accumulation among it) and the output's rounding:
// bf16 outputs ≤ 1e-2 as in gemm_test.cc, the fp32 weight gradient ≤ 1e-3. A wrong layout, a
// missing scale or a swapped format is off by order 1.
#include "model/cuda/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "model/cpu/activation.h"
#include "model/cpu/linear.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::RandomVector;
using testing::RelativeL2;
using testing::RoundToBf16;
using testing::UploadBf16;
using testing::UploadFloat;

// FP8 tensor cores from Ada (8.9) on: an H100 (9.0) has them, an A100 (8.0) or an A10 (8.6) not.
static_assert(Fp8Capable(8, 9) && Fp8Capable(9, 0) && Fp8Capable(10, 0));
static_assert(!Fp8Capable(8, 0) && !Fp8Capable(8, 6) && !Fp8Capable(7, 5));

#define DT_SKIP_WITHOUT_FP8()                                                     \
  do {                                                                            \
    DT_SKIP_WITHOUT_GPU();                                                        \
    const Status dt_fp8_ = Fp8Supported();                                        \
    if (!dt_fp8_.ok()) GTEST_SKIP() << "GPU test skipped: " << dt_fp8_.message(); \
  } while (0)

std::vector<double> ToDouble(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
std::vector<float> ToFloat(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

class Fp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    DT_SKIP_WITHOUT_GPU();
    DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) DT_CUDA_CHECK(cudaStreamDestroy(stream_));
  }
  void Sync() { DT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  cudaStream_t stream_ = nullptr;
};

// Scale 1 first (the scales' start), then the scale the update derives from the amax the first
// quantisation saw: 448 or 57,344 over the largest |x|. Every code in both layouts is the CPU's
// conversion of x · scale, and the running amax is the largest |x| again after the update reset
// it.
TEST_F(Fp8Test, QuantizeMatchesTheCpuConversion) {
  const int rows = 144, cols = 208;
  const size_t n = size_t(rows) * cols;
  const std::vector<float> x = RoundToBf16(RandomVector(n, 3, 3.0));
  DeviceBuffer<bf16> d_x = UploadBf16(x);
  DeviceBuffer<uint8_t> out(n), out_t(n);
  Fp8Scaling scaling({fp8::kE4M3, fp8::kE5M2}, {});
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < 2; ++i) {
      SCOPED_TRACE(::testing::Message() << "pass " << pass << ", tensor " << i);
      DT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0x55, n, stream_));
      DT_CUDA_CHECK(cudaMemsetAsync(out_t.data(), 0x55, n, stream_));
      QuantizeFp8(out.data(), out_t.data(), d_x.data(), rows, cols, scaling, i, stream_);
      Sync();
      const float scale = scaling.DownloadScales()[i];
      EXPECT_EQ(scale, pass == 0 ? 1.0f : fp8::MaxFinite(scaling.format(i)) / MaxAbs(x));
      EXPECT_EQ(scaling.DownloadAmax()[i], MaxAbs(x));
      const std::vector<uint8_t> got = out.Download(), got_t = out_t.Download();
      int wrong = 0;
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
          const uint8_t want = fp8::FromFloat(x[size_t(r) * cols + c] * scale, scaling.format(i));
          wrong += got[size_t(r) * cols + c] != want;
          wrong += got_t[size_t(c) * rows + r] != want;
        }
      }
      EXPECT_EQ(wrong, 0);
    }
    scaling.Update(stream_);
    Sync();
    EXPECT_EQ(scaling.DownloadAmax(), (std::vector<float>{0.0f, 0.0f}));
  }
}

// A quantised operand: its codes in both layouts on the device, and the values they stand for
// (code · scale_inv), row-major, on the host.
struct Quantised {
  DeviceBuffer<uint8_t> rows, cols;
  std::vector<float> values;
  const float* scale_inv;

  Fp8Operand RowMajor() const { return {rows.data(), scale_inv}; }
  Fp8Operand Transposed() const { return {cols.data(), scale_inv}; }
};

// Quantises x [r, c] with tensor i after a first pass has set its scale.
Quantised Quantise(const std::vector<float>& x, int r, int c, Fp8Scaling& scaling, int i,
                   cudaStream_t stream) {
  DeviceBuffer<bf16> d = UploadBf16(x);
  Quantised q{
      DeviceBuffer<uint8_t>(x.size()), DeviceBuffer<uint8_t>(x.size()), {}, scaling.scale_inv(i)};
  QuantizeFp8(q.rows.data(), q.cols.data(), d.data(), r, c, scaling, i, stream);
  DT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return q;
}

void Dequantise(Quantised& q, const Fp8Scaling& scaling, int i) {
  float scale_inv = 0;
  DT_CUDA_CHECK(
      cudaMemcpy(&scale_inv, scaling.scale_inv(i), sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<uint8_t> codes = q.rows.Download();
  q.values.resize(codes.size());
  for (size_t k = 0; k < codes.size(); ++k)
    q.values[k] = fp8::ToFloat(codes[k], scaling.format(i)) * scale_inv;
}

void ExpectProductsMatch(int N, int I, int O, cudaStream_t stream) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O);
  const std::vector<float> in = RoundToBf16(RandomVector(size_t(N) * I, 1, 1.0));
  const std::vector<float> w = RoundToBf16(RandomVector(size_t(O) * I, 2, 1.0 / std::sqrt(I)));
  const std::vector<float> dout = RoundToBf16(RandomVector(size_t(N) * O, 3, 1e-3));
  const std::vector<float> bias = RoundToBf16(RandomVector(O, 4, 0.5));
  const std::vector<float> pre = RoundToBf16(RandomVector(size_t(N) * I, 5, 1.0));
  // Tensors: 0 the input and 1 the weight (E4M3), 2 the output's gradient (E5M2); a first pass
  // at scale 1 sets the scales the products then run with.
  Fp8Scaling scaling({fp8::kE4M3, fp8::kE4M3, fp8::kE5M2}, {});
  Quantise(in, N, I, scaling, 0, stream);
  Quantise(w, O, I, scaling, 1, stream);
  Quantise(dout, N, O, scaling, 2, stream);
  scaling.Update(stream);
  Quantised q_in = Quantise(in, N, I, scaling, 0, stream);
  Quantised q_w = Quantise(w, O, I, scaling, 1, stream);
  Quantised q_dout = Quantise(dout, N, O, scaling, 2, stream);
  Dequantise(q_in, scaling, 0);
  Dequantise(q_w, scaling, 1);
  Dequantise(q_dout, scaling, 2);
  const std::vector<double> x = ToDouble(q_in.values), wt = ToDouble(q_w.values),
                            g = ToDouble(q_dout.values), b = ToDouble(bias);

  Gemm gemm(stream);
  DeviceBuffer<bf16> d_bias = UploadBf16(bias), d_pre = UploadBf16(pre);
  {  // forward with its bias, and with GELU
    std::vector<double> want(size_t(N) * O), gelu(want.size());
    cpu::LinearForward<double>(want.data(), x.data(), wt.data(), b.data(), N, I, O);
    cpu::GeluForward<double>(gelu.data(), want.data(), want.size());
    DeviceBuffer<bf16> out(want.size()), aux(want.size());
    ASSERT_TRUE(gemm.ForwardFp8(out.data(), q_in.RowMajor(), q_w.RowMajor(), d_bias.data(), N, I, O,
                                Epilogue::kBias));
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(want)), 1e-2) << "forward";
    if (gemm.ForwardFp8(out.data(), q_in.RowMajor(), q_w.RowMajor(), d_bias.data(), N, I, O,
                        Epilogue::kBiasGelu, aux.data())) {
      DT_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(gelu)), 1e-2) << "GELU forward";
      EXPECT_LE(RelativeL2(DownloadAsFloat(aux), ToFloat(want)), 1e-2) << "GELU's input";
    } else {
      std::printf("note: no FP8 GELU_AUX_BIAS algorithm at N=%d I=%d O=%d: bf16 instead\n", N, I,
                  O);
    }
  }
  {  // the weight gradient, added to what dw held
    const std::vector<float> dw0 = RandomVector(size_t(O) * I, 6, 1e-3);
    std::vector<double> want = ToDouble(dw0);
    cpu::LinearBackward<double>(nullptr, want.data(), nullptr, g.data(), x.data(), wt.data(), N, I,
                                O);
    DeviceBuffer<float> dw = UploadFloat(dw0);
    ASSERT_TRUE(gemm.BackwardWeightFp8(dw.data(), q_dout.Transposed(), q_in.Transposed(), N, I, O,
                                       /*accumulate=*/true));
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_LE(RelativeL2(dw.Download(), ToFloat(want)), 1e-3) << "weight gradient";
  }
  {  // the input gradient, plain and through GELU with fc1's bias gradient
    std::vector<double> want(size_t(N) * I, 0.0), through(want.size()), dbias(I, 0.0);
    cpu::LinearBackward<double>(want.data(), nullptr, nullptr, g.data(), x.data(), wt.data(), N, I,
                                O);
    const std::vector<double> p = ToDouble(pre);
    cpu::GeluBackward<double>(through.data(), want.data(), p.data(), want.size());
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < I; ++c)
        dbias[c] += through[size_t(r) * I + c];
    DeviceBuffer<bf16> din(want.size());
    ASSERT_TRUE(gemm.BackwardInputFp8(din.data(), q_dout.RowMajor(), q_w.Transposed(), N, I, O));
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_LE(RelativeL2(DownloadAsFloat(din), ToFloat(want)), 1e-2) << "input gradient";
    DeviceBuffer<float> d_dbias = UploadFloat(std::vector<float>(I, 0.0f)), scratch(I);
    if (gemm.BackwardInputFp8(din.data(), q_dout.RowMajor(), q_w.Transposed(), N, I, O,
                              d_pre.data(), d_dbias.data(), scratch.data())) {
      DT_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_LE(RelativeL2(DownloadAsFloat(din), ToFloat(through)), 1e-2) << "through GELU";
      EXPECT_LE(RelativeL2(d_dbias.Download(), ToFloat(dbias)), 1e-2) << "fc1's bias gradient";
    } else {
      std::printf("note: no FP8 DGELU algorithm at N=%d I=%d O=%d: bf16 instead\n", N, I, O);
    }
  }
}

TEST_F(Fp8Test, ProductsMatchTheQuantisedOperands) {
  DT_SKIP_WITHOUT_FP8();
  ExpectProductsMatch(64, 96, 48, stream_);
  ExpectProductsMatch(512, 384, 1152, stream_);  // DiT-S's qkv at two samples
}

// A matrix that is not a multiple of 16 each way is refused by name.
TEST(Fp8DeathTest, ShapesNotMultiplesOf16AreRefused) {
  DT_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Fp8Scaling scaling({fp8::kE4M3}, {});
        QuantizeFp8(nullptr, nullptr, nullptr, 24, 16, scaling, 0, nullptr);
      },
      "both must be positive multiples of 16");
}

}  // namespace
}  // namespace difftrain::cuda
