// One zero-filled, 64-byte-aligned allocation of T: the storage of an arena (parameters,
// gradients, optimizer moments, activations each get exactly one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <unistd.h>

namespace difftrain {

// The machine's physical memory in bytes (0 where the system does not say).
inline size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : size_(n) {
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    // The buffer is zero-filled, so all of it is touched: one larger than the machine's
    // memory can never be held, and where the kernel overcommits, the allocation would
    // succeed and the process be killed while filling it. std::bad_alloc instead, which
    // the trainer turns into an error naming the model and the micro-batch.
    const size_t physical = PhysicalMemoryBytes();
    if (n > (SIZE_MAX - 63) / sizeof(T) || (physical > 0 && bytes > physical)) {
      throw std::bad_alloc();
    }
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
