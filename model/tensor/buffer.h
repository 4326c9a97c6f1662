// One zero-filled, 64-byte-aligned allocation of T: the storage of an arena (parameters,
// gradients, optimizer moments, activations each get exactly one).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace difftrain {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : size_(n) {
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<T*>(p));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }
  void Zero() {
    if (size_ > 0) std::memset(data_.get(), 0, bytes());
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

}  // namespace difftrain
