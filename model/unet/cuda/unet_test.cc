// The UNet's GPU step (model/unet/cuda/unet.h) against the CPU model and Trainer: one step of a
// small UNet on the same (bf16-rounded) weights and batch — output, loss and every parameter's
// gradient — the CUDA graph against eager launches, and the Trainer on the GPU following the
// CPU Trainer for several AdamW steps under ε- and v-prediction. Which UNets the kernels take
// (every Stable Diffusion config) and the refusals are checked everywhere; the rest needs a GPU
// and reports itself skipped without one.
#include "model/unet/cuda/unet.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/cuda/cudnn_attention.h"
#include "model/cuda/testing.h"
#include "model/data/dataset.h"
#include "model/tensor/rng.h"
#include "model/train/checkpointing.h"
#include "model/train/gpu_step.h"
#include "model/train/trainer.h"
#include "model/unet/family.h"
#include "model/unet/unet.h"

namespace difftrain::cuda {
namespace {

using ::testing::HasSubstr;
using testing::RelativeL2;

// Two levels, both attention kinds, a channel change (1×1 shortcut), a downsampler, an
// upsampler, 2 and 4 channels per group, head dims 8 and 16, a 5-token text.
UNetConfig Small() {
  UNetConfig c;
  c.name = "unet";
  c.block_out_channels = {16, 32};
  c.down_block_types = {kCrossAttnDown, kCrossAttnDown};
  c.up_block_types = {kCrossAttnUp, kCrossAttnUp};
  c.layers_per_block = 1;
  c.attention_head_dim = {2};
  c.cross_attention_dim = 24;
  c.norm_num_groups = 8;
  c.sample_size = 8;
  c.text_length = 5;
  c.text_dropout = 0.25;
  return c;
}

// Small() with a second level of one 160-wide head (SD 1.5's deepest head dim): the fused
// attention kernels there, the flash kernels at the first level.
UNetConfig SmallWithAWideHead() {
  UNetConfig c = Small();
  c.block_out_channels = {16, 160};
  c.attention_head_dim = {2, 1};
  return c;
}

UNetConfig Named(const std::string& name) {
  Result<UNetConfig> c = UNetConfigByName(name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

TEST(UNetGpuSupport, TakesEveryStableDiffusionConfig) {
  for (const char* name : {"SD1.5", "SD2-base", "SD2-v"}) {
    const Status s = UNet::Supports(Named(name));
    EXPECT_TRUE(s.ok()) << name << ": " << s.message();
  }
  EXPECT_TRUE(UNet::Supports(Small()).ok());
  EXPECT_TRUE(UNet::Supports(SmallWithAWideHead()).ok());
}

TEST(UNetGpuSupport, RefusesWhatTheKernelsDoNotTakeByName) {
  UNetConfig c = Small();
  c.block_out_channels = {12, 32};
  c.norm_num_groups = 4;
  EXPECT_THAT(UNet::Supports(c).message(), HasSubstr("block_out_channels[0]"));
  c = Small();
  c.attention_head_dim = {4};  // head dim 4 at the first level
  EXPECT_THAT(UNet::Supports(c).message(), HasSubstr("head dimensions"));
  c = Small();
  c.block_out_channels = {16, 352};  // one head of 352
  c.attention_head_dim = {2, 1};
  EXPECT_THAT(UNet::Supports(c).message(), HasSubstr("up to 160"));
  c = Small();
  c.cross_attention_dim = 20;
  EXPECT_THAT(UNet::Supports(c).message(), HasSubstr("cross_attention_dim"));
  c = Small();
  c.out_channels = 8;
  EXPECT_THAT(UNet::Supports(c).message(), HasSubstr("out_channels"));
}

// The activation arena (sized without a GPU) grows linearly with the micro-batch, up to the
// 256-byte alignment of its pieces; SD 1.5's at 512 px is printed for docs/cuda.md.
TEST(UNetGpuSupport, ActivationArenaGrowsWithTheMicroBatch) {
  const UNetConfig c = Small();
  const double one = UNet::ActivationBytes(c, 1), two = UNet::ActivationBytes(c, 2);
  const double four = UNet::ActivationBytes(c, 4);
  EXPECT_GT(two, one);
  EXPECT_NEAR(four - two, 2 * (two - one), 0.01 * (four - two));
  const UNetConfig sd = Named("SD1.5");
  std::cout << "SD1.5 at 64x64 latents: activation arena " << UNet::ActivationBytes(sd, 1) / 1e9
            << " GB at micro-batch 1, " << UNet::ActivationBytes(sd, 8) / 1e9 << " GB at 8\n";
}

// Without a GPU, asking for the UNet's step is an error that says why, not a crash.
TEST(UNetGpuSupport, CreateWithoutAGpuSaysWhy) {
  if (testing::NoGpuReason().empty()) GTEST_SKIP() << "this machine has a GPU";
  TrainConfig config;
  config.model = UNetSpec(Small());
  config.device = "cuda";
  Result<std::unique_ptr<GpuStep>> step = GpuStep::Create(config, 0);
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(step.status().message(), HasSubstr("no usable GPU"));
}

struct Batch {
  std::vector<float> x, t, context, target;
};

// Inputs rounded to bf16 where the GPU reads them as bf16 (x_t through conv_in's columns, the
// text through attn2's k and v), so the CPU sees what the GPU sees.
Batch RandomBatch(const UNetConfig& c, int B, uint64_t seed) {
  const size_t image = size_t(c.in_channels) * c.sample_size * c.sample_size;
  Batch batch{testing::RoundToBf16(testing::RandomVector(B * image, seed)), std::vector<float>(B),
              testing::RoundToBf16(testing::RandomVector(
                  size_t(B) * c.text_length * c.cross_attention_dim, seed + 1)),
              testing::RandomVector(B * image, seed + 2)};
  Rng rng(seed, RngStream::kNoise);
  for (int b = 0; b < B; ++b)
    batch.t[b] = static_cast<float>(rng.Below(1000));
  return batch;
}

void Upload(UNet& model, const Batch& batch) {
  auto copy = [&](void* to, const std::vector<float>& from) {
    DT_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, model.stream()));
  };
  copy(model.input_x(), batch.x);
  copy(model.input_t(), batch.t);
  copy(model.input_context(), batch.context);
  copy(model.input_target(), batch.target);
  DT_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
}

// The CPU step: output, ε-MSE loss, and every gradient, on bf16-rounded random weights.
struct CpuStep {
  std::vector<float> weights, out, grads;
  float loss = 0;
};

// Each weight times (1 + u·rel), u uniform in [-1, 1): with rel = 2⁻⁹ the size of one bf16
// rounding (8 significant bits), in a different place.
std::vector<float> Jitter(const std::vector<float>& v, double rel) {
  Rng rng(/*seed=*/77, RngStream::kData);
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = static_cast<float>(v[i] * (1 + rel * (2 * rng.Uniform() - 1)));
  return r;
}

// `jitter` > 0 runs the step on Jitter(weights, jitter) instead.
CpuStep RunCpu(const UNetConfig& c, int B, const Batch& batch, double jitter = 0) {
  difftrain::UNet cpu(c);
  cpu.InitializeRandom(/*seed=*/5);
  CpuStep r;
  r.weights =
      testing::RoundToBf16(std::vector<float>(cpu.params(), cpu.params() + cpu.num_params()));
  if (jitter > 0) r.weights = Jitter(r.weights, jitter);
  std::memcpy(cpu.params(), r.weights.data(), r.weights.size() * sizeof(float));
  cpu.Reserve(B, 1);
  const ModelInputs in{batch.x.data(), batch.t.data(), nullptr, batch.context.data()};
  EXPECT_TRUE(cpu.Forward(0, in, nullptr, nullptr).ok());
  r.out.assign(cpu.output(0), cpu.output(0) + batch.target.size());
  std::vector<float> dout(r.out.size());
  double sum = 0;
  for (size_t i = 0; i < r.out.size(); ++i) {
    const double e = double(r.out[i]) - batch.target[i];
    sum += e * e;
    dout[i] = static_cast<float>(2 * e / r.out.size());
  }
  r.loss = static_cast<float>(sum / r.out.size());
  std::memset(cpu.grads(), 0, cpu.num_params() * sizeof(float));
  EXPECT_TRUE(cpu.Backward(0, dout.data(), nullptr).ok());
  r.grads.assign(cpu.grads(), cpu.grads() + cpu.num_params());
  return r;
}

class UNetGpuStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = testing::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
    DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) DT_CUDA_CHECK(cudaStreamDestroy(stream_));
  }
  cudaStream_t stream_ = nullptr;
};

