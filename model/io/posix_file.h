// POSIX file helpers for model/io: the one place where OS errors become Status, and the
// write-to-a-temporary, fsync, rename, fsync-the-directory sequence that makes a file
// appear whole or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace difftrain::io {

// "<what> '<path>': <strerror(err)>".
Status OsError(const std::string& what, const std::string& path, int err);

// A file opened for reading, closed when destroyed.
class InputFile {
 public:
  static Result<InputFile> Open(const std::string& path);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  ~InputFile();

  uint64_t size() const { return size_; }
  // Reads exactly `bytes` bytes from the current position; a file that ends early is an
  // error (it changed under us, since its size was taken at Open).
  Status Read(void* dst, size_t bytes);

 private:
  InputFile(std::string path, int fd, uint64_t size);
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole content of a (small) file.
Result<std::string> ReadWholeFile(const std::string& path);

// Writes `path` so that readers and crashes see either the old file or the complete new
// one: bytes go to `<path>.tmp.<pid>`; Commit fsyncs it, renames it over `path` and fsyncs
// the directory. A writer destroyed without Commit removes its temporary file.
class AtomicFileWriter {
 public:
  static Result<AtomicFileWriter> Open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  ~AtomicFileWriter();

  Status Append(const void* data, size_t bytes);
  // Overwrites `bytes` bytes at `offset` of what was appended (a header written again once the
  // data after it is known), leaving the position where appending continues.
  Status WriteAt(uint64_t offset, const void* data, size_t bytes);
  Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp_path, int fd);
  // All of `bytes`: at the position (no `offset`) or at `offset`, leaving the position as it is.
  Status Write(const void* data, size_t bytes, std::optional<uint64_t> offset);
  void Abandon();
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

// Makes the entries of directory `dir` (files created, renamed or removed in it) durable.
Status FsyncDirectory(const std::string& dir);

// The directory part of `path` ("." when it has none).
std::string ParentDirectory(const std::string& path);

}  // namespace difftrain::io
