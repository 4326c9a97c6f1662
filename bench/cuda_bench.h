// What the GPU kernel benches share: random device inputs, a launch sequence timed with CUDA
// events on its stream (milliseconds), and the median of a sample.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/cuda/common.h"
#include "model/cuda/device_buffer.h"
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

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace difftrain::bench