// One step against the CPU model: output and loss within bf16's error, each tensor's gradient
// within 3e-2 (a GroupNorm's input gradient is a difference of nearly equal terms), and the
// whole gradient within twice this UNet's own sensitivity to bf16 rounding: how far the CPU
// model's gradient moves when its weights are rounded once more, by a bf16-sized relative
// error (2⁻⁹) elsewhere. The GPU rounds every activation it stores to bf16, so its gradient is
// expected to differ by about that much; a wrong term or index differs by far more. (Measured
// on an H200: 0.0113 against a sensitivity of 0.0085 for this 16/32-channel UNet with 2 and 4
// channels per group; DiT's fixed 1e-2 fits DiT, whose LayerNorms average hundreds of values.)
// Small()'s head dims (8, 16) run on the flash kernels, or on the fused ones with
// flash_attention off, or (the self-attention) on cuDNN's with cudnn_attention, where this
// machine has cuDNN; SmallWithAWideHead() has a level on the fused ones beside a flash (or cuDNN)
// level.
TEST_F(UNetGpuStepTest, StepMatchesTheCpuModel) {
  struct Case {
    bool linear_projection, flash_attention, cudnn_attention;
    UNetConfig config;
  };
  const Status cudnn = CudnnAttentionAvailable();
  for (const Case& k :
       {Case{false, true, false, Small()}, Case{true, true, false, Small()},
        Case{false, false, false, Small()}, Case{false, true, false, SmallWithAWideHead()},
        Case{false, true, true, Small()}, Case{false, true, true, SmallWithAWideHead()}}) {
    if (k.cudnn_attention && !cudnn.ok()) {
      std::cout << "cuDNN's attention not checked: " << cudnn.message() << "\n";
      continue;
    }
    SCOPED_TRACE(k.linear_projection ? "linear proj_in/out" : "1×1-conv proj_in/out");
    SCOPED_TRACE(k.config.block_out_channels.back() == 160 ? "head dims 8 and 160"
                                                           : "head dims 8 and 16");
    SCOPED_TRACE(k.cudnn_attention   ? "cuDNN's self-attention where it takes the head dim"
                 : k.flash_attention ? "flash attention where it takes the head dim"
                                     : "fused attention");
    UNetConfig c = k.config;
    c.use_linear_projection = k.linear_projection;
    const int B = 2;
    const Batch batch = RandomBatch(c, B, /*seed=*/11);
    const CpuStep want = RunCpu(c, B, batch);
    const double sensitivity = RelativeL2(RunCpu(c, B, batch, 0x1p-9).grads, want.grads);
    UNet gpu(c, stream_,
             {.use_graph = false,
              .flash_attention = k.flash_attention,
              .cudnn_attention = k.cudnn_attention});
    const Status reserved = gpu.Reserve(B);
    ASSERT_TRUE(reserved.ok()) << reserved.message();
    EXPECT_EQ(gpu.cudnn_workspace_bytes() > 0, k.cudnn_attention);
    gpu.UploadState(want.weights.data(), want.weights.data(), nullptr, nullptr);
    gpu.PoisonActivations();
    Upload(gpu, batch);  // PoisonActivations leaves the unit per-sample weights in place
    gpu.ZeroGradients();
    gpu.ForwardBackward();
    DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> out(want.out.size());
    DT_CUDA_CHECK(
        cudaMemcpy(out.data(), gpu.output(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_LE(RelativeL2(out, want.out), 1e-2);
    EXPECT_NEAR(gpu.last_loss(), want.loss, 1e-2 * want.loss);
    const std::vector<float> grads = gpu.DownloadGradients();
    const double error = RelativeL2(grads, want.grads);
    std::cout << (k.linear_projection ? "linear" : "conv") << " projections: output "
              << RelativeL2(out, want.out) << ", whole gradient " << error
              << " (bf16 sensitivity of the CPU model " << sensitivity << ")\n";
    EXPECT_GT(sensitivity, 0);
    EXPECT_LE(error, 2 * sensitivity);
    std::vector<std::pair<double, std::string>> worst;
    for (const TensorSpec& t : gpu.parameter_table().tensors()) {
      const std::vector<float> got(grads.begin() + t.offset, grads.begin() + t.offset + t.numel);
      const std::vector<float> w(want.grads.begin() + t.offset,
                                 want.grads.begin() + t.offset + t.numel);
      worst.emplace_back(RelativeL2(got, w), t.name);
      EXPECT_LE(worst.back().first, 3e-2) << t.name;
    }
    std::sort(worst.rbegin(), worst.rend());
    for (size_t i = 0; i < std::min<size_t>(3, worst.size()); ++i)
      std::cout << "  " << worst[i].second << ": " << worst[i].first << "\n";
  }
}

// The captured graph replays what eager launches compute (the second call captures, the third
// replays), on new inputs written into the same device buffers; with the default kernels and,
// where this machine has cuDNN, with its self-attention.
void ExpectGraphReplaysTheEagerStep(cudaStream_t stream, bool cudnn_attention) {
  SCOPED_TRACE(cudnn_attention ? "cuDNN's self-attention" : "the default kernels");
  const UNetConfig c = Small();
  const int B = 2;
  const CpuStep cpu = RunCpu(c, B, RandomBatch(c, B, 11));  // only its weights are used
  UNet eager(c, stream, {.use_graph = false, .cudnn_attention = cudnn_attention}),
      graphed(c, stream, {.use_graph = true, .cudnn_attention = cudnn_attention});
  for (UNet* m : {&eager, &graphed}) {
    ASSERT_TRUE(m->Reserve(B).ok());
    m->UploadState(cpu.weights.data(), nullptr, nullptr, nullptr);
  }
  for (int call = 0; call < 3; ++call) {
    const Batch batch = RandomBatch(c, B, 20 + call);
    for (UNet* m : {&eager, &graphed}) {
      Upload(*m, batch);
      m->ZeroGradients();
      m->ForwardBackward(0.5f);
    }
    EXPECT_EQ(graphed.last_loss(), eager.last_loss()) << "call " << call;
    EXPECT_LE(RelativeL2(graphed.DownloadGradients(), eager.DownloadGradients()), 1e-3)
        << "call " << call;  // the attention backward's atomics may add in another order
  }
}

TEST_F(UNetGpuStepTest, GraphReplaysTheEagerStep) {
  ExpectGraphReplaysTheEagerStep(stream_, /*cudnn_attention=*/false);
  if (const Status s = CudnnAttentionAvailable(); !s.ok()) {
    std::cout << "cuDNN's attention not checked: " << s.message() << "\n";
    return;
  }
  ExpectGraphReplaysTheEagerStep(stream_, /*cudnn_attention=*/true);
}

double Relative(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

// The Trainer with train.device cuda follows the CPU Trainer from the same weights: loss and
// gradient norm step by step, then the parameters (text dropout, accumulation over two
// micro-batches, clipping and the EMA included).
class UNetGpuTrainerTest : public UNetGpuStepTest {
 protected:
  void Follow(const std::string& prediction) {
    TrainConfig c;
    c.model = UNetSpec(Small());
    c.micro_batch = 2;
    c.global_batch = 4;
    c.optimizer.lr = 1e-3;
    c.optimizer.grad_clip = 1.0;
    c.optimizer.ema_decay = 0.99;
    c.diffusion.schedule = "scaled_linear";
    c.diffusion.beta_start = 0.00085;
    c.diffusion.beta_end = 0.012;
    c.diffusion.prediction = prediction;
    c.seed = 7;
    const SampleSchema x = UNetFamily().Samples(c.model);
    auto data = [&] { return std::make_unique<SyntheticDataset>(c.seed, x.channels, x.height, 0); };
    Trainer cpu(c, data());
    cpu.model().InitializeRandom(/*seed=*/3);
    const auto dir = std::filesystem::temp_directory_path() /
                     ("unet_gpu_trainer_" + std::to_string(::getpid()) + prediction);
    std::filesystem::remove_all(dir);
    const io::CheckpointStore store(dir.string(), /*keep=*/1);
    ASSERT_TRUE(WriteCheckpointShard(cpu, store, 0, 1).ok());
    ASSERT_TRUE(store.Commit(cpu.step(), 1).ok());

    TrainConfig g = c;
    g.device = "cuda";
    Result<std::unique_ptr<GpuStep>> step = GpuStep::Create(g, 0);
    ASSERT_TRUE(step.ok()) << step.status().message();
    Trainer gpu(g, data(), {}, std::move(step).value());
    Result<std::optional<int64_t>> restored = RestoreLatestCheckpoint(gpu, store);
    ASSERT_TRUE(restored.ok()) << restored.status().message();
    for (int s = 1; s <= 5; ++s) {
      Result<StepStats> want = cpu.Step();
      Result<StepStats> got = gpu.Step();
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_LE(Relative(got->loss, want->loss), 2e-2) << "step " << s;
      EXPECT_LE(Relative(got->grad_norm, want->grad_norm), 5e-2) << "step " << s;
    }
    const io::CheckpointStore end((dir / "end").string(), /*keep=*/1);
    ASSERT_TRUE(WriteCheckpointShard(gpu, end, 0, 1).ok());  // downloads the device's state
    const std::vector<float> want(cpu.model().params(),
                                  cpu.model().params() + cpu.model().num_params());
    const std::vector<float> got(gpu.model().params(),
                                 gpu.model().params() + gpu.model().num_params());
    EXPECT_LE(RelativeL2(got, want), 1e-2);
    std::filesystem::remove_all(dir);
  }
};

TEST_F(UNetGpuTrainerTest, FollowsTheCpuTrainerUnderEpsilonPrediction) {
  Follow("epsilon");
}

TEST_F(UNetGpuTrainerTest, FollowsTheCpuTrainerUnderVPrediction) {
  Follow("v");
}

}  // namespace
}  // namespace difftrain::cuda
