// The GPU convolution (im2col + cuBLASLt) against the CPU's (model/cpu/conv2d.h) in float on
// the bf16-rounded inputs the GPU reads: out, and the input, weight and bias gradients, for
// every convolution the UNet has — 3×3 of stride 1 and 2 with padding 1, the 1×1 shortcut, and
// conv_in and conv_out, whose 4 channels make the GEMM's padded path. Outputs start poisoned
// (NaN); the gradients start from a known value, since backward adds into them.
#include "model/cuda/conv2d.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

void CheckConv(const cpu::Conv2dShape& s) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << s.B << " C=" << s.C << " H=" << s.H << " W=" << s.W << " Co=" << s.Co
               << " K=" << s.K << " S=" << s.S << " P=" << s.P);
  const Conv2d conv(s);
  const size_t n_in = conv.in_size(), n_out = conv.out_size();
  const size_t n_w = size_t(s.Co) * s.C * s.K * s.K;
  const std::vector<float> in = testing::RoundToBf16(testing::RandomVector(n_in, 31));
  const std::vector<float> w = testing::RoundToBf16(testing::RandomVector(n_w, 32, 0.2));
  const std::vector<float> bias = testing::RandomVector(s.Co, 33);
  const std::vector<float> dout = testing::RoundToBf16(testing::RandomVector(n_out, 34));
  const std::vector<float> din0 = testing::RandomVector(n_in, 35);
  const std::vector<float> dw0 = testing::RandomVector(n_w, 36),
                           db0 = testing::RandomVector(s.Co, 37);

  std::vector<float> out_ref(n_out), din_ref = din0, dw_ref = dw0, db_ref = db0;
  cpu::Conv2dForward(out_ref.data(), in.data(), w.data(), bias.data(), s);
  cpu::Conv2dBackward(din_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), in.data(),
                      w.data(), s);

  cudaStream_t stream = nullptr;
  Gemm gemm(stream);
  DeviceBuffer<float> in_d = testing::UploadFloat(in), bias_d = testing::UploadFloat(bias);
  DeviceBuffer<float> dout_d = testing::UploadFloat(dout), din_d = testing::UploadFloat(din0);
  DeviceBuffer<float> dw_d = testing::UploadFloat(dw0), db_d = testing::UploadFloat(db0);
  DeviceBuffer<bf16> w_d = testing::UploadBf16(w);
  DeviceBuffer<float> out_d(n_out);
  DeviceBuffer<unsigned char> workspace(conv.WorkspaceBytes());
  testing::Poison(out_d);
  testing::Poison(workspace);
  conv.Forward(gemm, out_d.data(), in_d.data(), w_d.data(), bias_d.data(), false, workspace.data(),
               stream);
  conv.Backward(gemm, din_d.data(), dw_d.data(), db_d.data(), dout_d.data(), in_d.data(),
                w_d.data(), workspace.data(), stream);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(testing::RelativeL2(out_d.Download(), out_ref), 1e-2);
  EXPECT_LE(testing::RelativeL2(din_d.Download(), din_ref), 1e-2);
  EXPECT_LE(testing::RelativeL2(dw_d.Download(), dw_ref), 1e-2);
  EXPECT_LE(testing::RelativeL2(db_d.Download(), db_ref), 1e-4);  // fp32 sums

  // `accumulate` adds onto what out holds.
  std::vector<float> twice(n_out);
  for (size_t i = 0; i < n_out; ++i)
    twice[i] = 2 * out_ref[i];
  conv.Forward(gemm, out_d.data(), in_d.data(), w_d.data(), bias_d.data(), true, workspace.data(),
               stream);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(testing::RelativeL2(out_d.Download(), twice), 1e-2);
}

TEST(Conv2dTest, ThreeByThreeStrideOne) {
  DT_SKIP_WITHOUT_GPU();
  CheckConv({2, 16, 9, 7, 24, 3, 1, 1});
}

TEST(Conv2dTest, ThreeByThreeStrideTwo) {
  DT_SKIP_WITHOUT_GPU();
  CheckConv({2, 16, 8, 8, 16, 3, 2, 1});  // a downsampler
  CheckConv({1, 8, 7, 5, 8, 3, 2, 1});    // odd sizes
}

TEST(Conv2dTest, OneByOneShortcut) {
  DT_SKIP_WITHOUT_GPU();
  CheckConv({2, 24, 6, 6, 16, 1, 1, 0});
}

TEST(Conv2dTest, PaddedChannelsOfConvInAndConvOut) {
  DT_SKIP_WITHOUT_GPU();
  CheckConv({2, 4, 8, 8, 16, 3, 1, 1});  // conv_in: C·K·K = 36 → 40
  CheckConv({2, 16, 8, 8, 4, 3, 1, 1});  // conv_out: Co = 4 → 8
}

// The workspace sizes are a property of the shape, with or without a GPU.
TEST(Conv2dTest, WorkspaceCoversTheColumnsAndThePadding) {
  const Conv2d plain({2, 16, 8, 8, 16, 3, 1, 1});
  EXPECT_GE(plain.WorkspaceBytes(), size_t(2) * 64 * 144 * 2 * 2);  // columns + their gradient
  const Conv2d padded({2, 4, 8, 8, 16, 3, 1, 1});
  EXPECT_GE(padded.WorkspaceBytes(), size_t(2) * 64 * 40 * 2 + 16 * 40 * (2 + 4));
}

}  // namespace
}  // namespace difftrain::cuda
