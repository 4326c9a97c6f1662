// What the GPU kernel benches share: random device inputs, a launch sequence timed with CUDA
// events on its stream (milliseconds), and the median of a sample.
#pragma once

#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/median.h"

#include "model/cuda/common.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/device_query.h"
#include "model/tensor/rng.h"

namespace difftrain::bench {

// n normal values of the given scale (T float or bf16), on the device.
template <typename T>
cuda::DeviceBuffer<T> RandomDevice(size_t n, uint64_t seed, double scale) {
  Rng rng(seed, RngStream::kData);
  std::vector<T> host(n);
  for (T& v : host)
    v = T(static_cast<float>(rng.Normal() * scale));
  cuda::DeviceBuffer<T> d(n);
  d.Upload(host);
  return d;
}

class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {
    DT_CUDA_CHECK(cudaEventCreate(&start_));
    DT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Runs `launch` between two events and waits for the second.
  double Time(const std::function<void()>& launch) {
    DT_CUDA_CHECK(cudaEventRecord(start_, stream_));
    launch();
    DT_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    DT_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The GPUs cuda::QueryDevices finds; none, after printing "<program>: no usable GPU: <why>".
inline std::vector<cuda::DeviceProperties> GpusOrSayWhy(const char* program) {
  std::string no_gpu;
  std::vector<cuda::DeviceProperties> devices = cuda::QueryDevices(&no_gpu);
  if (devices.empty()) std::fprintf(stderr, "%s: no usable GPU: %s\n", program, no_gpu.c_str());
  return devices;
}

// Bytes in use on the current GPU (total − free), for a peak-memory reading against a baseline.
inline double UsedDeviceBytes() {
  size_t free = 0, total = 0;
  DT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<double>(total - free);
}

// What every training-step bench takes (bench_cuda_dit, bench_cuda_unet).
struct StepOptions {
  int micro_batch = 32;
  int warmup = 5;
  int steps = 20;
  bool no_graph = false;
  double peak_tflops = 989;
};
inline void AddStepOptions(CLI::App& app, StepOptions& o) {
  app.add_option("--micro-batch", o.micro_batch, "samples per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--no-graph", o.no_graph, "launch every kernel instead of replaying a CUDA graph");
  app.add_option("--peak-tflops", o.peak_tflops, "the GPU's dense bf16 peak, for MFU")
      ->capture_default_str();
}

// A whole training step, `warmup` untimed times then `steps` timed ones (step(i), i from 0),
// each between CUDA events on `stream`, then after(i) where given, once the step has ended:
// the timed steps' milliseconds, sorted.
inline std::vector<double> TimeSteps(cudaStream_t stream, int warmup, int steps,
                                     const std::function<void(int)>& step,
                                     const std::function<void(int)>& after = nullptr) {
  EventTimer timer(stream);
  std::vector<double> ms;
  for (int i = 0; i < warmup + steps; ++i) {
    const double elapsed = timer.Time([&] { step(i); });
    if (after) after(i);
    if (i >= warmup) ms.push_back(elapsed);
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

// A step bench's timing fields from the timed steps' sorted milliseconds: the median, min and
// max step, samples/s, TFLOP/s at `flops_per_sample`, MFU against --peak-tflops, and the
// device memory in use now beyond `baseline_bytes`.
inline nlohmann::json StepFields(const StepOptions& o, const std::vector<double>& sorted_ms,
                                 double flops_per_sample, double baseline_bytes) {
  const double median_ms = sorted_ms[sorted_ms.size() / 2];
  const double samples_per_s = o.micro_batch / (median_ms / 1e3);
  const double tflops = samples_per_s * flops_per_sample / 1e12;
  return {{"mode", o.no_graph ? "eager" : "cuda-graph"},
          {"micro_batch", o.micro_batch},
          {"steps", o.steps},
          {"step_ms_median", median_ms},
          {"step_ms_min", sorted_ms.front()},
          {"step_ms_max", sorted_ms.back()},
          {"samples_per_s", samples_per_s},
          {"tflops", tflops},
          {"mfu", tflops / o.peak_tflops},
          {"peak_mem_gib", (UsedDeviceBytes() - baseline_bytes) / (1u << 30)}};
}

}  // namespace difftrain::bench
