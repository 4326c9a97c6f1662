// A typed device allocation (cudaMalloc), owned and move-only: the CUDA twin of
// model/tensor/buffer.h. Arenas are made of these, allocated once before training.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/cuda/common.h"

namespace difftrain::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : size_(n) {
    if (n > 0) DT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  // n elements, or the runtime's reason (out of memory, mostly) as an error instead of
  // stopping the process.
  static Result<DeviceBuffer> TryAllocate(size_t n) {
    DeviceBuffer buffer;
    if (n == 0) return buffer;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&buffer.data_), n * sizeof(T));
    if (e != cudaSuccess) {
      constexpr double kGiB = 1 << 30;
      std::string room;
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        room = fmt::format(" ({:.2f} GiB free of {:.2f})", free_bytes / kGiB, total_bytes / kGiB);
      }
      (void)cudaGetLastError();  // these failures are not sticky: clear them for the next call
      return Errorf("allocating {:.2f} GiB on the GPU{}: {}", n * sizeof(T) / kGiB, room,
                    cudaGetErrorString(e));
    }
    buffer.size_ = n;
    return buffer;
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  // Synchronous copies of the whole buffer (set-up and tests, not the step).
  void Upload(const T* host) {
    DT_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void Upload(const std::vector<T>& host) {
    DT_CHECK(host.size() == size_, "uploading {} elements into {}", host.size(), size_);
    Upload(host.data());
  }
  std::vector<T> Download() const {
    std::vector<T> host(size_);
    DT_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace difftrain::cuda
