// Fused attention on the GPU against the CPU reference (model/cpu/attention.h) in float, on the
// exact bf16-rounded inputs the GPU reads: out, lse (computed here from the reference scores),
// and the q, k and v parts of dqkv, each on its own. Every output starts poisoned (NaN), so an
// element the kernels never write fails. Shapes cover head dims 64, 72, 128 and 160, a T that is
// not a multiple of the 64-row tiles, and cross-attention (the UNet's attn2: q from the image
// tokens, k and v from a 77-token text, Tq ≠ Tk). The batched-GEMM self-attention
// (model/cuda/gemm_attention.h) and the mma.sync flash kernels (model/cuda/flash_attention.h)
// are held to the same reference and bounds, and so is cuDNN's fused attention
// (model/cuda/cudnn_attention.h) where cuDNN is installed.
#include "model/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/cpu/attention.h"
#include "model/cuda/cudnn_attention.h"
#include "model/cuda/embed.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/flash_short_kernels.h"
#include "model/cuda/gemm_attention.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

// Part p (0: q, 1: k, 2: v) of a [B·T, 3·D] buffer, as [B·T, D].
std::vector<float> Part(const std::vector<float>& qkv, int BT, int D, int p) {
  std::vector<float> r(static_cast<size_t>(BT) * D);
  for (int i = 0; i < BT; ++i)
    std::copy_n(qkv.begin() + static_cast<size_t>(i) * 3 * D + p * D, D,
                r.begin() + static_cast<size_t>(i) * D);
  return r;
}

// lse [B, H, T] of the scaled scores, in double.
std::vector<float> ReferenceLse(const std::vector<float>& qkv, int B, int T, int D, int H) {
  const int hd = D / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<float> lse(static_cast<size_t>(B) * H * T);
  std::vector<double> scores(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < T; ++i) {
        const float* q = qkv.data() + (static_cast<size_t>(b) * T + i) * 3 * D + h * hd;
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < T; ++j) {
          const float* k = qkv.data() + (static_cast<size_t>(b) * T + j) * 3 * D + D + h * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += static_cast<double>(q[d]) * k[d];
          scores[j] = dot * scale;
          max = std::max(max, scores[j]);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j)
          sum += std::exp(scores[j] - max);
        lse[(static_cast<size_t>(b) * H + h) * T + i] = static_cast<float>(max + std::log(sum));
      }
    }
  }
  return lse;
}

// Which kernels a check runs: the fused wmma kernels, the batched-GEMM path or the flash kernels
// (one stage, or two: the *Pipelined functions).
// kFlashStored*: dQ from the stored score gradients (FlashAttentionBackwardStored), one stage or
// two.
// kCudnn: cuDNN's SDPA graphs (model/cuda/cudnn_attention.h).
enum class Kernels {
  kFused,
  kGemm,
  kFlash,
  kFlashPipelined,
  kFlashStored,
  kFlashStoredPipelined,
  kCudnn
};
const char* Name(Kernels k) {
  return k == Kernels::kFused            ? " fused"
         : k == Kernels::kGemm           ? " GEMM path"
         : k == Kernels::kFlash          ? " flash"
         : k == Kernels::kFlashStored    ? " flash, dQ from stored dS"
         : k == Kernels::kFlashPipelined ? " flash, two stages"
         : k == Kernels::kCudnn          ? " cuDNN"
                                         : " flash, two stages, dQ from stored dS";
}

