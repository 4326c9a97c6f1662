#include "model/io/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace difftrain::io {
namespace {

// Linux moves at most about 2 GiB per read/write call; larger requests come back short
// anyway, so ask for at most this much at a time.
constexpr size_t kMaxIoBytes = size_t{1} << 30;

int OpenRetrying(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

Status OsError(const std::string& what, const std::string& path, int err) {
  return Errorf("{} '{}': {}", what, path, std::strerror(err));
}

std::string ParentDirectory(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// ---- InputFile ----

InputFile::InputFile(std::string path, int fd, uint64_t size)
    : path_(std::move(path)), fd_(fd), size_(size) {}

InputFile::InputFile(InputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<InputFile> InputFile::Open(const std::string& path) {
  int fd = OpenRetrying(path.c_str(), O_RDONLY);
  if (fd < 0) return OsError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return OsError("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Errorf("'{}' is not a regular file", path);
  }
  return InputFile(path, fd, static_cast<uint64_t>(st.st_size));
}

Status InputFile::Read(void* dst, size_t bytes) {
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::read(fd_, out + done, std::min(bytes - done, kMaxIoBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return OsError("cannot read", path_, errno);
    if (n == 0) {
      return Errorf("'{}' ended early: wanted {} bytes, got {} (did it change while read?)", path_,
                    bytes, done);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  DT_ASSIGN_OR_RETURN(InputFile file, InputFile::Open(path));
  std::string content(file.size(), '\0');
  DT_RETURN_IF_ERROR(file.Read(content.data(), content.size()));
  return content;
}

// ---- AtomicFileWriter ----

AtomicFileWriter::AtomicFileWriter(std::string path, std::string tmp_path, int fd)
    : path_(std::move(path)), tmp_path_(std::move(tmp_path)), fd_(fd) {}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() {
  Abandon();
}

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_path_.c_str());
  fd_ = -1;
}

Result<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  // The pid keeps two processes that write the same path (a restarted rank racing its
  // predecessor) from writing into one temporary file.
  std::string tmp_path = path + ".tmp." + std::to_string(::getpid());
  int fd = OpenRetrying(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return OsError("cannot create", tmp_path, errno);
  return AtomicFileWriter(path, std::move(tmp_path), fd);
}

Status AtomicFileWriter::Append(const void* data, size_t bytes) {
  return Write(data, bytes, std::nullopt);
}

Status AtomicFileWriter::WriteAt(uint64_t offset, const void* data, size_t bytes) {
  return Write(data, bytes, offset);
}

Status AtomicFileWriter::Write(const void* data, size_t bytes, std::optional<uint64_t> offset) {
  const auto* in = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const size_t piece = std::min(bytes - done, kMaxIoBytes);
    ssize_t n = offset ? ::pwrite(fd_, in + done, piece, static_cast<off_t>(*offset + done))
                       : ::write(fd_, in + done, piece);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return OsError("cannot write", tmp_path_, errno);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  // Data must be on disk before the rename makes it visible under the real name, or a
  // crash could leave a complete-looking name over a file with holes.
  if (::fsync(fd_) != 0) return OsError("cannot fsync", tmp_path_, errno);
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    return OsError("cannot close", tmp_path_, err);
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    return OsError("cannot rename '" + tmp_path_ + "' to", path_, err);
  }
  return FsyncDirectory(ParentDirectory(path_));
}

Status FsyncDirectory(const std::string& dir) {
  int fd = OpenRetrying(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return OsError("cannot open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return OsError("cannot fsync directory", dir, err);
  return Status::Ok();
}

}  // namespace difftrain::io
