// The GPU DiT step against the CPU model (model/dit/dit.h) on the same weights and batch:
// output, loss and every parameter's gradient (DiT, and Latte's videos); the CUDA graph
// against eager launches; and a few optimizer steps that must fit one batch.
#include "model/dit/cuda/dit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "model/cuda/cudnn_attention.h"
#include "model/cuda/testing.h"
#include "model/dit/dit.h"

namespace difftrain::cuda {
namespace {

using testing::RelativeL2;

struct Batch {
  std::vector<float> x, t, target;
  std::vector<int32_t> y;
};

Batch RandomBatch(const DiTConfig& c, int B, uint64_t seed) {
  const size_t image = size_t(c.frames()) * c.in_channels * c.input_size * c.input_size;
  Batch batch{testing::RandomVector(B * image, seed), std::vector<float>(B),
              testing::RandomVector(B * image, seed + 1), std::vector<int32_t>(B)};
  Rng rng(seed, RngStream::kNoise);
  for (int b = 0; b < B; ++b) {
    batch.t[b] = static_cast<float>(rng.Below(1000));
    // The null class too; 0 for a model without labels.
    batch.y[b] = c.has_labels() ? static_cast<int32_t>(rng.Below(c.label_rows())) : 0;
  }
  return batch;
}

void Upload(DiT& model, const Batch& batch) {
  auto copy = [&](void* to, const void* from, size_t bytes) {
    DT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, model.stream()));
  };
  copy(model.input_x(), batch.x.data(), batch.x.size() * sizeof(float));
  copy(model.input_t(), batch.t.data(), batch.t.size() * sizeof(float));
  copy(model.input_target(), batch.target.data(), batch.target.size() * sizeof(float));
  copy(model.input_y(), batch.y.data(), batch.y.size() * sizeof(int32_t));
  DT_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
}

// Random weights (every path carries signal), rounded to bf16: the GPU computes with the bf16
// copy of its weights, so the CPU reference takes the same values and the comparison sees
// only the bf16 rounding of activations.
std::vector<float> RandomBf16Weights(difftrain::DiT& cpu) {
  cpu.InitializeRandom(/*seed=*/5);
  std::vector<float> w(cpu.params(), cpu.params() + cpu.num_params());
  w = testing::RoundToBf16(w);
  std::memcpy(cpu.params(), w.data(), w.size() * sizeof(float));
  return w;
}

// The CPU loss of DiT's ε-MSE on the first C channels (of every frame: B counts frames) and
// its output gradient.
float CpuLoss(const DiTConfig& c, int B, const float* out, const std::vector<float>& target,
              std::vector<float>& dout) {
  const size_t hw = size_t(c.input_size) * c.input_size;
  const size_t n = B * c.in_channels * hw;
  dout.assign(B * c.out_channels() * hw, 0.0f);
  double sum = 0;
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < c.in_channels * hw; ++i) {
      const size_t o = b * c.out_channels() * hw + i;
      const double e = double(out[o]) - target[b * c.in_channels * hw + i];
      sum += e * e;
      dout[o] = static_cast<float>(2 * e / n);
    }
  }
  return static_cast<float>(sum / n);
}

// The CPU model's step on random bf16-rounded weights and a random batch: the reference.
struct CpuStep {
  std::vector<float> weights;
  Batch batch;
  std::vector<float> out, grads;
  float loss;
};

CpuStep RunCpuStep(const DiTConfig& c, int B) {
  difftrain::DiT cpu(c);
  CpuStep r{RandomBf16Weights(cpu), RandomBatch(c, B, /*seed=*/11), {}, {}, 0};
  const float* cpu_out = cpu.Forward(r.batch.x.data(), r.batch.t.data(), r.batch.y.data(), B);
  const size_t out_size = size_t(B) * c.frames() * c.out_channels() * c.input_size * c.input_size;
  r.out.assign(cpu_out, cpu_out + out_size);
  std::vector<float> dout;
  r.loss = CpuLoss(c, B * c.frames(), cpu_out, r.batch.target, dout);
  std::memset(cpu.grads(), 0, cpu.num_params() * sizeof(float));
  cpu.Backward(dout.data());
  r.grads.assign(cpu.grads(), cpu.grads() + cpu.num_params());
  return r;
}

