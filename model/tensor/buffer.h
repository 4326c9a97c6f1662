// One zero-filled, 64-byte-aligned allocation of T: the storage of an arena (parameters,
// gradients, optimizer moments, activations each get exactly one). Zero-filled by writing, or,
// with BufferPages::kOnFirstTouch, by the kernel as each page is first touched: an arena parts
// of which may never be used (a LoRA run's gradients of its frozen weights) costs memory only
// for the pages that are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <sys/mman.h>

#include "model/tensor/host_memory.h"

namespace difftrain {

enum class BufferPages { kTouched, kOnFirstTouch };

template <typename T>
class Buffer {
 public:
  static constexpr size_t kCheckedBytes = size_t(64) << 20;

  Buffer() = default;
  explicit Buffer(size_t n, BufferPages pages = BufferPages::kTouched) : size_(n) {
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    // The buffer is zero-filled, so all of it is touched: one larger than the memory this
    // process may still take (the machine's available memory, or what its cgroup's limit
    // leaves) is not refused by the kernel, which overcommits, but gets the process
    // OOM-killed while it is filled. std::bad_alloc instead, which the trainer turns into an
    // error naming the model, the micro-batch and the limit. The limit is read only for
    // allocations that could matter (an arena, not a small table).
    if (n > (SIZE_MAX - 63) / sizeof(T) ||
        (bytes >= kCheckedBytes && bytes > ReadHostMemory().headroom())) {
      throw std::bad_alloc();
    }
    if (pages == BufferPages::kOnFirstTouch) {
      // An anonymous mapping: page-aligned, and zero where it is read before it is written.
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = std::unique_ptr<T, Free>(static_cast<T*>(p), Free{bytes});
      return;
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
    size_t mapped_bytes = 0;  // of a mapping; 0: from aligned_alloc
    void operator()(T* p) const {
      if (mapped_bytes > 0) {
        munmap(p, mapped_bytes);
      } else {
        std::free(p);
      }
    }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

}  // namespace difftrain
