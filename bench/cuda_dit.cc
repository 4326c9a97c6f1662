// Throughput of difftrain's bf16 DiT training step on one GPU (model/dit/cuda/dit.h): one
// micro-batch size per run, so an out-of-memory ends only its own run (bench/cuda_dit.sh
// runs the sweep beside PyTorch's).
//
//   bench_cuda_dit [--model DiT-XL/2] [--input-size 32] [--micro-batch 32] [--warmup 5]
//                  [--steps 20] [--no-graph] [--peak-tflops 989] [--attention flash]
//                  [--frames 16] [--num-classes N] [--ema-other-way-steps 10] [--fp8]
//
// --fp8: the blocks' Linear layers in FP8 (DiT::Options::fp8, model/cuda/fp8.h); the row's
// TFLOP/s and MFU still count the model's FLOPs against the bf16 peak (--peak-tflops), as
// Megatron-Core reports its FP8 runs, and its "fp8" field says how many products fell back to
// bf16.
//
// A Latte model (--model Latte-L/2 --frames 16) times the same step over videos: a sample is
// a video of --frames frames, and samples/s counts videos.
//
// A step is what a training step does on the GPU: zero the gradients, forward, ε-MSE loss,
// backward, global-norm clipping, AdamW on the fp32 master weights and the EMA. The
// weights start from DiT's reference initialisation; the data is one random batch made on
// the host and uploaded once (this measures the model, not a loader). Each step is timed
// with CUDA events; the median after the warm-up is reported as one JSON line on stdout.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/cuda_bench.h"
#include "model/dit/cuda/dit.h"
#include "model/dit/dit.h"
#include "model/dit/family.h"
#include "model/family/family.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

struct Options : bench::StepOptions {  // micro-batch 32, 5 warm-up steps, 20 timed
  std::string model = "DiT-XL/2";
  int input_size = 32;
  bool no_gemm_autotune = false;
  bool no_short_attention = false;  // the general flash kernels over sequences of ≤ 16 rows too
  int ema_other_way_steps = 10;     // 0: the row's way only (under a profiler)
  bool fp8 = false;
  // flash[-pipelined][-wide][-stored], gemm or fused; the default is the model's
  // (cuda::FlashVariant).
  std::string attention = "flash-pipelined-wide-stored";
  std::optional<int> frames;       // a Latte model's frames a video (its family's default: 16)
  std::optional<int> num_classes;  // default: the config's own
};

// One random batch: x_t and ε standard normal, t uniform in [0, 1000), labels uniform.
void UploadBatch(cuda::DiT& model, uint64_t seed) {
  const DiTConfig& c = model.config();
  const int B = model.micro_batch();
  const size_t image = size_t(c.frames()) * c.in_channels * c.input_size * c.input_size;
  Rng rng(seed, RngStream::kData);
  std::vector<float> x(B * image), target(B * image), t(B);
  std::vector<int32_t> y(B);
  for (float& v : x)
    v = static_cast<float>(rng.Normal());
  for (float& v : target)
    v = static_cast<float>(rng.Normal());
  for (int b = 0; b < B; ++b) {
    t[b] = static_cast<float>(rng.Below(1000));
    y[b] = c.has_labels() ? static_cast<int32_t>(rng.Below(c.num_classes)) : 0;
  }
  auto copy = [&](void* to, const void* from, size_t bytes) {
    DT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, model.stream()));
  };
  copy(model.input_x(), x.data(), x.size() * 4);
  copy(model.input_target(), target.data(), target.size() * 4);
  copy(model.input_t(), t.data(), t.size() * 4);
  if (c.has_labels()) copy(model.input_y(), y.data(), y.size() * 4);
  DT_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
}

// The named config as the command line's --model resolves it (its family checks the
// overrides: --frames only for a video family), which must be a DiT or a Latte.
Result<DiTConfig> ConfigOf(const Options& o) {
  ModelRequest request{o.model, o.input_size};
  if (o.frames) request.overrides["num_frames"] = *o.frames;
  if (o.num_classes) request.overrides["num_classes"] = *o.num_classes;
  DT_ASSIGN_OR_RETURN(const ModelSpec spec, ModelSpecFromRequest(request));
  if (spec.family != "dit" && spec.family != "latte")
    return Errorf("--model {} is a {} model: this bench times DiT and Latte", o.model, spec.family);
  return DiTConfigOf(spec);
}

