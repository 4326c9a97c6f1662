// Throughput of difftrain's bf16 Stable Diffusion UNet training step on one GPU
// (model/unet/cuda/unet.h), in the form of the seed figures it is measured against
// (../shared/MODELS.md: NeMo SD v1's samples/s per GPU by micro-batch on an H800, MosaicML
// SD2-base's images/s per 8-GPU node): one micro-batch per run, so an out-of-memory ends only
// its own run.
//
//   bench_cuda_unet [--model SD2-base] [--latent-size 64] [--micro-batch 8] [--warmup 3]
//                   [--steps 10] [--attention flash|fused|cudnn] [--no-graph] [--peak-tflops 989]
//
// A step is what a training step does on the GPU: zero the gradients, forward, the MSE loss,
// backward, global-norm clipping, AdamW on the fp32 master weights and the EMA. The weights
// are random normal (scale 0.02, 2^20 values repeated: the step's time does not depend on
// them), the data one random
// batch — latents, timesteps, text embeddings [B, 77, cross_attention_dim], the target — made
// on the host and uploaded once (this measures the model, not a loader or the text encoder).
// --attention fused runs the transformers' attention on the fused kernels everywhere instead
// of the flash kernels where they take the head dim (UNet::Options::flash_attention); --attention
// cudnn the self-attention on cuDNN's fused attention where it takes the head dim, the
// cross-attention on the flash kernels (UNet::Options::cudnn_attention). Each
// step is timed with CUDA events; the median after the warm-up is one JSON line on stdout,
// with TFLOP/s counting 6 × the forward multiply-accumulates (ForwardMacs: convolutions,
// linear layers, attention), as MODELS.md counts them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/cuda_bench.h"
#include "model/tensor/rng.h"
#include "model/unet/config.h"
#include "model/unet/cuda/unet.h"

namespace difftrain {
namespace {

struct Options : bench::StepOptions {
  Options() : bench::StepOptions{.micro_batch = 8, .warmup = 3, .steps = 10} {}
  std::string model = "SD2-base";
  std::optional<int> latent_size;  // default: the config's sample_size (64: 512 px)
  std::string attention = "flash";
};

std::vector<float> Normal(size_t n, Rng& rng, double scale) {
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(rng.Normal() * scale);
  return v;
}

// One random batch: latents and target standard normal, text embeddings normal, t uniform in
// [0, 1000).
void UploadBatch(cuda::UNet& model, uint64_t seed) {
  const UNetConfig& c = model.config();
  const int B = model.micro_batch();
  const size_t image = size_t(B) * c.in_channels * c.sample_size * c.sample_size;
  Rng rng(seed, RngStream::kData);
  const std::vector<float> x = Normal(image, rng, 1.0), target = Normal(image, rng, 1.0);
  const std::vector<float> text =
      Normal(size_t(B) * c.text_length * c.cross_attention_dim, rng, 1.0);
  std::vector<float> t(B);
  for (float& v : t)
    v = static_cast<float>(rng.Below(1000));
  for (const auto& [to, from] : {std::pair{model.input_x(), &x},
                                 {model.input_target(), &target},
                                 {model.input_context(), &text},
                                 {model.input_t(), &t}}) {
    DT_CUDA_CHECK(cudaMemcpyAsync(to, from->data(), from->size() * sizeof(float),
                                  cudaMemcpyHostToDevice, model.stream()));
  }
  DT_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
}

int Run(const Options& o) {
  Result<UNetConfig> config = UNetConfigByName(o.model);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_cuda_unet: %s\n", config.status().message().c_str());
    return 2;
  }
  UNetConfig c = config.value();
  if (o.latent_size) c.sample_size = *o.latent_size;
  if (Status s = c.Validate(); !s.ok()) {
    std::fprintf(stderr, "bench_cuda_unet: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = cuda::UNet::Supports(c); !s.ok()) {
    std::fprintf(stderr, "bench_cuda_unet: %s\n", s.message().c_str());
    return 2;
  }
  const std::vector<cuda::DeviceProperties> devices = bench::GpusOrSayWhy("bench_cuda_unet");
  if (devices.empty()) return 1;
  DT_CUDA_CHECK(cudaFree(nullptr));  // create the context before the baseline reading
  const double baseline = bench::UsedDeviceBytes();

  cudaStream_t stream = cuda::CreateStepStream();
  cuda::UNet model(c, stream,
                   {.use_graph = !o.no_graph,
                    .flash_attention = o.attention != "fused",
                    .cudnn_attention = o.attention == "cudnn"});
  if (Status s = model.Reserve(o.micro_batch); !s.ok()) {
    std::fprintf(stderr, "bench_cuda_unet: %s\n", s.message().c_str());
    return 2;
  }
  {
    // 2^20 normal values repeated: drawing SD's ~900 M one by one would take the host seconds.
    Rng rng(/*seed=*/0, RngStream::kInit);
    const std::vector<float> pattern = Normal(size_t(1) << 20, rng, 0.02);
    std::vector<float> weights(model.num_params());
    for (size_t i = 0; i < weights.size(); ++i)
      weights[i] = pattern[i % pattern.size()];
    model.UploadState(weights.data(), weights.data(), nullptr, nullptr);
  }
  UploadBatch(model, /*seed=*/1);

  OptimizerConfig adamw;  // lr 1e-4 as SD's recipes; clipping at 1 as bench_cuda_dit's step
  adamw.grad_clip = 1.0;
  const std::vector<double> ms = bench::TimeSteps(stream, o.warmup, o.steps, [&](int i) {
    model.ZeroGradients();
    model.ForwardBackward();
    model.OptimizerStep(adamw.lr, /*step=*/i + 1, adamw);
  });
  const float loss = model.last_loss();
  nlohmann::json row = {
      {"impl", "difftrain"},      {"model", o.model}, {"latent_size", c.sample_size},
      {"attention", o.attention}, {"loss", loss},     {"gpu_name", devices.front().name}};
  row.update(bench::StepFields(o, ms, 6 * ForwardMacs(c).total(), baseline));
  std::printf("%s\n", row.dump().c_str());
  return std::isfinite(loss) ? 0 : 1;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  difftrain::Options o;
  CLI::App app{"Times difftrain's bf16 Stable Diffusion UNet training step on one GPU"};
  app.add_option("--model", o.model, "a named UNet: SD1.5, SD2-base or SD2-v")
      ->capture_default_str();
  app.add_option("--latent-size", o.latent_size,
                 "latent height = width (default the model's: 64, 512 px; 96 for SD2-v)")
      ->check(CLI::PositiveNumber);
  difftrain::bench::AddStepOptions(app, o);
  app.add_option("--attention", o.attention,
                 "flash: the flash kernels wherever they take the head dim (the default); "
                 "fused: the fused kernels everywhere; cudnn: cuDNN's fused attention in the "
                 "self-attention where it takes the head dim, flash in the cross-attention")
      ->check(CLI::IsMember({"flash", "fused", "cudnn"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(o);
}
