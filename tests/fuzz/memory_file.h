// A fuzz input as a file that touches no disk (an anonymous memory file), for the readers that
// take a path: its /proc/self/fd/N name opens it. Closed when destroyed.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace difftrain::fuzz {

class MemoryFile {
 public:
  // The file holds `data`, then `hole` bytes of zeros that take no memory (a sparse file: the
  // data a header describes, for readers of the header alone).
  MemoryFile(const uint8_t* data, size_t size, uint64_t hole = 0)
      : fd_(::memfd_create("fuzz_input", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    if (hole > 0 && ::ftruncate(fd_, static_cast<off_t>(size + hole)) != 0) std::abort();
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace difftrain::fuzz
