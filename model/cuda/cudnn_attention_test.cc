// cuDNN's attention (model/cuda/cudnn_attention.h). Without a GPU: every shape DiT and Latte
// train with passes the frontend's own validation of the forward and backward graphs for sm_90
// and sm_80, and shapes cuDNN cannot take are refused by name. With one (gpu): the backward
// gives the same bits twice (the deterministic plan), a CUDA graph replays the eager results,
// and a second shape replaces the first. attention_test.cc holds it to the CPU reference with
// the other kernels (Kernels::kCudnn).
#include "model/cuda/cudnn_attention.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "model/cuda/testing.h"
#include "model/dit/config.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain::cuda {
namespace {

#define DT_SKIP_WITHOUT_CUDNN()                                                         \
  do {                                                                                  \
    const Status dt_cudnn_ = CudnnAttentionAvailable();                                 \
    if (!dt_cudnn_.ok()) GTEST_SKIP() << "cuDNN test skipped: " << dt_cudnn_.message(); \
  } while (0)

// The spatial attention of every named DiT (Latte's sizes are DiT's) at 256 and 512 px (32×32
// and 64×64 latents), micro-batches 1 to 256: the frontend validates each graph for the H100
// and the A100. It refuses sm_75 (checked here too, so that the check can fail).
TEST(CudnnAttentionTest, EveryNamedModelsGraphsValidateForHopperAndAmpere) {
  DT_SKIP_WITHOUT_CUDNN();
  const Status turing = CudnnAttentionValidate(32, 256, 1152, 16, 75);
  ASSERT_FALSE(turing.ok());
  EXPECT_NE(turing.message().find("SM80"), std::string::npos) << turing.message();
  for (const std::string& name : DiTConfigNames()) {
    for (int input : {32, 64}) {
      const DiTConfig c = DiTConfigByName(name, input).value();
      for (int B : {1, 32, 256}) {
        for (int sm : {90, 80}) {
          SCOPED_TRACE(::testing::Message()
                       << name << " input " << input << " B " << B << " sm " << sm);
          const Status s = CudnnAttentionValidate(B, c.tokens(), c.hidden_size, c.num_heads, sm);
          EXPECT_TRUE(s.ok()) << s.message();
        }
      }
    }
  }
}

TEST(CudnnAttentionTest, RefusesHeadDimsItCannotTakeByName) {
  const Status odd = CudnnAttentionValidate(2, 64, 60, 2, 90);  // hd 30
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("head dim"), std::string::npos) << odd.message();
  const Status wide = CudnnAttentionValidate(2, 64, 320, 2, 90);  // hd 160
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.message().find("head dim"), std::string::npos) << wide.message();
  CudnnAttention attention;
  const Status prepare = attention.Prepare(2, 64, 60, 2);
  ASSERT_FALSE(prepare.ok());
  EXPECT_NE(prepare.message().find("B=2 T=64 D=60 H=2"), std::string::npos) << prepare.message();
}