void CheckAttention(int B, int T, int D, int H, Kernels kernels = Kernels::kFused) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << B << " T=" << T << " D=" << D << " H=" << H << Name(kernels));
  const size_t n_qkv = static_cast<size_t>(B) * T * 3 * D, n_out = static_cast<size_t>(B) * T * D;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  // Scale 1.5 makes the softmax rows far from uniform.
  const std::vector<float> qkv = testing::RoundToBf16(testing::RandomVector(n_qkv, 11, 1.5));
  const std::vector<float> dout = testing::RoundToBf16(testing::RandomVector(n_out, 12));

  // CPU reference, in float.
  std::vector<float> out_ref(n_out), probs(static_cast<size_t>(B) * H * T * T), dqkv_ref(n_qkv);
  cpu::AttentionForward(out_ref.data(), probs.data(), qkv.data(), qkv.data(), B, T, T, D, H);
  cpu::AttentionBackward(dqkv_ref.data(), dqkv_ref.data(), dout.data(), qkv.data(), qkv.data(),
                         probs.data(), B, T, T, D, H);
  const std::vector<float> lse_ref = ReferenceLse(qkv, B, T, D, H);

  DeviceBuffer<bf16> qkv_d = testing::UploadBf16(qkv), dout_d = testing::UploadBf16(dout);
  DeviceBuffer<bf16> out_d(n_out), dqkv_d(n_qkv);
  DeviceBuffer<float> lse_d(n_lse), workspace(AttentionBackwardWorkspace(B, T, D, H));
  testing::Poison(out_d);
  testing::Poison(lse_d);
  testing::Poison(dqkv_d);
  testing::Poison(workspace);

  if (kernels == Kernels::kGemm) {
    Gemm lt(nullptr);
    DeviceBuffer<unsigned char> gemm_workspace(GemmAttentionWorkspaceBytes(B, T, D, H));
    testing::Poison(gemm_workspace);
    GemmAttentionForward(lt, out_d.data(), lse_d.data(), qkv_d.data(), gemm_workspace.data(), B, T,
                         D, H);
    GemmAttentionBackward(lt, dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(),
                          lse_d.data(), gemm_workspace.data(), B, T, D, H);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (kernels == Kernels::kCudnn) {
    CudnnAttention cudnn;
    const Status prepared = cudnn.Prepare(B, T, D, H);
    ASSERT_TRUE(prepared.ok()) << prepared.message();
    cudnn.Forward(out_d.data(), lse_d.data(), qkv_d.data(), B, T, D, H, nullptr);
    cudnn.Backward(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(), lse_d.data(), B, T, D,
                   H, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (kernels == Kernels::kFlash) {
    FlashAttentionForward(out_d.data(), lse_d.data(), qkv_d.data(), B, T, D, H, nullptr);
    FlashAttentionBackward(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(), lse_d.data(),
                           workspace.data(), B, T, D, H, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (kernels == Kernels::kFlashStored || kernels == Kernels::kFlashStoredPipelined) {
    const bool two = kernels == Kernels::kFlashStoredPipelined;
    DeviceBuffer<float> stored_workspace(FlashAttentionBackwardStoredWorkspace(B, T, D, H));
    testing::Poison(stored_workspace);
    FlashAttentionForwardPipelined(out_d.data(), lse_d.data(), qkv_d.data(), B, T, D, H, nullptr);
    FlashAttentionBackwardStored(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(),
                                 lse_d.data(), stored_workspace.data(), B, T, D, H,
                                 two ? FlashStages::kTwo : FlashStages::kOne, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (kernels == Kernels::kFlashPipelined) {
    FlashAttentionForwardPipelined(out_d.data(), lse_d.data(), qkv_d.data(), B, T, D, H, nullptr);
    FlashAttentionBackwardPipelined(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(),
                                    lse_d.data(), workspace.data(), B, T, D, H, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    AttentionForward(out_d.data(), lse_d.data(), qkv_d.data(), B, T, D, H, nullptr);
    AttentionBackward(dqkv_d.data(), dout_d.data(), qkv_d.data(), out_d.data(), lse_d.data(),
                      workspace.data(), B, T, D, H, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  EXPECT_LE(testing::RelativeL2(testing::DownloadAsFloat(out_d), out_ref), 1e-2);
  EXPECT_LE(testing::RelativeL2(testing::DownloadAsFloat(lse_d), lse_ref), 1e-3);
  const std::vector<float> dqkv = testing::DownloadAsFloat(dqkv_d);
  const char* names[] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p) {
    SCOPED_TRACE(names[p]);
    EXPECT_LE(testing::RelativeL2(Part(dqkv, B * T, D, p), Part(dqkv_ref, B * T, D, p)), 1e-2);
  }
}

TEST(AttentionTest, HeadDim64) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(2, 64, 384, 6);
}

TEST(AttentionTest, HeadDim72) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(2, 256, 1152, 16);
}

TEST(AttentionTest, PartialTiles) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(2, 100, 128, 2);  // hd 64, T not a multiple of 64
}

TEST(AttentionTest, HeadDim128) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(1, 130, 256, 2);  // also a partial tile
}

TEST(AttentionTest, HeadDim160) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(1, 70, 320, 2);  // SD 1.5's deepest levels: 1280 channels over 8 heads
}

// The batched-GEMM path: DiT-XL/2's heads (hd 72, T 256), DiT-S's (hd 64), a T that is no
// multiple of cuBLASLt's tiles, and the smallest shape it takes (T 8, hd 8).
TEST(GemmAttentionTest, MatchesTheReference) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(2, 256, 1152, 16, Kernels::kGemm);
  CheckAttention(2, 64, 384, 6, Kernels::kGemm);
  CheckAttention(3, 136, 144, 2, Kernels::kGemm);
  CheckAttention(2, 8, 16, 2, Kernels::kGemm);
}

// cuDNN's fused attention at the shapes above that it takes (head dims up to 128), its lse
// (cuDNN's softmax statistics) against the reference's too. Skipped, saying why, without cuDNN.
TEST(AttentionTest, CudnnMatchesTheReference) {
  DT_SKIP_WITHOUT_GPU();
  if (const Status s = CudnnAttentionAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  CheckAttention(2, 64, 384, 6, Kernels::kCudnn);
  CheckAttention(2, 256, 1152, 16, Kernels::kCudnn);
  CheckAttention(2, 100, 128, 2, Kernels::kCudnn);
  CheckAttention(1, 130, 256, 2, Kernels::kCudnn);
  CheckAttention(3, 16, 64, 2, Kernels::kCudnn);  // a tiny DiT's 16 tokens, head dim 32
}

// What it takes is decided without a GPU: multiples of 8, up to kMaxGemmAttentionTokens.
TEST(GemmAttentionTest, TakesShortSequencesOfAlignedHeads) {
  EXPECT_TRUE(GemmAttentionTakes(256, 1152, 16));
  EXPECT_TRUE(GemmAttentionTakes(kMaxGemmAttentionTokens, 1152, 16));
  EXPECT_FALSE(GemmAttentionTakes(kMaxGemmAttentionTokens + 8, 1152, 16));
  EXPECT_FALSE(GemmAttentionTakes(100, 128, 2));  // T not a multiple of 8
  EXPECT_FALSE(GemmAttentionTakes(256, 40, 2));   // hd 20
  EXPECT_GT(GemmAttentionWorkspaceBytes(32, 256, 1152, 16), size_t(32) * 16 * 256 * 256 * 12);
}

// Cross-attention: q [B, Tq, D] alone, k and v side by side in [B, Tk, 2·D] (the UNet's fused
// to_k/to_v output), against the CPU's strided attention.
void CheckCrossAttention(int B, int Tq, int Tk, int D, int H, Kernels kernels = Kernels::kFused) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " Tq=" << Tq << " Tk=" << Tk << " D=" << D
                                    << " H=" << H << Name(kernels));
  using Forward = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, size_t, size_t,
                           int, int, int, int, int, cudaStream_t);
  using Backward =
      void (*)(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*, size_t,
               size_t, const bf16*, const float*, float*, int, int, int, int, int, cudaStream_t);
  const Forward forward = kernels == Kernels::kFlash ? Forward{&FlashAttentionForward}
                          : kernels == Kernels::kFlashPipelined
                              ? Forward{&FlashAttentionForwardPipelined}
                              : Forward{&AttentionForward};
  const Backward backward = kernels == Kernels::kFlash ? Backward{&FlashAttentionBackward}
                            : kernels == Kernels::kFlashPipelined
                                ? Backward{&FlashAttentionBackwardPipelined}
                                : Backward{&AttentionBackward};
  const size_t n_q = size_t(B) * Tq * D, n_kv = size_t(B) * Tk * 2 * D;
  const std::vector<float> q = testing::RoundToBf16(testing::RandomVector(n_q, 21, 1.5));
  const std::vector<float> kv = testing::RoundToBf16(testing::RandomVector(n_kv, 22, 1.5));
  const std::vector<float> dout = testing::RoundToBf16(testing::RandomVector(n_q, 23));

  std::vector<float> out_ref(n_q), probs(size_t(B) * H * Tq * Tk), dq_ref(n_q, 0.0f),
      dkv_ref(n_kv, 0.0f);
  cpu::AttentionForward(out_ref.data(), probs.data(), q.data(), D, kv.data(), kv.data() + D, 2 * D,
                        B, Tq, Tk, D, H);
  cpu::AttentionBackward(dq_ref.data(), dkv_ref.data(), dkv_ref.data() + D, dout.data(), q.data(),
                         D, kv.data(), kv.data() + D, 2 * D, probs.data(), B, Tq, Tk, D, H);

  DeviceBuffer<bf16> q_d = testing::UploadBf16(q), kv_d = testing::UploadBf16(kv);
  DeviceBuffer<bf16> dout_d = testing::UploadBf16(dout);
  DeviceBuffer<bf16> out_d(n_q), dq_d(n_q), dkv_d(n_kv);
  DeviceBuffer<float> lse_d(size_t(B) * H * Tq), workspace(AttentionBackwardWorkspace(B, Tq, D, H));
  testing::Poison(out_d);
  testing::Poison(lse_d);
  testing::Poison(dq_d);
  testing::Poison(dkv_d);
  testing::Poison(workspace);
  forward(out_d.data(), lse_d.data(), q_d.data(), kv_d.data(), kv_d.data() + D, D, 2 * D, B, Tq, Tk,
          D, H, nullptr);
  backward(dq_d.data(), dkv_d.data(), dkv_d.data() + D, dout_d.data(), q_d.data(), kv_d.data(),
           kv_d.data() + D, D, 2 * D, out_d.data(), lse_d.data(), workspace.data(), B, Tq, Tk, D, H,
           nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(testing::RelativeL2(testing::DownloadAsFloat(out_d), out_ref), 1e-2);
  EXPECT_LE(testing::RelativeL2(testing::DownloadAsFloat(dq_d), dq_ref), 1e-2);
  const std::vector<float> dkv = testing::DownloadAsFloat(dkv_d);
  for (int p = 0; p < 2; ++p) {
    SCOPED_TRACE(p == 0 ? "dk" : "dv");
    std::vector<float> got(size_t(B) * Tk * D), want(got.size());
    for (size_t r = 0; r < size_t(B) * Tk; ++r) {
      std::copy_n(dkv.begin() + r * 2 * D + p * D, D, got.begin() + r * D);
      std::copy_n(dkv_ref.begin() + r * 2 * D + p * D, D, want.begin() + r * D);
    }
    EXPECT_LE(testing::RelativeL2(got, want), 1e-2);
  }
}

TEST(AttentionTest, CrossAttentionToText) {
  DT_SKIP_WITHOUT_GPU();
  CheckCrossAttention(2, 100, 77, 128, 2);  // hd 64; both lengths partial tiles
  CheckCrossAttention(1, 64, 7, 40, 5);     // hd 8, fewer keys than one tile
  CheckCrossAttention(1, 16, 77, 320, 2);   // hd 160, more keys than queries
}

TEST(AttentionTest, SmallHeadDimAndSequence) {
  DT_SKIP_WITHOUT_GPU();
  CheckAttention(1, 3, 32, 2);  // hd 16, padded to 64; one partial tile
}

// The tiles' shared memory is a property of the kernels, not of a GPU: every named DiT's head
// dimension (64 for S, B, L and XL's 72 alike) must fit the 99 KiB a kernel may take on
// sm_86/sm_89 GPUs, and the largest (128, and SD 1.5's 160) the 163 KiB of an A100.
TEST(AttentionTest, SharedMemoryFitsTheGpusItTargets) {
  constexpr size_t kSm89 = 99 * 1024, kA100 = 163 * 1024;
  for (const int hd : {8, 64, 72, 80}) {
    EXPECT_LE(AttentionSharedBytes(hd), kSm89) << "head dim " << hd;
  }
  EXPECT_GT(AttentionSharedBytes(128), kSm89);  // what GpuStep::Create refuses on such GPUs
  EXPECT_LE(AttentionSharedBytes(128), kA100);
  EXPECT_LE(AttentionSharedBytes(160), kA100);
}

// The flash kernels, with one stage and two: DiT-XL/2's heads (hd 72, T 256), partial tiles at
// hd 64 and 128 (the 32-row inner tiles), hd 8 over 3 tokens, and Latte's temporal attention (8
// frames over many sequences); cross-attention with fewer keys than a tile and at hd 128.
TEST(FlashAttentionTest, MatchesTheReference) {
  DT_SKIP_WITHOUT_GPU();
  for (const Kernels k : {Kernels::kFlash, Kernels::kFlashPipelined}) {
    CheckAttention(2, 256, 1152, 16, k);
    CheckAttention(2, 100, 128, 2, k);
    CheckAttention(1, 130, 256, 2, k);
    CheckAttention(1, 3, 32, 2, k);
    CheckAttention(64, 8, 1152, 16, k);
    CheckCrossAttention(2, 100, 77, 128, 2, k);
    CheckCrossAttention(1, 64, 7, 40, 5, k);
    CheckCrossAttention(1, 16, 77, 256, 2, k);
  }
  // dQ from the stored score gradients (self-attention): DiT-XL/2's heads, partial tiles at hd
  // 64 and 128, one token.
  for (const Kernels k : {Kernels::kFlashStored, Kernels::kFlashStoredPipelined}) {
    CheckAttention(2, 256, 1152, 16, k);
    CheckAttention(2, 100, 128, 2, k);
    CheckAttention(1, 130, 256, 2, k);
    CheckAttention(1, 1, 32, 2, k);
  }
}

// DiT-XL/2's attention over four images (hd 72, T 256): a packed qkv and an output gradient
// drawn from `seed`, and the backward's workspace.
struct XL2Attention {
  static constexpr int B = 4, T = 256, D = 1152, H = 16;
  static constexpr size_t kQkv = size_t(B) * T * 3 * D, kOut = size_t(B) * T * D;
  DeviceBuffer<bf16> qkv, dout;
  DeviceBuffer<float> workspace{FlashAttentionBackwardWorkspace(B, T, H)};
  explicit XL2Attention(uint64_t seed)
      : qkv(testing::UploadBf16(testing::RandomVector(kQkv, seed, 1.5))),
        dout(testing::UploadBf16(testing::RandomVector(kOut, seed + 1))) {}
};

bool SameBits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

// A bias gradient the kernels added to b0 (got) against the column sums of the dqkv [rows, 3·D]
// they stored: the sums are of its fp32 values, before rounding, so each part's error is measured
// against that part's size (dk's sums being zero but for rounding; see
// model/simt/flash_attention_test.cc).
void ExpectAddsColumnSums(const std::vector<float>& got, const std::vector<float>& b0,
                          const std::vector<bf16>& dqkv, size_t rows, int D) {
  for (int p = 0; p < 3; ++p) {
    double error = 0, size = 0;
    for (int c = 0; c < D; ++c) {
      double sum = 0;
      for (size_t row = 0; row < rows; ++row) {
        const double v = __bfloat162float(dqkv[row * 3 * D + p * D + c]);
        sum += v;
        size += v * v;
      }
      const double increment = double(got[p * D + c]) - b0[p * D + c];
      error += (increment - sum) * (increment - sum);
    }
    EXPECT_LE(std::sqrt(error / size), 2e-3) << "the bias gradient of "
                                             << "qkv"[p];
  }
}

// The two-stage kernels compute what the one-stage kernels do, bit for bit, and so does the
// forward with two m-tiles a warp (one stage and two).
TEST(FlashAttentionTest, TwoStagesGiveTheOneStageBits) {
  DT_SKIP_WITHOUT_GPU();
  using A = XL2Attention;
  A a(33);
  std::vector<bf16> outs[2], grads[2];
  std::vector<float> lses[2];
  for (int stages = 1; stages <= 2; ++stages) {
    DeviceBuffer<bf16> out(A::kOut), dqkv(A::kQkv);
    DeviceBuffer<float> lse(size_t(A::B) * A::H * A::T);
    testing::Poison(out);
    testing::Poison(dqkv);
    using Forward = void (*)(bf16*, float*, const bf16*, int, int, int, int, cudaStream_t);
    using Backward = void (*)(bf16*, const bf16*, const bf16*, const bf16*, const float*, float*,
                              int, int, int, int, cudaStream_t);
    const Forward forward =
        stages == 1 ? Forward{&FlashAttentionForward} : Forward{&FlashAttentionForwardPipelined};
    const Backward backward = stages == 1 ? Backward{&FlashAttentionBackward}
                                          : Backward{&FlashAttentionBackwardPipelined};
    forward(out.data(), lse.data(), a.qkv.data(), A::B, A::T, A::D, A::H, nullptr);
    backward(dqkv.data(), a.dout.data(), a.qkv.data(), out.data(), lse.data(), a.workspace.data(),
             A::B, A::T, A::D, A::H, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    outs[stages - 1] = out.Download();
    grads[stages - 1] = dqkv.Download();
    lses[stages - 1] = lse.Download();
  }
  EXPECT_TRUE(SameBits(outs[0], outs[1])) << "out";
  EXPECT_TRUE(SameBits(grads[0], grads[1])) << "dqkv";
  EXPECT_EQ(0, std::memcmp(lses[0].data(), lses[1].data(), lses[0].size() * sizeof(float)));
  for (const FlashStages stages : {FlashStages::kOne, FlashStages::kTwo}) {
    SCOPED_TRACE(stages == FlashStages::kOne ? "two m-tiles a warp, one stage"
                                             : "two m-tiles a warp, two stages");
    DeviceBuffer<bf16> out(A::kOut);
    DeviceBuffer<float> lse(size_t(A::B) * A::H * A::T);
    testing::Poison(out);
    testing::Poison(lse);
    FlashAttentionForwardWide(out.data(), lse.data(), a.qkv.data(), A::B, A::T, A::D, A::H, stages,
                              nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(SameBits(out.Download(), outs[0])) << "out";
    const std::vector<float> got = lse.Download();
    EXPECT_EQ(0, std::memcmp(got.data(), lses[0].data(), got.size() * sizeof(float))) << "lse";
  }
}

// dQ from the stored score gradients: dK and dV are the recomputing backward's bits (storing
// dSᵀ changes nothing else the dK/dV kernel does), dQ is within bf16 rounding of its dQ (the
// same bf16 dS, up to the fp32 order of two products), and one stage and two agree bit for bit.
TEST(FlashAttentionTest, StoredScoresGiveTheDkDvBits) {
  DT_SKIP_WITHOUT_GPU();
  using A = XL2Attention;
  A a(35);
  DeviceBuffer<bf16> out(A::kOut), recomputed(A::kQkv);
  DeviceBuffer<float> lse(size_t(A::B) * A::H * A::T);
  DeviceBuffer<float> workspace(FlashAttentionBackwardStoredWorkspace(A::B, A::T, A::D, A::H));
  FlashAttentionForwardPipelined(out.data(), lse.data(), a.qkv.data(), A::B, A::T, A::D, A::H,
                                 nullptr);
  FlashAttentionBackwardPipelined(recomputed.data(), a.dout.data(), a.qkv.data(), out.data(),
                                  lse.data(), a.workspace.data(), A::B, A::T, A::D, A::H, nullptr);
  std::vector<bf16> stored[2];
  for (const FlashStages stages : {FlashStages::kOne, FlashStages::kTwo}) {
    DeviceBuffer<bf16> dqkv(A::kQkv);
    testing::Poison(dqkv);
    testing::Poison(workspace);
    FlashAttentionBackwardStored(dqkv.data(), a.dout.data(), a.qkv.data(), out.data(), lse.data(),
                                 workspace.data(), A::B, A::T, A::D, A::H, stages, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    stored[stages == FlashStages::kTwo] = dqkv.Download();
  }
  EXPECT_TRUE(SameBits(stored[0], stored[1])) << "one stage and two";
  const std::vector<bf16> want = recomputed.Download();
  // Per token, the D columns of q, then of k, then of v.
  const auto part = [](const std::vector<bf16>& v, int p) {
    std::vector<float> r;
    for (size_t row = 0; row < size_t(A::B) * A::T; ++row)
      for (int c = 0; c < A::D; ++c)
        r.push_back(__bfloat162float(v[row * 3 * A::D + p * A::D + c]));
    return r;
  };
  EXPECT_TRUE(part(stored[1], 1) == part(want, 1)) << "dk";
  EXPECT_TRUE(part(stored[1], 2) == part(want, 2)) << "dv";
  EXPECT_LE(testing::RelativeL2(part(stored[1], 0), part(want, 0)), 5e-3) << "dq";

  // With a bias gradient: from known values, the same dqkv bits, and b₀ + dqkv's column sums.
  const std::vector<float> b0 = testing::RandomVector(3 * A::D, 36, 2.0);
  DeviceBuffer<float> bias = testing::UploadFloat(b0);
  DeviceBuffer<bf16> dqkv(A::kQkv);
  FlashAttentionBackwardStored(dqkv.data(), a.dout.data(), a.qkv.data(), out.data(), lse.data(),
                               workspace.data(), A::B, A::T, A::D, A::H, FlashStages::kTwo, nullptr,
                               bias.data());
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(SameBits(dqkv.Download(), stored[1])) << "dqkv with the bias gradient";
  ExpectAddsColumnSums(bias.Download(), b0, stored[1], size_t(A::B) * A::T, A::D);
}

// Latte's temporal attention read from the frame-major video in place gives the bits of the
// token-major copy through the dense functions (Latte-L/2's heads: D 1024 over 16; 2 videos of
// 16 frames of 64 tokens), for each stage count and forward.
TEST(FlashAttentionTest, AcrossFramesGivesTheTokenMajorBits) {
  DT_SKIP_WITHOUT_GPU();
  const int B = 2, F = 16, T = 64, D = 1024, H = 16, S = B * T;
  const size_t n = size_t(B) * F * T;
  DeviceBuffer<bf16> qkv = testing::UploadBf16(testing::RandomVector(n * 3 * D, 41, 1.5));
  DeviceBuffer<bf16> dout = testing::UploadBf16(testing::RandomVector(n * D, 42));
  DeviceBuffer<bf16> qkv_t(n * 3 * D), dout_t(n * D), out_t(n * D), dqkv_t(n * 3 * D);
  DeviceBuffer<bf16> out(n * D), dqkv(n * 3 * D), back(n * 3 * D);
  DeviceBuffer<float> lse_t(size_t(S) * H * F), lse(size_t(S) * H * F);
  DeviceBuffer<float> workspace(FlashAttentionBackwardWorkspace(S, F, H));
  SwapAxes(qkv_t.data(), qkv.data(), B, F, T, 3 * D, nullptr);
  SwapAxes(dout_t.data(), dout.data(), B, F, T, D, nullptr);
  for (const FlashStages stages : {FlashStages::kOne, FlashStages::kTwo}) {
    for (const bool wide : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << (stages == FlashStages::kOne ? "one stage" : "two stages")
                   << (wide ? ", two m-tiles a warp" : ""));
      testing::Poison(out);
      testing::Poison(dqkv);
      if (wide) {
        FlashAttentionForwardWide(out_t.data(), lse_t.data(), qkv_t.data(), S, F, D, H, stages,
                                  nullptr);
      } else if (stages == FlashStages::kTwo) {
        FlashAttentionForwardPipelined(out_t.data(), lse_t.data(), qkv_t.data(), S, F, D, H,
                                       nullptr);
      } else {
        FlashAttentionForward(out_t.data(), lse_t.data(), qkv_t.data(), S, F, D, H, nullptr);
      }
      if (stages == FlashStages::kTwo) {
        FlashAttentionBackwardPipelined(dqkv_t.data(), dout_t.data(), qkv_t.data(), out_t.data(),
                                        lse_t.data(), workspace.data(), S, F, D, H, nullptr);
      } else {
        FlashAttentionBackward(dqkv_t.data(), dout_t.data(), qkv_t.data(), out_t.data(),
                               lse_t.data(), workspace.data(), S, F, D, H, nullptr);
      }
      FlashAttentionForwardAcrossFrames(out.data(), lse.data(), qkv.data(), B, F, T, D, H, stages,
                                        wide, nullptr);
      FlashAttentionBackwardAcrossFrames(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                         lse.data(), workspace.data(), B, F, T, D, H, stages,
                                         nullptr);
      // Frame-major results, token-major for the comparison.
      DeviceBuffer<bf16> out_back(n * D);
      SwapAxes(out_back.data(), out.data(), B, F, T, D, nullptr);
      SwapAxes(back.data(), dqkv.data(), B, F, T, 3 * D, nullptr);
      DT_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(SameBits(out_back.Download(), out_t.Download())) << "out";
      EXPECT_TRUE(SameBits(back.Download(), dqkv_t.Download())) << "dqkv";
      const std::vector<float> a = lse.Download(), b = lse_t.Download();
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "lse";
    }
  }
}

// The short-sequence kernels (one warp a sequence and head, at most 16 rows) give the bits of the
// general one-stage kernels: packed qkv at Latte-L/2's heads over 16 frames (37 sequences: the
// last block with a warp idle), hd 72 over 13 rows, hd 128 over one; and Latte's video read in
// place (2 videos of 16 frames of 64 tokens) with and without them; with qkv's bias gradient,
// which they make from their own column sums, the same dqkv and b₀ + its column sums. The
// backward of each reads the general forward's out and lse.
TEST(FlashAttentionTest, ShortKernelsGiveTheGeneralBits) {
  DT_SKIP_WITHOUT_GPU();
  struct Shape {
    int B, T, D, H;
  };
  for (const Shape& s : {Shape{37, 16, 1024, 16}, Shape{5, 13, 144, 2}, Shape{3, 1, 256, 2}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " hd=" << s.D / s.H);
    const size_t n = size_t(s.B) * s.T;
    DeviceBuffer<bf16> qkv = testing::UploadBf16(testing::RandomVector(n * 3 * s.D, 43, 1.5));
    DeviceBuffer<bf16> dout = testing::UploadBf16(testing::RandomVector(n * s.D, 44));
    DeviceBuffer<bf16> out(n * s.D), out_short(n * s.D), dqkv(n * 3 * s.D), dqkv_short(n * 3 * s.D);
    DeviceBuffer<float> lse(size_t(s.B) * s.H * s.T), lse_short(lse.size());
    DeviceBuffer<float> workspace(FlashAttentionBackwardWorkspace(s.B, s.T, s.H));
    testing::Poison(out_short);
    testing::Poison(dqkv_short);
    FlashAttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.D, s.H, nullptr);
    FlashAttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                           workspace.data(), s.B, s.T, s.D, s.H, nullptr);
    FlashAttentionForwardShort(out_short.data(), lse_short.data(), qkv.data(), s.B, s.T, s.D, s.H,
                               nullptr);
    FlashAttentionBackwardShort(dqkv_short.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                s.B, s.T, s.D, s.H, nullptr);
    // With qkv's bias gradient (b₀ + dqkv's column sums): the same dqkv bits.
    const std::vector<float> b0 = testing::RandomVector(3 * s.D, 47, 2.0);
    DeviceBuffer<float> bias = testing::UploadFloat(b0);
    DeviceBuffer<float> sums(FlashAttentionBackwardShortWorkspace(s.B, s.D));
    DeviceBuffer<bf16> dqkv_bias(n * 3 * s.D);
    testing::Poison(sums);
    FlashAttentionBackwardShort(dqkv_bias.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                s.B, s.T, s.D, s.H, nullptr, sums.data(), bias.data());
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(SameBits(out_short.Download(), out.Download())) << "out";
    EXPECT_TRUE(SameBits(dqkv_short.Download(), dqkv.Download())) << "dqkv";
    EXPECT_TRUE(SameBits(dqkv_bias.Download(), dqkv.Download())) << "dqkv with the bias gradient";
    ExpectAddsColumnSums(bias.Download(), b0, dqkv.Download(), n, s.D);
    const std::vector<float> a = lse_short.Download(), b = lse.Download();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "lse";
  }
  const int B = 2, F = 16, T = 64, D = 1024, H = 16, S = B * T;
  const size_t n = size_t(B) * F * T;
  DeviceBuffer<bf16> qkv = testing::UploadBf16(testing::RandomVector(n * 3 * D, 45, 1.5));
  DeviceBuffer<bf16> dout = testing::UploadBf16(testing::RandomVector(n * D, 46));
  DeviceBuffer<bf16> out[2] = {DeviceBuffer<bf16>(n * D), DeviceBuffer<bf16>(n * D)};
  DeviceBuffer<bf16> dqkv[2] = {DeviceBuffer<bf16>(n * 3 * D), DeviceBuffer<bf16>(n * 3 * D)};
  DeviceBuffer<float> lse[2] = {DeviceBuffer<float>(size_t(S) * H * F),
                                DeviceBuffer<float>(size_t(S) * H * F)};
  DeviceBuffer<float> workspace(FlashAttentionBackwardWorkspace(S, F, H));
  for (const int i : {0, 1}) {  // 1: the short kernels
    testing::Poison(out[i]);
    testing::Poison(dqkv[i]);
    FlashAttentionForwardAcrossFrames(out[i].data(), lse[i].data(), qkv.data(), B, F, T, D, H,
                                      FlashStages::kTwo, false, nullptr, i == 1);
    FlashAttentionBackwardAcrossFrames(dqkv[i].data(), dout.data(), qkv.data(), out[0].data(),
                                       lse[0].data(), workspace.data(), B, F, T, D, H,
                                       FlashStages::kTwo, nullptr, i == 1);
  }
  // The short kernels across frames with qkv's bias gradient.
  const std::vector<float> b0 = testing::RandomVector(3 * D, 48, 2.0);
  DeviceBuffer<float> bias = testing::UploadFloat(b0);
  DeviceBuffer<float> sums(FlashAttentionBackwardShortWorkspace(S, D));
  DeviceBuffer<bf16> dqkv_bias(n * 3 * D);
  FlashAttentionBackwardAcrossFrames(dqkv_bias.data(), dout.data(), qkv.data(), out[0].data(),
                                     lse[0].data(), sums.data(), B, F, T, D, H, FlashStages::kTwo,
                                     nullptr, true, bias.data());
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(SameBits(dqkv_bias.Download(), dqkv[0].Download()))
      << "across frames: dqkv with the bias gradient";
  ExpectAddsColumnSums(bias.Download(), b0, dqkv[0].Download(), n, D);
  EXPECT_TRUE(SameBits(out[1].Download(), out[0].Download())) << "across frames: out";
  EXPECT_TRUE(SameBits(dqkv[1].Download(), dqkv[0].Download())) << "across frames: dqkv";
  const std::vector<float> a = lse[1].Download(), b = lse[0].Download();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "across frames: lse";
}

// No atomics: two backward passes give the same bits.
TEST(FlashAttentionTest, BackwardIsDeterministic) {
  DT_SKIP_WITHOUT_GPU();
  using A = XL2Attention;
  A a(31);
  DeviceBuffer<bf16> out(A::kOut), first(A::kQkv), second(A::kQkv);
  DeviceBuffer<float> lse(size_t(A::B) * A::H * A::T);
  FlashAttentionForward(out.data(), lse.data(), a.qkv.data(), A::B, A::T, A::D, A::H, nullptr);
  for (DeviceBuffer<bf16>* dqkv : {&first, &second}) {
    FlashAttentionBackward(dqkv->data(), a.dout.data(), a.qkv.data(), out.data(), lse.data(),
                           a.workspace.data(), A::B, A::T, A::D, A::H, nullptr);
  }
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(SameBits(first.Download(), second.Download()));
}

// What the flash kernels take and the shared memory they need, without a GPU: every head dim
// they take fits the 99 KiB of any sm_80+ GPU.
TEST(FlashAttentionTest, TakesHeadDimsUpTo128InEverySm80Gpu) {
  for (int hd = 8; hd <= 128; hd += 8) {
    EXPECT_TRUE(FlashAttentionTakes(hd)) << hd;
    EXPECT_LE(FlashAttentionSharedBytes(hd), size_t{99} * 1024) << hd;
    EXPECT_LE(FlashAttentionSharedBytes(hd, FlashStages::kTwo), size_t{99} * 1024) << hd;
    // (Equal at hd 128, where the short-sequence backward takes the most.)
    EXPECT_GE(FlashAttentionSharedBytes(hd, FlashStages::kTwo), FlashAttentionSharedBytes(hd));
  }
  // The short-sequence kernels' (four warps a block), at hd 128 the most.
  EXPECT_LE(flash::ShortBackwardSmemBytes<128>(), size_t{99} * 1024);
  EXPECT_LE(flash::ShortForwardSmemBytes<128>(), flash::ShortBackwardSmemBytes<128>());
  EXPECT_TRUE(FlashShortFits(16, 16));
  EXPECT_FALSE(FlashShortFits(17, 16));
  EXPECT_FALSE(FlashAttentionTakes(160));
  EXPECT_FALSE(FlashAttentionTakes(20));
  EXPECT_EQ(FlashAttentionBackwardWorkspace(2, 256, 16), size_t{2} * 16 * 256);
}

}  // namespace
}  // namespace difftrain::cuda
