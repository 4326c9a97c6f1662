// The rendezvous store: a small key-value service that every rank of a job reaches.
//
// Communicators bootstrap through it (Gloo exchanges its socket addresses, NCCL its
// unique id) and, once running, leave a trail in it (which op each rank has entered) so
// that a collective that times out can name the ranks that never came. Keys are paths
// ("job/attempt/group/what"); a PrefixStore hands each communicator its own subtree.
// Implementations: FileStore (processes on one machine, tests) and, in the controller,
// a store served over ZeroMQ.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace difftrain::parallel {

class Store {
 public:
  virtual ~Store() = default;

  // Creates or replaces `key`. Readers see the old value or the whole new one.
  virtual Status Set(const std::string& key, std::vector<char> value) = 0;

  // Returns the value of `key`, blocking until it exists. An error when it does not
  // appear within `timeout` (the message names the key and the timeout); a timeout of
  // zero checks once.
  virtual Result<std::vector<char>> Get(const std::string& key,
                                        std::chrono::milliseconds timeout) = 0;

  // Blocks until every key in `keys` exists; an error naming the keys still missing
  // when `timeout` passes.
  virtual Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the counter `key` (a missing key counts as 0) and returns
  // the new value. Counters are stored as decimal ASCII, so Get reads them too.
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// A view of `base` in which every key is "prefix/key". `base` must outlive it.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store& base, std::string prefix);

  const std::string& prefix() const { return prefix_; }

  Status Set(const std::string& key, std::vector<char> value) override;
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::string Join(const std::string& key) const { return prefix_ + "/" + key; }

  Store& base_;
  std::string prefix_;
};

// Keys are files in one directory, so every process on the machine that opens the same
// directory shares the store. Set writes a temporary file and renames it over the key
// (readers never see half a value); Add holds an flock on a per-key lock file; Get and
// Wait poll. Meant for tests and single-machine runs, not for thousands of ranks.
class FileStore final : public Store {
 public:
  // Creates `directory` when it does not exist.
  static Result<FileStore> Open(const std::string& directory);

  const std::string& directory() const { return directory_; }

  Status Set(const std::string& key, std::vector<char> value) override;
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}

  // The file that holds `key`: a file name, whatever characters the key has.
  std::string PathOf(const std::string& key) const;
  Status WriteAtomically(const std::string& key, const std::vector<char>& value);
  // Reads `key` into *value; false when the key does not exist yet.
  Result<bool> TryRead(const std::string& key, std::vector<char>* value) const;

  std::string directory_;
};

}  // namespace difftrain::parallel