// The self-attention of every named UNet (SD1.5, SD2-base, SD2-v and the small ones) at its own
// latent size and half of it, micro-batches 1 to 32: each level whose head dim cuDNN takes
// validates for the H100 and the A100; the others (SD1.5's 160) are refused by name and left to
// the fused kernels (UNet::Options::cudnn_attention).
TEST(CudnnAttentionTest, EveryNamedUNetsSelfAttentionValidatesOrIsRefusedByName) {
  DT_SKIP_WITHOUT_CUDNN();
  int validated = 0, refused = 0;
  for (const std::string& name : UNetConfigNames()) {
    UNetConfig c = UNetConfigByName(name).value();
    for (int size : {c.sample_size, c.sample_size / 2}) {
      c.sample_size = size;
      const UNetPlan plan(c);
      for (const UNetNode& n : plan.nodes) {
        if (n.kind != UNetNodeKind::kTransformer) continue;
        const int T = plan.out(n).H * plan.out(n).W, C = plan.out(n).C;
        for (int B : {1, 32}) {
          for (int sm : {90, 80}) {
            SCOPED_TRACE(::testing::Message()
                         << name << " " << n.prefix << " T " << T << " C " << C << " heads "
                         << n.heads << " B " << B << " sm " << sm);
            const Status s = CudnnAttentionValidate(B, T, C, n.heads, sm);
            if (CudnnAttentionTakes(C / n.heads)) {
              EXPECT_TRUE(s.ok()) << s.message();
              ++validated;
            } else {
              ASSERT_FALSE(s.ok());
              EXPECT_NE(s.message().find("head dim"), std::string::npos) << s.message();
              ++refused;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(validated, 0);
  EXPECT_GT(refused, 0);  // SD1.5's deepest levels
}

// A set hands out one attention a shape and prepares them together: on a GPU with cuDNN, each
// gets its plans; elsewhere the error names the shape that failed first.
TEST(CudnnAttentionSetTest, OneAttentionAShapePreparedTogether) {
  CudnnAttentionSet set;
  CudnnAttention* a = set.Get(2, 4096, 320, 5);
  EXPECT_EQ(set.Get(2, 4096, 320, 5), a);
  CudnnAttention* b = set.Get(2, 1024, 640, 10);
  EXPECT_NE(b, a);
  EXPECT_EQ(set.size(), 2);
  const Status s = set.Prepare();
  if (testing::NoGpuReason().empty() && CudnnAttentionAvailable().ok()) {
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_GT(a->workspace_bytes(), 0u);
    EXPECT_EQ(set.workspace_bytes(), a->workspace_bytes() + b->workspace_bytes());
  } else {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("cuDNN attention at B=2 T=1024 D=640 H=10"), std::string::npos)
        << s.message();  // the map's first
    EXPECT_EQ(set.workspace_bytes(), 0u);
  }
  set.Clear();
  EXPECT_EQ(set.size(), 0);
}

// Without a GPU, Prepare is an error that says so, never a crash.
TEST(CudnnAttentionTest, PrepareWithoutAGpuIsAnError) {
  DT_SKIP_WITHOUT_CUDNN();
  if (testing::NoGpuReason().empty()) GTEST_SKIP() << "a GPU is here";
  CudnnAttention attention;
  const Status s = attention.Prepare(2, 256, 1152, 16);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cuDNN"), std::string::npos) << s.message();
  EXPECT_EQ(attention.workspace_bytes(), 0u);
}

// Out, lse and dqkv of one forward and backward at a shape, on `stream` (or captured into a
// CUDA graph and launched), from fixed random inputs.
struct Results {
  std::vector<bf16> out, dqkv;
  std::vector<float> lse;
};
Results RunOnce(CudnnAttention& attention, int B, int T, int D, int H, bool captured) {
  const Status prepared = attention.Prepare(B, T, D, H);
  EXPECT_TRUE(prepared.ok()) << prepared.message();
  if (!prepared.ok()) return {};
  const size_t n_qkv = size_t(B) * T * 3 * D, n_out = size_t(B) * T * D;
  DeviceBuffer<bf16> qkv = testing::UploadBf16(testing::RandomVector(n_qkv, 5, 1.5));
  DeviceBuffer<bf16> dout = testing::UploadBf16(testing::RandomVector(n_out, 6));
  DeviceBuffer<bf16> out(n_out), dqkv(n_qkv);
  DeviceBuffer<float> lse(size_t(B) * H * T);
  testing::Poison(out);
  testing::Poison(dqkv);
  testing::Poison(lse);
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto step = [&] {
    attention.Forward(out.data(), lse.data(), qkv.data(), B, T, D, H, stream);
    attention.Backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, D, H,
                       stream);
  };
  if (captured) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    DT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    DT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));
    DT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    DT_CUDA_CHECK(cudaGraphDestroy(graph));
  } else {
    step();
  }
  DT_CUDA_CHECK(cudaStreamSynchronize(stream));
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
  return {out.Download(), dqkv.Download(), lse.Download()};
}

bool SameBits(const Results& a, const Results& b) {
  const auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  return same(a.out, b.out) && same(a.dqkv, b.dqkv) && same(a.lse, b.lse);
}

// The backward is cuDNN's deterministic one, so two runs give the same bits; a captured graph
// gives eager launches' bits; preparing another shape and coming back gives them again.
TEST(CudnnAttentionTest, SameBitsTwiceCapturedAndAfterAnotherShape) {
  DT_SKIP_WITHOUT_GPU();
  DT_SKIP_WITHOUT_CUDNN();
  CudnnAttention attention;
  const Results first = RunOnce(attention, 4, 256, 1152, 16, /*captured=*/false);
  ASSERT_FALSE(first.out.empty());
  EXPECT_GT(attention.workspace_bytes(), 0u);
  EXPECT_GE(attention.version(), 90000);
  std::printf("note: cuDNN %d, workspace %zu bytes at B=4 T=256 D=1152 H=16\n", attention.version(),
              attention.workspace_bytes());
  EXPECT_TRUE(SameBits(first, RunOnce(attention, 4, 256, 1152, 16, false))) << "a second run";
  EXPECT_TRUE(SameBits(first, RunOnce(attention, 4, 256, 1152, 16, true))) << "a CUDA graph";
  const Results other = RunOnce(attention, 2, 64, 384, 6, false);
  ASSERT_FALSE(other.out.empty());
  EXPECT_TRUE(SameBits(first, RunOnce(attention, 4, 256, 1152, 16, false))) << "after B=2 T=64";
}

}  // namespace
}  // namespace difftrain::cuda