// The GPU model's output and loss against the CPU step's within `tolerance` (relative L2, and
// relatively), each tensor's gradient within `grad_tolerance`; `warmup` steps first (FP8's
// scales come from the steps before), their gradients discarded.
void ExpectGpuStepNear(const DiTConfig& c, int B, const DiT::Options& options, const CpuStep& want,
                       double tolerance, double grad_tolerance, int warmup = 0) {
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DiT gpu(c, stream, options);
    const Status reserved = gpu.Reserve(B);
    ASSERT_TRUE(reserved.ok()) << reserved.message();
    gpu.UploadState(want.weights.data(), want.weights.data(), nullptr, nullptr);
    gpu.PoisonActivations();
    Upload(gpu, want.batch);
    for (int i = 0; i <= warmup; ++i) {
      gpu.ZeroGradients();
      gpu.ForwardBackward();
    }
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));

    std::vector<float> out(want.out.size());
    DT_CUDA_CHECK(
        cudaMemcpy(out.data(), gpu.output(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_LE(RelativeL2(out, want.out), tolerance);
    EXPECT_NEAR(gpu.last_loss(), want.loss, tolerance * want.loss);

    const std::vector<float> grads = gpu.DownloadGradients();
    for (const TensorSpec& t : gpu.parameter_table().tensors()) {
      const std::vector<float> got(grads.begin() + t.offset, grads.begin() + t.offset + t.numel);
      const std::vector<float> w(want.grads.begin() + t.offset,
                                 want.grads.begin() + t.offset + t.numel);
      EXPECT_LE(RelativeL2(got, w), grad_tolerance) << t.name;
    }
    if (options.fp8) {
      std::printf("note: FP8 step of %s: %d products ran in bf16 (no cuBLASLt FP8 algorithm)\n",
                  c.name.c_str(), gpu.fp8_bf16_fallbacks());
    }
  }
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
}

void ExpectStepMatchesCpu(const DiTConfig& c, int B,
                          AttentionKernels attention = AttentionKernels::kGemm,
                          FlashVariant flash = {}) {
  SCOPED_TRACE(attention == AttentionKernels::kGemm    ? "spatial attention as batched GEMMs"
               : attention == AttentionKernels::kFused ? "fused attention"
               : attention == AttentionKernels::kCudnn ? "cuDNN's attention (flash across frames)"
                                                       : "flash attention");
  SCOPED_TRACE(::testing::Message()
               << "flash stages " << (flash.stages == FlashStages::kTwo ? 2 : 1)
               << (flash.wide_forward ? ", two m-tiles a warp in the forward" : "")
               << (flash.short_sequences ? ", short-sequence kernels where T <= 16" : ""));
  ExpectGpuStepNear(c, B, {.use_graph = false, .attention = attention, .flash = flash},
                    RunCpuStep(c, B), 1e-2, 1e-2);
}

DiTConfig Tiny() {
  DiTConfig c;
  c.input_size = 8;
  c.patch_size = 2;
  c.in_channels = 4;
  c.hidden_size = 64;
  c.depth = 2;
  c.num_heads = 2;
  c.num_classes = 10;
  c.learn_sigma = false;
  return c;
}

// What the GPU step takes is decided without a GPU: DiT-XL/2 and Latte-XL/2 are taken; a hidden
// size beyond the LayerNorm kernels' widest rows is refused by name.
TEST(CudaDiTSupport, TakesXLAndRefusesRowsBeyondTheNormKernels) {
  EXPECT_TRUE(DiT::Supports(DiTConfigByName("DiT-XL/2", 32).value()).ok());
  EXPECT_TRUE(DiT::Supports(SizedConfigByName("Latte", "Latte-XL/2", 32).value()).ok());
  DiTConfig c = Tiny();
  c.depth = 1;
  c.hidden_size = GatedResidualNormMaxWidth() + 128;
  c.num_heads = c.hidden_size / 128;
  const Status s = DiT::Supports(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("hidden sizes up to 8192"), std::string::npos) << s.message();
}

// The attention kernels' grids, without a GPU: Latte-L/2 over 32 frames of 32×32 latents (256
// tokens a frame) at 256 videos puts 65,536 sequences across frames in the temporal blocks, one
// more than a grid's z; over 16 frames the short-sequence kernels (one dimension) take them,
// unless turned off; a DiT's frames count in the spatial blocks.
TEST(CudaDiTSupport, MicroBatchesPastTheGridsAreRefusedByName) {
  DiTConfig latte = SizedConfigByName("Latte", "Latte-L/2", 32).value();
  latte.video = true;
  latte.num_frames = 32;
  EXPECT_TRUE(DiT::TakesMicroBatch(latte, 255, {}).ok());
  const Status s = DiT::TakesMicroBatch(latte, 256, {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("65536 sequences across frames"), std::string::npos) << s.message();
  latte.num_frames = 16;
  EXPECT_TRUE(DiT::TakesMicroBatch(latte, 256, {}).ok());
  DiT::Options general;
  general.flash.short_sequences = false;
  EXPECT_FALSE(DiT::TakesMicroBatch(latte, 256, general).ok());
  // The batched-GEMM attention in the spatial blocks; the temporal ones on the fused kernels.
  EXPECT_FALSE(
      DiT::TakesMicroBatch(latte, 256, {.attention = AttentionKernels::kGemm, .flash = {}}).ok());
  const DiTConfig xl = DiTConfigByName("DiT-XL/2", 32).value();
  EXPECT_TRUE(DiT::TakesMicroBatch(xl, 65535, {}).ok());
  EXPECT_FALSE(DiT::TakesMicroBatch(xl, 65536, {}).ok());
  EXPECT_TRUE(
      DiT::TakesMicroBatch(xl, 65536, {.attention = AttentionKernels::kGemm, .flash = {}}).ok());
}

// What a model allocates is known without a GPU, to the byte: DiT-XL/2 as the H100 allocated it
// (bench_cuda_dit's model_device_gib, 2026-11-27, docs/benchmarks.md), less what the fused
// norm's backward workspace has shrunk by since (it ran at 16 rows a block, now 32), and
// Latte-L/2 over 16 frames likewise; and plus what the flash backward's workspace has grown by
// since, by the score gradients it now stores (FlashVariant::stored_scores: the spatial
// attention's 256 tokens take it, Latte's 16 frames do not), the arena's last slice.
TEST(CudaDiTSupport, DeviceBytesWithoutAGpuAreWhatTheH100Allocated) {
  const auto allocated = [](double gib) { return static_cast<size_t>(gib * (1u << 30)); };
  const auto since = [](const DiTConfig& c, int B) {
    const int T = c.frames() * c.tokens(), H = c.num_heads, F = c.frames(), BF = B * F;
    const size_t norm_shrank = (GatedResidualNormWorkspace(B, T, c.hidden_size, 16) -
                                GatedResidualNormWorkspace(B, T, c.hidden_size)) *
                               sizeof(float);
    const size_t then =
        std::max(FlashAttentionBackwardWorkspace(BF, c.tokens(), H),
                 c.video ? FlashAttentionBackwardWorkspace(B * c.tokens(), F, H) : size_t{0});
    const size_t now = FlashAttentionBackwardStoredWorkspace(BF, c.tokens(), c.hidden_size, H);
    return static_cast<std::ptrdiff_t>(norm_shrank) -
           static_cast<std::ptrdiff_t>((now - then) * sizeof(float));
  };
  const DiTConfig xl = DiTConfigByName("DiT-XL/2", 32).value();
  for (const auto& [B, gib] : {std::pair{32, 23.977188535034657}, {128, 54.425120778381824}}) {
    EXPECT_EQ(DiT::StateBytes(xl) + DiT::ActivationBytes(xl, B) + since(xl, B), allocated(gib))
        << "micro-batch " << B;
  }
  DiTConfig latte = SizedConfigByName("Latte", "Latte-L/2", 32).value();
  latte.video = true;
  latte.num_frames = 16;
  latte.num_classes = 0;
  EXPECT_EQ(DiT::StateBytes(latte) + DiT::ActivationBytes(latte, 8) + since(latte, 8),
            allocated(40.37308640033007));
  // The stored score gradients at micro-batch 32, B·H·T·T bf16 (64 MiB), and the qkv bias's
  // column sums, B·⌈T/64⌉ rows of 3·D fp32 (1.7 MiB): what recomputing them does without.
  DiT::Options recompute;
  recompute.flash.stored_scores = false;
  EXPECT_EQ(
      DiT::ActivationBytes(xl, 32) - DiT::ActivationBytes(xl, 32, recompute),
      size_t{32} * 16 * 256 * 256 * sizeof(uint16_t) + size_t{32} * 4 * 3 * 1152 * sizeof(float));
  // The batched-GEMM attention keeps every head's scores: more than flash's.
  EXPECT_GT(DiT::ActivationBytes(xl, 32, {.attention = AttentionKernels::kGemm, .flash = {}}),
            DiT::ActivationBytes(xl, 32));
}

// What a step's first micro-batch zeroes (no GPU needed): exactly the tensors that are not a
// Linear's weight (named "*.weight", the label table aside, whose gradient is scattered into),
// as sorted, disjoint, merged ranges. DiT-XL/2, Latte-L/2 over 16 frames without classes, and
// the tiny DiT.
TEST(CudaDiTSupport, FirstMicroBatchZeroesEveryTensorButTheGemmWeights) {
  const auto gemm_weight = [](const TensorSpec& t) {
    const std::string suffix = ".weight";
    return t.name.size() > suffix.size() &&
           t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
           t.name != "y_embedder.embedding_table.weight";
  };
  DiTConfig latte = SizedConfigByName("Latte", "Latte-L/2", 32).value();
  latte.video = true;
  latte.num_frames = 16;
  latte.num_classes = 0;
  // The share of the parameters that are GEMM weights, at least (the tiny DiT's label table
  // is large beside its layers).
  for (const auto& [c, share] : {std::pair{DiTConfigByName("DiT-XL/2", 32).value(), 0.99},
                                 std::pair{latte, 0.99}, std::pair{Tiny(), 0.9}}) {
    SCOPED_TRACE(c.video ? "Latte" : "DiT");
    const TensorTable table = ShardParameters(c, DiTShard::Whole(c)).table;
    const std::vector<uint64_t> ranges =
        DiT::FirstMicroBatchZeroes(table, DiTParams::Bind(table, DiTShard::Whole(c)));
    ASSERT_EQ(ranges.size() % 2, 0u);
    for (size_t r = 0; r < ranges.size(); r += 2) {
      ASSERT_LE(ranges[r] + ranges[r + 1], table.total());
      if (r > 0) {
        ASSERT_LT(ranges[r - 2] + ranges[r - 1], ranges[r]) << "unsorted or unmerged";
      }
    }
    // How many of [begin, end) the ranges cover (they are sorted and disjoint); by intervals,
    // not a flag an element: the two models hold 1.4 billion parameters between them.
    const auto covered = [&](uint64_t begin, uint64_t end) {
      uint64_t n = 0;
      for (size_t r = 0; r < ranges.size(); r += 2) {
        const uint64_t lo = std::max(begin, ranges[r]);
        const uint64_t hi = std::min(end, ranges[r] + ranges[r + 1]);
        n += hi > lo ? hi - lo : 0;
      }
      return n;
    };
    size_t weights = 0;
    for (const TensorSpec& t : table.tensors()) {
      const bool gemm = gemm_weight(t);
      weights += gemm ? t.numel : 0;
      EXPECT_EQ(covered(t.offset, t.offset + t.numel), gemm ? 0u : uint64_t{t.numel}) << t.name;
    }
    EXPECT_GT(double(weights), share * double(table.total()));
  }
}

TEST(CudaDiTTest, TinyStepMatchesTheCpuModel) {
  DT_SKIP_WITHOUT_GPU();
  ExpectStepMatchesCpu(Tiny(), /*B=*/3);
  ExpectStepMatchesCpu(Tiny(), /*B=*/3, AttentionKernels::kFused);
  // The default variant (its 16 tokens take the short-sequence kernels), and the general
  // kernels with two stages and one (16 tokens leave the wide forward's block mostly empty, so
  // the 16-row forward runs).
  ExpectStepMatchesCpu(Tiny(), /*B=*/3, AttentionKernels::kFlash);
  ExpectStepMatchesCpu(Tiny(), /*B=*/3, AttentionKernels::kFlash,
                       {FlashStages::kTwo, true, true, /*short_sequences=*/false});
  ExpectStepMatchesCpu(Tiny(), /*B=*/3, AttentionKernels::kFlash,
                       {FlashStages::kOne, false, true, false});
}

// Latte: a video of 4 frames (spatial and temporal blocks, the temporal embedding), with
// classes and without; and Latte-S/4 over 8 frames of 32×32 latents (64 tokens a frame).
TEST(CudaDiTTest, LatteStepsMatchTheCpuModel) {
  DT_SKIP_WITHOUT_GPU();
  DiTConfig c = Tiny();
  c.video = true;
  c.num_frames = 4;
  ExpectStepMatchesCpu(c, /*B=*/3);
  // Spatial and temporal blocks, each 16 rows or fewer: the short-sequence kernels, then the
  // general ones.
  ExpectStepMatchesCpu(c, /*B=*/3, AttentionKernels::kFlash);
  ExpectStepMatchesCpu(c, /*B=*/3, AttentionKernels::kFlash,
                       {FlashStages::kOne, false, true, /*short_sequences=*/false});
  c.num_classes = 0;
  ExpectStepMatchesCpu(c, /*B=*/2);
  DiTConfig s4 = SizedConfigByName("Latte", "Latte-S/4", 32).value();
  s4.video = true;
  s4.num_frames = 8;
  ExpectStepMatchesCpu(s4, /*B=*/2);
  // Flash: the spatial blocks' 64 tokens on the general kernels, the temporal blocks' 8 frames
  // on the short-sequence ones.
  ExpectStepMatchesCpu(s4, /*B=*/2, AttentionKernels::kFlash);
}

// DiT-S/2 on 32×32 latents: 256 tokens, head dim 64, learned sigma (its variance channels
// get a zero gradient from the ε-MSE on both sides).
TEST(CudaDiTTest, DiTS2StepMatchesTheCpuModel) {
  DT_SKIP_WITHOUT_GPU();
  ExpectStepMatchesCpu(DiTConfigByName("DiT-S/2", 32).value(), /*B=*/2);
  ExpectStepMatchesCpu(DiTConfigByName("DiT-S/2", 32).value(), /*B=*/2, AttentionKernels::kFused);
  // Every flash variant; at 256 tokens the default takes the wide forward.
  const DiTConfig s2 = DiTConfigByName("DiT-S/2", 32).value();
  ExpectStepMatchesCpu(s2, /*B=*/2, AttentionKernels::kFlash);
  ExpectStepMatchesCpu(s2, /*B=*/2, AttentionKernels::kFlash, {FlashStages::kTwo, false});
  ExpectStepMatchesCpu(s2, /*B=*/2, AttentionKernels::kFlash, {FlashStages::kOne, true});
  ExpectStepMatchesCpu(s2, /*B=*/2, AttentionKernels::kFlash, {FlashStages::kOne, false});
}

// cuDNN's attention in the spatial blocks (model/cuda/cudnn_attention.h): a tiny DiT (16 tokens,
// head dim 32), DiT-S/2 (256 tokens, head dim 64) and a tiny Latte (the temporal blocks on the
// flash kernels). Skipped, saying why, where cuDNN is not installed or this build lacks it.
TEST(CudaDiTTest, CudnnAttentionStepsMatchTheCpuModel) {
  DT_SKIP_WITHOUT_GPU();
  if (const Status s = CudnnAttentionAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  ExpectStepMatchesCpu(Tiny(), /*B=*/3, AttentionKernels::kCudnn);
  ExpectStepMatchesCpu(DiTConfigByName("DiT-S/2", 32).value(), /*B=*/2, AttentionKernels::kCudnn);
  DiTConfig latte = Tiny();
  latte.video = true;
  latte.num_frames = 4;
  ExpectStepMatchesCpu(latte, /*B=*/3, AttentionKernels::kCudnn);
}

// A replayed graph computes what eager launches compute (up to the order of the attention
// backward's atomic additions), with the default attention and with cuDNN's where it is here
// (its kernels launched into the captured stream).
void ExpectGraphReplayMatchesEager(AttentionKernels attention) {
  SCOPED_TRACE(attention == AttentionKernels::kCudnn ? "cuDNN's attention" : "the default");
  const DiTConfig c = Tiny();
  difftrain::DiT cpu(c);
  const std::vector<float> weights = RandomBf16Weights(cpu);
  const Batch batch = RandomBatch(c, 4, /*seed=*/3);
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DiT eager(c, stream, {.use_graph = false, .attention = attention, .flash = {}}),
        graphed(c, stream, {.use_graph = true, .attention = attention, .flash = {}});
    std::vector<float> want;
    for (DiT* model : {&eager, &graphed}) {
      const Status reserved = model->Reserve(4);
      ASSERT_TRUE(reserved.ok()) << reserved.message();
      model->UploadState(weights.data(), weights.data(), nullptr, nullptr);
      Upload(*model, batch);
    }
    eager.ZeroGradients();
    eager.ForwardBackward();
    want = eager.DownloadGradients();
    for (int call = 0; call < 3; ++call) {  // eager, captured and launched, replayed
      graphed.ZeroGradients();
      graphed.ForwardBackward();
      EXPECT_LE(RelativeL2(graphed.DownloadGradients(), want), 1e-4) << "call " << call;
    }
  }
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaDiTTest, GraphReplayMatchesEagerLaunches) {
  DT_SKIP_WITHOUT_GPU();
  ExpectGraphReplayMatchesEager(AttentionKernels::kFlash);
  if (const Status s = CudnnAttentionAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  ExpectGraphReplayMatchesEager(AttentionKernels::kCudnn);
}

// ZeroGradients leaves the arena as it is and the next ForwardBackward writes it: its
// weight-gradient GEMMs with β = 0, one kernel zeroing every other parameter's gradient. So a
// step after the arena is poisoned (NaN) gives the bits of the step before, eagerly and from
// each captured graph (first micro-batch and later ones); a second micro-batch adds (twice the
// one, up to the rounding of the additions); the gradients read between ZeroGradients and a
// ForwardBackward are zeros. Tiny (with labels) and a Latte video (temporal blocks, no labels).
TEST(CudaDiTTest, FirstMicroBatchOverwritesThePoisonedGradients) {
  DT_SKIP_WITHOUT_GPU();
  DiTConfig video = Tiny();
  video.video = true;
  video.num_frames = 4;
  video.num_classes = 0;
  for (const DiTConfig& c : {Tiny(), video}) {
    SCOPED_TRACE(c.video ? "Latte" : "DiT");
    difftrain::DiT cpu(c);
    const std::vector<float> weights = RandomBf16Weights(cpu);
    const Batch batch = RandomBatch(c, 3, /*seed=*/5);
    cudaStream_t stream;
    DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      DiT model(c, stream, {.use_graph = true, .flash = {}});
      ASSERT_TRUE(model.Reserve(3).ok());
      model.UploadState(weights.data(), weights.data(), nullptr, nullptr);
      Upload(model, batch);
      const size_t n = model.num_params();
      std::vector<float> first;
      for (int call = 0; call < 4; ++call) {  // eager, then captured, replayed
        DT_CUDA_CHECK(cudaMemset(model.gradients(), 0xFF, n * sizeof(float)));
        model.ZeroGradients();
        const std::vector<float> zeros = model.DownloadGradients();
        EXPECT_TRUE(zeros == std::vector<float>(n, 0.0f)) << "call " << call;
        model.ForwardBackward();
        const std::vector<float> got = model.DownloadGradients();
        EXPECT_EQ(std::count_if(got.begin(), got.end(), [](float g) { return std::isnan(g); }), 0)
            << "call " << call;
        if (call == 0) {
          first = got;
        } else {  // (eager and graphed launches agree to 1e-4 in GraphReplayMatchesEagerLaunches)
          EXPECT_LE(RelativeL2(got, first), 1e-4) << "call " << call;
        }
        // A second micro-batch adds (its own graph from the third call on).
        model.ForwardBackward();
        std::vector<float> twice = got;
        for (float& g : twice)
          g *= 2;
        EXPECT_LE(RelativeL2(model.DownloadGradients(), twice), 1e-4) << "call " << call;
      }
    }
    DT_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// AdamW steps on one batch from the reference initialisation must cut the loss, and leave
// the norm and the EMA finite. The target is the input itself, which the model can learn
// quickly (a readout of the patch embedding); the zero-initialised output layer starts the
// loss at E[x²] ≈ 1.
// Training steps on one batch of the tiny DiT must drive its loss below `fraction` of the first.
void ExpectStepsFitOneBatch(const DiT::Options& options, float fraction) {
  const DiTConfig c = Tiny();
  difftrain::DiT cpu(c);
  cpu.InitializeReference(/*seed=*/2);
  Batch batch = RandomBatch(c, 8, /*seed=*/4);
  batch.target = batch.x;
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DiT gpu(c, stream, options);
    const Status reserved = gpu.Reserve(8);
    ASSERT_TRUE(reserved.ok()) << reserved.message();
    gpu.UploadState(cpu.params(), cpu.params(), nullptr, nullptr);
    Upload(gpu, batch);
    // The PyTorch reference model (tests/reference/dit_torch.py, fp32 AdamW, the same
    // sizes and lr) goes from 1.02 to 0.12 in 10 steps and to 0.0016 in 50 on this problem.
    constexpr int kSteps = 50;
    OptimizerConfig adamw;
    adamw.lr = 5e-3;
    adamw.grad_clip = 1.0;
    adamw.ema_decay = 0.99;
    float first = 0, last = 0;
    for (int step = 1; step <= kSteps; ++step) {
      gpu.ZeroGradients();
      gpu.ForwardBackward();
      const float loss = gpu.last_loss();
      if (step == 1) first = loss;
      last = loss;
      gpu.OptimizerStep(adamw.lr, step, adamw);
      EXPECT_TRUE(std::isfinite(gpu.last_grad_norm_squared())) << "step " << step;
    }
    EXPECT_NEAR(first, 1.0f, 0.3f);
    EXPECT_LT(last, fraction * first);
    std::vector<float> ema(gpu.num_params());
    gpu.DownloadState(nullptr, ema.data(), nullptr, nullptr);
    for (float w : ema)
      ASSERT_TRUE(std::isfinite(w));
  }
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaDiTTest, OptimizerStepsFitOneBatch) {
  DT_SKIP_WITHOUT_GPU();
  ExpectStepsFitOneBatch({}, 0.05f);
}

// FP8 (Options::fp8) without a GPU: the sizes it refuses, by name, and what it allocates.
TEST(CudaDiTSupport, Fp8RefusesSizesThatAreNotMultiplesOf16ByName) {
  DiT::Options fp8;
  fp8.fp8 = true;
  const DiTConfig xl = DiTConfigByName("DiT-XL/2", 32).value();
  EXPECT_TRUE(DiT::TakesMicroBatch(xl, 1, fp8).ok());  // 256 tokens, D 1152, MLP 4608
  DiTConfig c = Tiny();                                // 16 tokens
  EXPECT_TRUE(DiT::TakesMicroBatch(c, 3, fp8).ok());
  c.hidden_size = 72;
  c.num_heads = 3;
  Status s = DiT::TakesMicroBatch(c, 1, fp8);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("hidden_size to be a multiple of 16"), std::string::npos)
      << s.message();
  EXPECT_TRUE(DiT::TakesMicroBatch(c, 1, {}).ok());  // bf16 takes it
  c = Tiny();
  c.input_size = 6;  // 9 tokens a sample
  s = DiT::TakesMicroBatch(c, 1, fp8);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the tokens of a micro-batch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("found 9"), std::string::npos) << s.message();
  EXPECT_TRUE(DiT::TakesMicroBatch(c, 16, fp8).ok());  // 144 tokens
  // The quantised operands' workspace, on top of bf16's activations: at micro-batch 32 each
  // block's inputs as its forward keeps them for its backward (N·(3·D + M) bytes, N = 8,192
  // tokens, D = 1,152, M = 4,608), then an input, the output's gradient in both layouts (N·M
  // bytes each) and a weight (M² bytes): 1.85 and 0.13 GB.
  const size_t N = 32 * 256, D = 1152, M = 4608;
  const size_t want = N * (3 * D + M) * 28 + 3 * N * M + M * M;
  const size_t extra = DiT::ActivationBytes(xl, 32, fp8) - DiT::ActivationBytes(xl, 32);
  EXPECT_GE(extra, want);
  EXPECT_LT(extra, want + 256);  // the arena's alignment before the workspace
}

// FP8 Linear layers against the CPU model's fp32 step, after two steps that set the scales
// (the first runs at scale 1): output and loss within 10%, each tensor's gradient within 30%
// (E4M3 keeps 3 mantissa bits, E5M2 2: a wrong layout or scale is off by ~100%). Bounds set
// without a GPU, to be tightened to what the first run measures. Skipped, saying why, on a GPU
// before compute capability 8.9.
TEST(CudaDiTTest, Fp8StepsFollowTheCpuModel) {
  DT_SKIP_WITHOUT_GPU();
  if (const Status s = Fp8Supported(); !s.ok()) GTEST_SKIP() << "GPU test skipped: " << s.message();
  DiT::Options fp8;
  fp8.use_graph = false;
  fp8.fp8 = true;
  ExpectGpuStepNear(Tiny(), 3, fp8, RunCpuStep(Tiny(), 3), 0.1, 0.3, /*warmup=*/2);
  const DiTConfig s2 = DiTConfigByName("DiT-S/2", 32).value();
  ExpectGpuStepNear(s2, 2, fp8, RunCpuStep(s2, 2), 0.1, 0.3, /*warmup=*/2);
  DiTConfig latte = Tiny();
  latte.video = true;
  latte.num_frames = 4;
  ExpectGpuStepNear(latte, 3, fp8, RunCpuStep(latte, 3), 0.1, 0.3, /*warmup=*/2);
}

// FP8 trains: the tiny DiT fits one batch (to a tenth of its first loss, where bf16 reaches a
// twentieth), through CUDA graphs that replay the scales' updates.
TEST(CudaDiTTest, Fp8StepsFitOneBatch) {
  DT_SKIP_WITHOUT_GPU();
  if (const Status s = Fp8Supported(); !s.ok()) GTEST_SKIP() << "GPU test skipped: " << s.message();
  DiT::Options fp8;
  fp8.fp8 = true;
  ExpectStepsFitOneBatch(fp8, 0.1f);
}

}  // namespace
}  // namespace difftrain::cuda
