// What the GPU tests share: skipping where there is no GPU (with the runtime's reason),
// poisoning outputs so that an element a kernel never writes is caught, bf16 round trips,
// and the relative L2 error against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/cuda/device_buffer.h"
#include "model/tensor/rng.h"

namespace difftrain::cuda::testing {

// Empty when a GPU can run kernels; otherwise why not.
inline std::string NoGpuReason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    return std::string("no usable CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  return "";
}

#define DT_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                           \
    const std::string dt_no_gpu_ = ::difftrain::cuda::testing::NoGpuReason();    \
    if (!dt_no_gpu_.empty()) GTEST_SKIP() << "GPU test skipped: " << dt_no_gpu_; \
  } while (0)

// Fills a device buffer with all-ones bytes: NaN in fp32 and in bf16, so an unwritten output
// element fails every comparison.
template <typename T>
void Poison(DeviceBuffer<T>& buffer) {
  DT_CUDA_CHECK(cudaMemset(buffer.data(), 0xFF, buffer.bytes()));
}

inline std::vector<float> RandomVector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed, RngStream::kData);
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(rng.Normal() * scale);
  return v;
}

// Rounds to bf16 and back, so the CPU reference sees exactly the inputs the GPU reads.
inline std::vector<float> RoundToBf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = __bfloat162float(__float2bfloat16(v[i]));
  return r;
}

inline DeviceBuffer<bf16> UploadBf16(const std::vector<float>& v) {
  std::vector<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    h[i] = __float2bfloat16(v[i]);
  DeviceBuffer<bf16> d(v.size());
  d.Upload(h);
  return d;
}

inline DeviceBuffer<float> UploadFloat(const std::vector<float>& v) {
  DeviceBuffer<float> d(v.size());
  d.Upload(v);
  return d;
}

inline std::vector<float> DownloadAsFloat(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> h = d.Download();
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    v[i] = __bfloat162float(h[i]);
  return v;
}
inline std::vector<float> DownloadAsFloat(const DeviceBuffer<float>& d) {
  return d.Download();
}

// ‖got − want‖₂ / ‖want‖₂; infinite when got has a NaN or Inf (a poisoned element).
inline double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

}  // namespace difftrain::cuda::testing
