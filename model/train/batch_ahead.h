// Micro-batches made ahead on a helper thread. On a GPU the host is idle while the device
// computes a micro-batch, and making the next one (reading its data, drawing its noise,
// mixing x_t: 41 ms for DiT-XL/2's 256 synthetic samples on one core, docs/benchmarks.md)
// would otherwise sit between two device steps. BatchAhead makes it meanwhile, so a step
// waits for its inputs only where making one takes longer than computing one.
//
// Making early changes nothing: a micro-batch is a function of its first global sample alone
// (model/data/loader.h; the trainer's noise streams are per sample). A batch made ahead for a
// sample that is no longer wanted (a restored checkpoint moved the position) is dropped, and
// the wanted one is made on the caller's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace difftrain {

template <typename Batch>
class BatchAhead {
 public:
  // make(first, batch) fills `batch` with the micro-batch whose first global sample is `first`.
  // It runs on the helper thread while the caller goes on (so it must not touch what the caller
  // changes meanwhile), and on the caller's thread when nothing suitable was made ahead.
  using Make = std::function<Status(int64_t first, Batch& batch)>;

  explicit BatchAhead(Make make) : make_(std::move(make)) {}
  // Waits for a batch in the making, then ends the helper.
  ~BatchAhead() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (helper_.joinable()) helper_.join();
  }
  BatchAhead(const BatchAhead&) = delete;
  BatchAhead& operator=(const BatchAhead&) = delete;

  // The micro-batch that starts at global sample `first`: the one made ahead when it is that one
  // (waiting for it to be finished), otherwise made now. It stays valid and unchanged until the
  // next Take, whatever MakeAhead does meanwhile.
  Result<const Batch*> Take(int64_t first) {
    const auto start = std::chrono::steady_clock::now();
    const int spare = 1 - taken_;
    Status status;
    bool made = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (state_ != State::kIdle) {
        changed_.wait(lock, [&] { return state_ == State::kMade; });
        state_ = State::kIdle;
        made = first_ == first;
        status = status_;
      }
    }
    if (made) {
      ++taken_ahead_;
    } else {
      status = make_(first, buffers_[spare]);
    }
    taken_ = spare;
    waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) return status;
    return &buffers_[spare];
  }

  // Starts making the micro-batch that starts at `first` on the helper thread, into the buffer
  // Take did not return last. At most one is ahead: a Take comes between two calls.
  void MakeAhead(int64_t first) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      DT_CHECK(state_ == State::kIdle, "MakeAhead({}) while batch {} is still ahead", first,
               first_);
      first_ = first;
      target_ = &buffers_[1 - taken_];
      state_ = State::kAsked;
      if (!helper_.joinable()) helper_ = std::thread([this] { Run(); });
    }
    changed_.notify_all();
  }

  // Seconds Take spent waiting for or making its batches since the last call.
  double TakeWaitSeconds() { return std::exchange(waited_, 0.0); }
  // How many Takes returned a batch made ahead.
  int64_t taken_ahead() const { return taken_ahead_; }

 private:
  enum class State { kIdle, kAsked, kMaking, kMade };

  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || state_ == State::kAsked; });
      if (stop_) return;
      state_ = State::kMaking;
      const int64_t first = first_;
      Batch* target = target_;
      lock.unlock();
      Status status = make_(first, *target);
      lock.lock();
      status_ = std::move(status);
      state_ = State::kMade;
      changed_.notify_all();
    }
  }

  const Make make_;
  Batch buffers_[2];
  int taken_ = 1;  // the buffer Take returned last (the caller's); the other is the spare
  double waited_ = 0;
  int64_t taken_ahead_ = 0;

  // The batch ahead, guarded by mutex_: asked for, being made, or made (with its status).
  std::mutex mutex_;
  std::condition_variable changed_;
  State state_ = State::kIdle;
  int64_t first_ = 0;
  Batch* target_ = nullptr;
  Status status_;
  bool stop_ = false;
  std::thread helper_;  // started by the first MakeAhead
};

}  // namespace difftrain
