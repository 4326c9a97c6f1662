#include "model/parallel/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "common/check.h"

namespace difftrain::parallel {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// --- PrefixStore ---

PrefixStore::PrefixStore(Store& base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {
  DT_CHECK(!prefix_.empty() && prefix_.back() != '/', "bad store prefix '{}'", prefix_);
}

Status PrefixStore::Set(const std::string& key, std::vector<char> value) {
  return base_.Set(Join(key), std::move(value));
}

Result<std::vector<char>> PrefixStore::Get(const std::string& key, milliseconds timeout) {
  return base_.Get(Join(key), timeout);
}

Status PrefixStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const std::string& key : keys)
    joined.push_back(Join(key));
  return base_.Wait(joined, timeout);
}

Result<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return base_.Add(Join(key), delta);
}

// --- FileStore ---

namespace {

// The one place where errno becomes a Status.
Status PosixError(const std::string& what, int err) {
  return Errorf("{}: {}", what, std::strerror(err));
}

// Closes a descriptor on every path out of a function (and so releases its flock).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Keys become file names: letters, digits, '_', '-' and non-leading '.' stay; every other
// byte becomes %XX. So no name starts with '.', which keeps the store's own ".tmp." and
// ".lock." files apart from keys. Names past the file-system limit keep their first
// characters (for people listing the directory) and end in '~' and a hash of the whole
// key; '~' itself is always escaped, so such a name cannot equal another key's.
std::string FileNameOf(const std::string& key) {
  std::string name;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0)) {
      name.push_back(static_cast<char>(c));
    } else {
      name += fmt::format("%{:02X}", c);
    }
  }
  constexpr size_t kMaxName = 200;  // below NAME_MAX (255) with room for ".lock."/".tmp."
  if (name.size() > kMaxName) name = fmt::format("{}~{:016x}", name.substr(0, 100), Fnv1a64(key));
  return name;
}

// Polls `ready` until it returns true or an error, or `timeout` passes. Starts fast
// (values usually appear within milliseconds) and backs off so that long waits stay cheap.
template <typename Ready>
Result<bool> PollUntil(milliseconds timeout, Ready ready) {
  const Clock::time_point deadline = Clock::now() + timeout;
  milliseconds pause(1);
  while (true) {
    Result<bool> done = ready();
    if (!done.ok() || *done) return done;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, milliseconds(20));
  }
}

}  // namespace

Result<FileStore> FileStore::Open(const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) return Errorf("creating file store '{}': {}", directory, ec.message());
  return FileStore(directory);
}

std::string FileStore::PathOf(const std::string& key) const {
  return directory_ + "/" + FileNameOf(key);
}

Result<bool> FileStore::TryRead(const std::string& key, std::vector<char>* value) const {
  const std::string path = PathOf(key);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return false;
    return PosixError(fmt::format("reading store key '{}' ({})", key, path), errno);
  }
  // The file is never modified in place (writers rename a new file over it), so its
  // size cannot change while we read it.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return PosixError("stat " + path, errno);
  value->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < value->size()) {
    const ssize_t n = ::read(fd.get(), value->data() + done, value->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return PosixError("reading " + path, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  return true;
}

Status FileStore::WriteAtomically(const std::string& key, const std::vector<char>& value) {
  // Unique among threads and processes sharing the directory.
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = fmt::format("{}/.tmp.{}.{}.{}", directory_, FileNameOf(key), ::getpid(),
                                      counter.fetch_add(1));
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0)
      return PosixError(fmt::format("writing store key '{}' ({})", key, tmp), errno);
    size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd.get(), value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        return PosixError("writing " + tmp, err);
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return PosixError(fmt::format("publishing store key '{}' ({})", key, path), err);
  }
  return Status::Ok();
}

Status FileStore::Set(const std::string& key, std::vector<char> value) {
  return WriteAtomically(key, value);
}

Result<std::vector<char>> FileStore::Get(const std::string& key, milliseconds timeout) {
  std::vector<char> value;
  Result<bool> found = PollUntil(timeout, [&] { return TryRead(key, &value); });
  if (!found.ok()) return found.status();
  if (!*found) {
    return Errorf("file store '{}': key '{}' did not appear within {} ms", directory_, key,
                  timeout.count());
  }
  return value;
}

Status FileStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<std::string> missing = keys;
  auto all_exist = [&]() -> Result<bool> {
    std::erase_if(missing, [&](const std::string& key) {
      struct stat st;
      return ::stat(PathOf(key).c_str(), &st) == 0;
    });
    return missing.empty();
  };
  Result<bool> done = PollUntil(timeout, all_exist);
  if (!done.ok()) return done.status();
  if (!*done) {
    return Errorf("file store '{}': keys did not appear within {} ms: '{}'", directory_,
                  timeout.count(), fmt::join(missing, "', '"));
  }
  return Status::Ok();
}

Result<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = directory_ + "/.lock." + FileNameOf(key);
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.get() < 0) return PosixError("opening lock " + lock_path, errno);
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return PosixError("locking " + lock_path, errno);
  }
  std::vector<char> current;
  Result<bool> exists = TryRead(key, &current);
  if (!exists.ok()) return exists.status();
  int64_t value = 0;
  if (*exists) {
    const char* end = current.data() + current.size();
    const auto [ptr, ec] = std::from_chars(current.data(), end, value);
    if (ec != std::errc() || ptr != end) {
      return Errorf("file store '{}': key '{}' does not hold a counter", directory_, key);
    }
  }
  value += delta;
  const std::string text = std::to_string(value);
  DT_RETURN_IF_ERROR(WriteAtomically(key, std::vector<char>(text.begin(), text.end())));
  return value;
}

}  // namespace difftrain::parallel