int Run(const Options& o) {
  Result<DiTConfig> config = ConfigOf(o);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_cuda_dit: %s\n", config.status().message().c_str());
    return 2;
  }
  const DiTConfig& c = config.value();
  const std::vector<cuda::DeviceProperties> devices = bench::GpusOrSayWhy("bench_cuda_dit");
  if (devices.empty()) return 1;
  DT_CUDA_CHECK(cudaFree(nullptr));  // create the context before the baseline reading
  const double baseline = bench::UsedDeviceBytes();

  cudaStream_t stream = cuda::CreateStepStream();
  std::vector<float> initial;
  {
    DiT reference(c);  // the CPU model only supplies the reference initialisation
    reference.InitializeReference(/*seed=*/0);
    initial.assign(reference.params(), reference.params() + reference.num_params());
  }
  // The ε-MSE alone, as the PyTorch side computes it.
  // "flash[-pipelined][-wide][-stored]": the flash kernels' variant (cuda::FlashVariant).
  const bool flash = o.attention.rfind("flash", 0) == 0;
  const cuda::AttentionKernels attention = flash                    ? cuda::AttentionKernels::kFlash
                                           : o.attention == "fused" ? cuda::AttentionKernels::kFused
                                           : o.attention == "cudnn" ? cuda::AttentionKernels::kCudnn
                                                                    : cuda::AttentionKernels::kGemm;
  const cuda::FlashVariant variant{.stages = o.attention.find("pipelined") != std::string::npos
                                                 ? cuda::FlashStages::kTwo
                                                 : cuda::FlashStages::kOne,
                                   .wide_forward = o.attention.find("wide") != std::string::npos,
                                   .stored_scores = o.attention.find("stored") != std::string::npos,
                                   .short_sequences = !o.no_short_attention};
  cuda::DiT model(c, stream,
                  {.vb_loss = false,
                   .use_graph = !o.no_graph,
                   .attention = attention,
                   .flash = variant,
                   .gemm_autotune = !o.no_gemm_autotune,
                   .fp8 = o.fp8});
  if (Status s = model.Reserve(o.micro_batch); !s.ok()) {
    std::fprintf(stderr, "bench_cuda_dit: %s\n", s.message().c_str());
    return 2;
  }
  model.UploadState(initial.data(), initial.data(), nullptr, nullptr);
  initial = {};
  UploadBatch(model, /*seed=*/1);

  OptimizerConfig adamw;  // DiT's: lr 1e-4, no weight decay; plus clipping at 1
  adamw.grad_clip = 1.0;
  cuda::GemmTuning tuning;  // after the first step (eager: every GEMM called once as in a step)
  int64_t steps_done = 0;
  const auto step = [&](int) {
    model.ZeroGradients();
    model.ForwardBackward();
    model.OptimizerStep(adamw.lr, ++steps_done, adamw);
  };
  const std::vector<double> ms = bench::TimeSteps(stream, o.warmup, o.steps, step, [&](int i) {
    if (i == 0) tuning = model.gemm_tuning();
  });
  const float loss = model.last_loss();
  // The EMA the other way (on its own stream, or in AdamW's pass: cuda::TrainState), timed for as
  // many steps right after (--ema-other-way-steps), so that the row says what it gains in the
  // same run.
  const bool ema_stream = model.ema_stream();
  std::vector<double> other_ema;
  if (o.ema_other_way_steps > 0) {
    model.set_ema_stream(!ema_stream);
    other_ema = bench::TimeSteps(stream, /*warmup=*/2, o.ema_other_way_steps, step);
    model.set_ema_stream(ema_stream);
  }
  nlohmann::json row = {{"impl", "difftrain"},
                        {"model", o.model},
                        {"attention", o.fp8 ? o.attention + "+fp8" : o.attention},
                        {"short_attention", flash && !o.no_short_attention},
                        {"precision", o.fp8 ? "fp8" : "bf16"},
                        {"frames", c.frames()},
                        {"num_classes", c.num_classes},
                        {"model_device_gib", double(model.device_bytes()) / (1u << 30)},
                        {"loss", loss},
                        {"gpu_name", devices.front().name}};
  row.update(bench::StepFields(o, ms, TrainingFlopsPerSample(c), baseline));
  // One step's GEMMs as cuBLASLt's first choices would take them and as tuned (timed apart).
  row["gemm_tuning"] = {{"plans", tuning.plans},
                        {"tuned", tuning.tuned},
                        {"changed", tuning.changed},
                        {"heuristic_ms_a_step", tuning.heuristic_ms},
                        {"tuned_ms_a_step", tuning.tuned_ms}};
  row["ema"] = {{"own_stream", ema_stream}};
  if (o.fp8) row["fp8"] = {{"bf16_fallbacks", model.fp8_bf16_fallbacks()}};
  if (!other_ema.empty()) row["ema"]["step_ms_the_other_way"] = bench::Median(other_ema);
  std::printf("%s\n", row.dump().c_str());
  return std::isfinite(loss) ? 0 : 1;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  difftrain::Options o;
  CLI::App app{"Times difftrain's bf16 (or FP8) DiT training step on one GPU"};
  app.add_option("--model", o.model, "a named DiT (DiT-XL/2) or Latte (Latte-L/2)")
      ->capture_default_str();
  app.add_option("--frames", o.frames, "frames of a Latte model's videos (default 16)")
      ->check(CLI::PositiveNumber);
  app.add_option("--num-classes", o.num_classes, "classes (0: unconditional); default the model's")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--input-size", o.input_size, "latent height = width")->capture_default_str();
  difftrain::bench::AddStepOptions(app, o);
  app.add_option("--ema-other-way-steps", o.ema_other_way_steps,
                 "steps timed after the row with the EMA the other way (on its own stream or in "
                 "AdamW's pass), for the row's ema field; 0: none (under a profiler)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--no-gemm-autotune", o.no_gemm_autotune,
               "cuBLASLt's first algorithm for each GEMM instead of the fastest of its candidates");
  app.add_flag("--fp8", o.fp8,
               "the blocks' Linear layers in FP8 (E4M3 activations and weights, E5M2 gradients, "
               "delayed scaling; compute capability 8.9 or later)");
  app.add_flag("--no-short-attention", o.no_short_attention,
               "flash: the general kernels also over sequences of at most 16 rows (Latte's "
               "temporal attention over 16 frames), instead of the short-sequence kernels");
  app.add_option("--attention", o.attention,
                 "gemm: batched GEMMs in the spatial blocks; fused: the wmma kernels; flash: the "
                 "mma.sync flash kernels; flash-pipelined: those with double-buffered cp.async "
                 "tile loads; -wide: the forward with two m-tiles a warp; -stored: the "
                 "backward's dQ from stored score gradients; cudnn: cuDNN's fused flash "
                 "attention in the spatial blocks (model/dit/cuda/dit.h)")
      ->check(CLI::IsMember({"gemm", "fused", "cudnn", "flash", "flash-pipelined", "flash-wide",
                             "flash-pipelined-wide", "flash-stored", "flash-pipelined-stored",
                             "flash-wide-stored", "flash-pipelined-wide-stored"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(o);
}
