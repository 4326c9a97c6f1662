// CPU MFU of a training step: the achieved FLOP rate of full training steps (forward,
// backward, AdamW, EMA) divided by the FLOP rate OpenBLAS sgemm reaches on this machine.
//
//   bench_cpu_mfu [--model DiT-S/4] [--input-size 32] [--batch 64] [--steps 5] [--repeats 5]
//   bench_cpu_mfu --config JOB.yaml [--batch B] ...
//   bench_cpu_mfu ... --make-batch N
//
// --config takes the model, diffusion and optimizer sections of a job (any family: Latte, the
// UNet) and its batch.micro unless --batch is given; the samples are synthetic (the job's data
// section is not read), so the figure is the model's compute alone.
//
// --make-batch N times the host's part instead: making a micro-batch of N samples (reading them,
// drawing timesteps and noise, mixing x_t), which a GPU rank does on a helper thread while the
// GPU computes (model/train/batch_ahead.h). It depends on the sample shape alone, so a narrow
// model of the same input size gives the figure of a wide one.
//
// Prints one line per measurement and a summary with medians (see bench/cpu_mfu.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "bench/median.h"
#include "model/cpu/gemm.h"
#include "model/dit/family.h"
#include "model/family/family.h"
#include "model/tensor/buffer.h"
#include "model/train/trainer.h"

namespace difftrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using bench::Median;

// The sgemm ceiling: a large square single-precision GEMM, best of the repeats is not
// used — the median is, as for the model.
double SgemmGflops(int n, int repeats) {
  Buffer<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = b[i] = 1.0f / static_cast<float>(1 + i % 7);
  cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    rates.push_back(2.0 * n * n * n / Seconds(t0, Clock::now()) / 1e9);
  }
  return Median(rates);
}

// The job to time: the --config file's, else a DiT of --model at --input-size.
Result<TrainConfig> BenchConfig(const std::string& config_path, const std::string& model,
                                int input_size, int batch) {
  TrainConfig config;
  if (!config_path.empty()) {
    DT_ASSIGN_OR_RETURN(config, TrainConfig::FromYamlFile(config_path));
  } else {
    DT_ASSIGN_OR_RETURN(DiTConfig dit, DiTConfigByName(model, input_size));
    config.model = DiTSpec(dit);
  }
  if (batch > 0 || config_path.empty()) config.micro_batch = batch > 0 ? batch : 64;
  config.global_batch = config.micro_batch;
  config.data = DataConfig{};
  config.data.kind = "synthetic";
  config.device = "cpu";
  return config;
}

// Median milliseconds of making a micro-batch of `samples` (the trainer reserves activations for
// one sample only: it never steps).
int TimeMakingBatches(TrainConfig config, int samples, int batches, int repeats) {
  config.micro_batch = config.global_batch = 1;
  Result<std::unique_ptr<Trainer>> made = Trainer::Create(config);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().message().c_str());
    return 2;
  }
  MicroBatch mb;
  int64_t first = 0;
  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {  // the first repeat warms up
    const auto t0 = Clock::now();
    for (int b = 0; b < batches; ++b, first += samples) {
      if (Status s = (*made)->MakeMicroBatch(first, samples, mb); !s.ok()) return 1;
    }
    if (r > 0) ms.push_back(Seconds(t0, Clock::now()) * 1e3 / batches);
  }
  const SampleSchema schema = FamilyOf(config.model).Samples(config.model);
  std::printf(
      "make a micro-batch of %d samples of %dx%dx%dx%d: %.2f ms (median of %d), %.1f us a sample\n",
      samples, schema.frames, schema.channels, schema.height, schema.width, Median(ms), repeats,
      Median(ms) * 1e3 / samples);
  return 0;
}

int Main(int argc, char** argv) {
  std::string model = "DiT-S/4", config_path;
  int input_size = 32, batch = 0, steps = 5, repeats = 5, make_batch = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model")
      model = value;
    else if (flag == "--config")
      config_path = value;
    else if (flag == "--input-size")
      input_size = std::stoi(value);
    else if (flag == "--batch")
      batch = std::stoi(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--repeats")
      repeats = std::stoi(value);
    else if (flag == "--make-batch")
      make_batch = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  Result<TrainConfig> config = BenchConfig(config_path, model, input_size, batch);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return 2;
  }
  if (make_batch > 0) return TimeMakingBatches(*config, make_batch, steps, repeats);
  batch = config->micro_batch;
  std::printf("threads %d\n", omp_get_max_threads());
  const double peak = SgemmGflops(2048, repeats);
  std::printf("sgemm 2048^3: %.1f GFLOP/s (median of %d)\n", peak, repeats);

  Result<std::unique_ptr<Trainer>> made = Trainer::Create(*config);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().message().c_str());
    return 2;
  }
  Trainer& trainer = **made;
  // Time steps on one prepared batch: the model's compute alone, not data generation.
  MicroBatch mb;
  if (Status s = trainer.MakeMicroBatch(0, batch, mb); !s.ok()) return 1;
  trainer.StepOn(mb);  // warm-up: allocates the activation arena
  const ModelSpec& spec = config->model;
  const double flops_per_step = FamilyOf(spec).Cost(spec).training_flops_per_sample() * batch;
  const SampleSchema schema = FamilyOf(spec).Samples(spec);
  std::vector<double> step_seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s)
      trainer.StepOn(mb);
    step_seconds.push_back(Seconds(t0, Clock::now()) / steps);
    std::printf("repeat %d: %.3f s/step, %.1f GFLOP/s\n", r, step_seconds.back(),
                flops_per_step / step_seconds.back() / 1e9);
  }
  const double median = Median(step_seconds);
  const double gflops = flops_per_step / median / 1e9;
  std::printf("%s %dx%d batch %d: %.2f samples/s, %.1f GFLOP/s, sgemm %.1f GFLOP/s, MFU %.1f%%\n",
              spec.name().c_str(), schema.height, schema.width, batch, batch / median, gflops, peak,
              100 * gflops / peak);
  return 0;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  return difftrain::Main(argc, argv);
}
