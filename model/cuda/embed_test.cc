// The patch reshapes and the embeddings on the GPU against model/cpu/embed.h and
// plain loops, at a small shape and DiT-XL/2's latent shape (4×32×32, p = 2, D = 1152).
#include "model/cuda/embed.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/cpu/embed.h"
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
  int B, C, S, p, D;
};

class EmbedTest : public ::testing::TestWithParam<Shape> {
 protected:
  size_t Image() const {
    const Shape& s = GetParam();
    return static_cast<size_t>(s.B) * s.C * s.S * s.S;
  }
  int Tokens() const { return (GetParam().S / GetParam().p) * (GetParam().S / GetParam().p); }
};

TEST_P(EmbedTest, Patchify) {
  DT_SKIP_WITHOUT_GPU();
  const auto [B, C, S, p, D] = GetParam();
  const std::vector<float> x = RoundToBf16(RandomVector(Image(), 1));
  std::vector<float> want(Image());
  cpu::Patchify<float>(want.data(), x.data(), B, C, S, S, p);
  DeviceBuffer<float> d_x = UploadFloat(x);
  DeviceBuffer<bf16> d_patches(Image());
  Poison(d_patches);
  Patchify(d_patches.data(), d_x.data(), B, C, S, p, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(d_patches), want);  // a permutation of bf16-exact values
}

TEST_P(EmbedTest, Unpatchify) {
  DT_SKIP_WITHOUT_GPU();
  const auto [B, C, S, p, D] = GetParam();
  const std::vector<float> tokens = RandomVector(Image(), 2), dout = RandomVector(Image(), 3);
  std::vector<float> want(Image()), want_dtokens(Image(), 0.0f);
  cpu::UnpatchifyForward<float>(want.data(), tokens.data(), B, C, S, S, p);
  cpu::UnpatchifyBackward<float>(want_dtokens.data(), dout.data(), B, C, S, S, p);
  DeviceBuffer<float> d_tokens = UploadFloat(tokens), d_dout = UploadFloat(dout);
  DeviceBuffer<float> d_out(Image()), d_dtokens(Image());
  Poison(d_out);
  Poison(d_dtokens);
  Unpatchify(d_out.data(), d_tokens.data(), B, C, S, p, nullptr);
  UnpatchifyBackward(d_dtokens.data(), d_dout.data(), B, C, S, p, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(d_out), want);
  EXPECT_EQ(DownloadAsFloat(d_dtokens), want_dtokens);
}

TEST_P(EmbedTest, AddPositionEmbedding) {
  DT_SKIP_WITHOUT_GPU();
  const auto [B, C, S, p, D] = GetParam();
  const int T = Tokens();
  const size_t n = static_cast<size_t>(B) * T * D;
  const std::vector<float> emb = RandomVector(n, 4);
  std::vector<float> pos(static_cast<size_t>(T) * D);
  cpu::SinCos2DPositionEmbedding(pos.data(), S / p, D);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i)
    want[i] = emb[i] + pos[i % pos.size()];
  DeviceBuffer<float> d_emb = UploadFloat(emb), d_pos = UploadFloat(pos), d_resid(n);
  Poison(d_resid);
  AddPositionEmbedding(d_resid.data(), d_emb.data(), d_pos.data(), B, T, D, nullptr);
  AddPositionEmbedding(d_emb.data(), d_emb.data(), d_pos.data(), B, T, D, nullptr);  // in place
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_resid), want), 1e-6);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_emb), want), 1e-6);
}

