// The roll call of one process group, shared by the communicator backends: which ranks
// arrived at the rendezvous and how far each has got in the group's sequence of
// collectives, kept in the store, so that a rank whose rendezvous or op fails can name
// the ranks that did not take part. Keys (under the group's prefix) and the rules are
// in docs/communication.md.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "model/parallel/store.h"

namespace difftrain::parallel {

class RollCall {
 public:
  using Clock = std::chrono::steady_clock;

  // `store` is the group's view (a PrefixStore) and must outlive the roll call. `rank` is
  // the group rank; `global_ranks` and `name` are for messages.
  RollCall(Store& store, std::string name, int rank, std::vector<int> global_ranks,
           std::chrono::milliseconds timeout);
  ~RollCall();

  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  // Announces this rank and waits up to the timeout for every other: the error names
  // the group, "rendezvous" and the ranks that did not arrive.
  Status Arrive();

  // This rank entered / completed collective `seq` (counted from 1). Cheap: the store
  // hears of it from a thread of its own, at most once per ProgressInterval, so no op
  // waits for a store round trip and the store's load does not grow with the op rate.
  void Entered(int64_t seq);
  void Completed(int64_t seq);

  // Called when collective `seq`, started here at `start`, failed on this rank. Tells the
  // others, waits for theirs until the op's deadline plus a grace, and returns what it
  // found: "missing ranks: 2 (never started it), 5 (started it, then went silent)".
  std::string Diagnose(int64_t seq, Clock::time_point start);

 private:
  struct Progress {
    int64_t entered = 0;
    int64_t completed = 0;
  };

  void Publish();
  Progress ReadProgress(int q);
  template <typename Change>
  void Update(Change change);

  Store& store_;
  const std::string name_;
  const int rank_;
  const std::vector<int> global_ranks_;
  const std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  Progress latest_;
  uint64_t version_ = 0;  // bumped on every change of latest_
  bool stopping_ = false;
  std::thread publisher_;  // last: it starts running in the constructor
};

}  // namespace difftrain::parallel
