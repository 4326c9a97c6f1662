// The UNet's other GPU ops against their CPU references, on fresh random inputs with outputs
// poisoned (NaN) before the launch: GroupNorm (fused with SiLU, alone, and as the
// transformer's LayerNorm), nearest ×2 upsampling, channel concatenation, the token
// transposes, the per-plane add, and GEGLU with the exact GELU.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "model/cpu/activation.h"
#include "model/cpu/groupnorm.h"
#include "model/cpu/upsample.h"
#include "model/cuda/geglu.h"
#include "model/cuda/groupnorm.h"
#include "model/cuda/spatial.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::RandomVector;
using testing::RelativeL2;
using testing::UploadFloat;

// GroupNorm (+ SiLU) forward and backward against cpu::GroupNorm{Forward,Backward} and
// cpu::Silu{Forward,Backward}; dout is bf16 where `bf16_dout` (the transformer's LayerNorms,
// fed by a GEMM's input gradient), and out is bf16 where a GEMM reads it.
template <typename Out>
void CheckGroupNorm(const cpu::GroupNormShape& s, float eps, bool silu) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " C=" << s.C << " HW=" << s.HW << " G=" << s.G
                                    << " silu=" << silu);
  const size_t n = size_t(s.B) * s.C * s.HW;
  const std::vector<float> x = RandomVector(n, 41, 2.0);
  const std::vector<float> w = RandomVector(s.C, 42), b = RandomVector(s.C, 43);
  std::vector<float> dout = RandomVector(n, 44);
  if (std::is_same_v<Out, bf16>) dout = testing::RoundToBf16(dout);
  const std::vector<float> din0 = RandomVector(n, 45), dw0 = RandomVector(s.C, 46),
                           db0 = RandomVector(s.C, 47);

  // CPU: y = GN(x), out = silu ? SiLU(y) : y; dy = SiLU'(y) · dout.
  std::vector<float> y(n), xhat(n), mean(size_t(s.B) * s.G), rstd(mean.size()), out_ref(n);
  cpu::GroupNormForward(y.data(), xhat.data(), mean.data(), rstd.data(), x.data(), w.data(),
                        b.data(), s, eps);
  std::vector<float> dy(n, 0.0f);
  if (silu) {
    cpu::SiluForward(out_ref.data(), y.data(), n);
    cpu::SiluBackward(dy.data(), dout.data(), y.data(), n);
  } else {
    out_ref = y;
    dy = dout;
  }
  std::vector<float> din_ref = din0, dw_ref = dw0, db_ref = db0, dxhat(n);
  cpu::GroupNormBackward(din_ref.data(), dw_ref.data(), db_ref.data(), dxhat.data(), dy.data(),
                         x.data(), xhat.data(), mean.data(), rstd.data(), w.data(), s);

  DeviceBuffer<float> x_d = UploadFloat(x), w_d = UploadFloat(w), b_d = UploadFloat(b);
  DeviceBuffer<float> din_d = UploadFloat(din0), dw_d = UploadFloat(dw0), db_d = UploadFloat(db0);
  DeviceBuffer<float> mean_d(mean.size()), rstd_d(mean.size());
  DeviceBuffer<float> workspace(GroupNormBackwardWorkspace(s));
  DeviceBuffer<Out> out_d(n);
  testing::Poison(out_d);
  testing::Poison(mean_d);
  testing::Poison(rstd_d);
  testing::Poison(workspace);
  GroupNormForward(out_d.data(), mean_d.data(), rstd_d.data(), x_d.data(), w_d.data(), b_d.data(),
                   s, eps, silu, nullptr);
  if constexpr (std::is_same_v<Out, bf16>) {
    DeviceBuffer<bf16> dout_d = testing::UploadBf16(dout);
    GroupNormBackward(din_d.data(), dw_d.data(), db_d.data(), dout_d.data(), x_d.data(),
                      mean_d.data(), rstd_d.data(), w_d.data(), b_d.data(), s, silu,
                      workspace.data(), nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    DeviceBuffer<float> dout_d = UploadFloat(dout);
    GroupNormBackward(din_d.data(), dw_d.data(), db_d.data(), dout_d.data(), x_d.data(),
                      mean_d.data(), rstd_d.data(), w_d.data(), b_d.data(), s, silu,
                      workspace.data(), nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const double tolerance = std::is_same_v<Out, bf16> ? 1e-2 : 1e-4;
  EXPECT_LE(RelativeL2(DownloadAsFloat(out_d), out_ref), tolerance);
  EXPECT_LE(RelativeL2(mean_d.Download(), mean), 1e-5);
  EXPECT_LE(RelativeL2(rstd_d.Download(), rstd), 1e-5);
  EXPECT_LE(RelativeL2(din_d.Download(), din_ref), 1e-4);
  EXPECT_LE(RelativeL2(dw_d.Download(), dw_ref), 1e-4);
  EXPECT_LE(RelativeL2(db_d.Download(), db_ref), 1e-4);
}

TEST(UNetOpsTest, GroupNormWithSilu) {
  DT_SKIP_WITHOUT_GPU();
  CheckGroupNorm<float>({2, 32, 81, 8}, 1e-5f, /*silu=*/true);     // a resnet's norm1/norm2
  CheckGroupNorm<float>({1, 64, 4096, 32}, 1e-5f, /*silu=*/true);  // SD's first level at 64²
}

TEST(UNetOpsTest, GroupNormAlone) {
  DT_SKIP_WITHOUT_GPU();
  CheckGroupNorm<float>({2, 16, 36, 4}, 1e-6f, /*silu=*/false);  // the transformer's norm
}

TEST(UNetOpsTest, LayerNormAsGroupNormOfOneGroup) {
  DT_SKIP_WITHOUT_GPU();
  CheckGroupNorm<bf16>({130, 320, 1, 1}, 1e-5f, /*silu=*/false);  // tokens × features
}

TEST(UNetOpsTest, UpsampleAndItsBackward) {
  DT_SKIP_WITHOUT_GPU();
  const int P = 6, H = 5, W = 3;
  const std::vector<float> in = RandomVector(size_t(P) * H * W, 51);
  const std::vector<float> dout = RandomVector(size_t(P) * 4 * H * W, 52);
  const std::vector<float> din0 = RandomVector(in.size(), 53);
  std::vector<float> out_ref(dout.size()), din_ref = din0;
  cpu::Upsample2xForward(out_ref.data(), in.data(), P, H, W);
  cpu::Upsample2xBackward(din_ref.data(), dout.data(), P, H, W);
  DeviceBuffer<float> in_d = UploadFloat(in), dout_d = UploadFloat(dout), din_d = UploadFloat(din0);
  DeviceBuffer<float> out_d(out_ref.size());
  testing::Poison(out_d);
  Upsample2xForward(out_d.data(), in_d.data(), P, H, W, nullptr);
  Upsample2xBackward(din_d.data(), dout_d.data(), P, H, W, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out_d.Download(), out_ref);  // copies: exact
  EXPECT_LE(RelativeL2(din_d.Download(), din_ref), 1e-6);
}

TEST(UNetOpsTest, ConcatChannelsAndItsBackward) {
  DT_SKIP_WITHOUT_GPU();
  const int B = 2, Ca = 3, Cb = 5, HW = 7;
  const std::vector<float> a = RandomVector(size_t(B) * Ca * HW, 54);
  const std::vector<float> b = RandomVector(size_t(B) * Cb * HW, 55);
  std::vector<float> want;
  for (int s = 0; s < B; ++s) {
    want.insert(want.end(), a.begin() + s * Ca * HW, a.begin() + (s + 1) * Ca * HW);
    want.insert(want.end(), b.begin() + s * Cb * HW, b.begin() + (s + 1) * Cb * HW);
  }
  DeviceBuffer<float> a_d = UploadFloat(a), b_d = UploadFloat(b), out_d(want.size());
  testing::Poison(out_d);
  ConcatChannels(out_d.data(), a_d.data(), Ca, b_d.data(), Cb, B, HW, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out_d.Download(), want);
  // Backward of the concatenation of (a, b) with dout = the concatenation itself: each part
  // gets its own values added, doubling them.
  ConcatChannelsBackward(a_d.data(), b_d.data(), out_d.data(), Ca, Cb, B, HW, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> a2 = a, b2 = b;
  for (float& v : a2)
    v *= 2;
  for (float& v : b2)
    v *= 2;
  EXPECT_EQ(a_d.Download(), a2);
  EXPECT_EQ(b_d.Download(), b2);
}

TEST(UNetOpsTest, TokensAndPlanes) {
  DT_SKIP_WITHOUT_GPU();
  const int B = 2, C = 8, T = 5;
  const std::vector<float> x = testing::RoundToBf16(RandomVector(size_t(B) * C * T, 56));
  std::vector<float> tok(x.size());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int t = 0; t < T; ++t)
        tok[(size_t(b) * T + t) * C + c] = x[(size_t(b) * C + c) * T + t];
  DeviceBuffer<float> x_d = UploadFloat(x);
  DeviceBuffer<bf16> tok_d(x.size());
  testing::Poison(tok_d);
  ToTokens(tok_d.data(), x_d.data(), B, C, T, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(tok_d), tok);
  // x + tokens back = 2x; then + v per plane.
  AddFromTokens(x_d.data(), tok_d.data(), B, C, T, nullptr);
  const std::vector<float> v = RandomVector(size_t(B) * C, 57);
  DeviceBuffer<float> v_d = UploadFloat(v);
  AddToPlanes(x_d.data(), v_d.data(), B * C, T, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    want[i] = 2 * x[i] + v[i / T];
  EXPECT_LE(RelativeL2(x_d.Download(), want), 1e-6);
}

TEST(UNetOpsTest, GegluWithExactGelu) {
  DT_SKIP_WITHOUT_GPU();
  const size_t N = 37, F = 40;
  const std::vector<float> in = testing::RoundToBf16(RandomVector(N * 2 * F, 58, 2.0));
  const std::vector<float> dout = testing::RoundToBf16(RandomVector(N * F, 59));
  std::vector<float> out_ref(N * F), din_ref(N * 2 * F, 0.0f);
  cpu::GegluForward(out_ref.data(), in.data(), N, F);
  cpu::GegluBackward(din_ref.data(), dout.data(), in.data(), N, F);
  DeviceBuffer<bf16> in_d = testing::UploadBf16(in), dout_d = testing::UploadBf16(dout);
  DeviceBuffer<bf16> out_d(N * F), din_d(N * 2 * F);
  testing::Poison(out_d);
  testing::Poison(din_d);
  GegluForward(out_d.data(), in_d.data(), N, F, nullptr);
  GegluBackward(din_d.data(), dout_d.data(), in_d.data(), N, F, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(out_d), out_ref), 1e-2);
  EXPECT_LE(RelativeL2(DownloadAsFloat(din_d), din_ref), 1e-2);
}

}  // namespace
}  // namespace difftrain::cuda
