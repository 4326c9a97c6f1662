// A typed device allocation (cudaMalloc), owned and move-only: the CUDA twin of
// model/tensor/buffer.h. Arenas are made of these, allocated once before training.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "model/cuda/common.h"

namespace difftrain::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : size_(n) {
    if (n > 0) DT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
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