TEST_P(EmbedTest, LabelEmbedding) {
  DT_SKIP_WITHOUT_GPU();
  const auto [B, C, S, p, D] = GetParam();
  const int classes = 11;  // rows 0..10, 10 the null class
  const std::vector<float> table = RandomVector(static_cast<size_t>(classes) * D, 5);
  const std::vector<float> t_emb = RandomVector(static_cast<size_t>(B) * D, 6);
  const std::vector<float> dc = RandomVector(static_cast<size_t>(B) * D, 7);
  const std::vector<float> dtable0 = RandomVector(table.size(), 8);
  std::vector<int32_t> y(B);
  for (int b = 0; b < B; ++b)
    y[b] = b % 2 == 0 ? classes - 1 : (b * 7) % classes;  // repeats: rows shared by samples
  std::vector<float> want_c(static_cast<size_t>(B) * D), want_dtable = dtable0;
  cpu::EmbeddingForward<float>(want_c.data(), table.data(), y.data(), B, D);
  for (size_t i = 0; i < want_c.size(); ++i)
    want_c[i] += t_emb[i];
  cpu::EmbeddingBackward<float>(want_dtable.data(), dc.data(), y.data(), B, D);

  DeviceBuffer<float> d_table = UploadFloat(table), d_temb = UploadFloat(t_emb);
  DeviceBuffer<float> d_dc = UploadFloat(dc), d_dtable = UploadFloat(dtable0);
  DeviceBuffer<float> d_c(want_c.size());
  DeviceBuffer<int32_t> d_y(B);
  d_y.Upload(y);
  Poison(d_c);
  AddLabelEmbedding(d_c.data(), d_temb.data(), d_table.data(), d_y.data(), B, D, nullptr);
  LabelEmbeddingBackward(d_dtable.data(), d_dc.data(), d_y.data(), B, D, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(d_c), want_c);
  EXPECT_EQ(DownloadAsFloat(d_dtable), want_dtable);  // same order of additions as the CPU
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbedTest,
                         ::testing::Values(Shape{3, 3, 6, 3, 20}, Shape{4, 4, 32, 2, 1152}));

class TimestepTest : public ::testing::TestWithParam<int> {};

TEST_P(TimestepTest, Frequencies) {
  DT_SKIP_WITHOUT_GPU();
  const int B = 5, dim = GetParam();
  const std::vector<float> t = {0.0f, 1.0f, 17.0f, 500.0f, 999.0f};
  std::vector<double> td(t.begin(), t.end()), want(static_cast<size_t>(B) * dim);
  cpu::TimestepFrequencies<double>(want.data(), td.data(), B, dim);
  DeviceBuffer<float> d_t = UploadFloat(t);
  DeviceBuffer<bf16> d_out(want.size());
  Poison(d_out);
  TimestepFrequencies(d_out.data(), d_t.data(), B, dim, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = DownloadAsFloat(d_out);
  EXPECT_LE(RelativeL2(got, std::vector<float>(want.begin(), want.end())), 1e-2);
  // Element-wise: each is the reference rounded once to bf16, so within half a bf16 ulp.
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 4e-3) << "at " << i;
}

INSTANTIATE_TEST_SUITE_P(Dims, TimestepTest, ::testing::Values(6, 256));

// Latte's frame-major ↔ token-major reorder: [B, X, Y, w] → [B, Y, X, w], against a plain
// loop, and back again to the input (bf16 values move, never round).
TEST(SwapAxesTest, MatchesLoopAndInvertsItself) {
  DT_SKIP_WITHOUT_GPU();
  const int B = 2, X = 16, Y = 7, w = 3 * 72;  // Latte's 16 frames, a head dim of 72
  const std::vector<float> in = RoundToBf16(RandomVector(size_t(B) * X * Y * w, 9));
  std::vector<float> want(in.size());
  for (int b = 0; b < B; ++b)
    for (int x = 0; x < X; ++x)
      for (int y = 0; y < Y; ++y)
        for (int f = 0; f < w; ++f)
          want[((size_t(b) * Y + y) * X + x) * w + f] = in[((size_t(b) * X + x) * Y + y) * w + f];
  DeviceBuffer<bf16> d_in = UploadBf16(in), d_out(in.size()), d_back(in.size());
  Poison(d_out);
  Poison(d_back);
  SwapAxes(d_out.data(), d_in.data(), B, X, Y, w, nullptr);
  SwapAxes(d_back.data(), d_out.data(), B, Y, X, w, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(DownloadAsFloat(d_out), want);
  EXPECT_EQ(DownloadAsFloat(d_back), in);
}

}  // namespace
}  // namespace difftrain::cuda
