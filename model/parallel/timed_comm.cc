#include "model/parallel/timed_comm.h"

#include <chrono>
#include <utility>

namespace difftrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The handle of a timed op: its Wait counts as waiting for the op.
class TimedWork : public CommWork {
 public:
  TimedWork(std::unique_ptr<CommWork> inner, CommTimes& times, const std::string& group,
            const char* op)
      : inner_(std::move(inner)), times_(times), group_(group), op_(op) {}

  Status Wait() override {
    const Clock::time_point t0 = Clock::now();
    Status s = inner_->Wait();
    times_.Add(group_, op_, SecondsSince(t0));
    return s;
  }

 private:
  std::unique_ptr<CommWork> inner_;
  CommTimes& times_;
  const std::string group_;
  const char* op_;
};

class TimedComm : public Comm {
 public:
  TimedComm(std::unique_ptr<Comm> inner, CommTimes& times)
      : inner_(std::move(inner)),
        times_(times),
        group_(inner_->name().substr(0, inner_->name().find('['))) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  std::unique_ptr<CommWork> AllReduceAsync(float* data, size_t n, ReduceOp op) override {
    return Timed("all_reduce", [&] { return inner_->AllReduceAsync(data, n, op); });
  }
  std::unique_ptr<CommWork> ReduceScatterAsync(const float* in, float* out, size_t n_per_rank,
                                               ReduceOp op) override {
    return Timed("reduce_scatter",
                 [&] { return inner_->ReduceScatterAsync(in, out, n_per_rank, op); });
  }
  std::unique_ptr<CommWork> AllGatherAsync(const float* in, float* out,
                                           size_t n_per_rank) override {
    return Timed("all_gather", [&] { return inner_->AllGatherAsync(in, out, n_per_rank); });
  }
  std::unique_ptr<CommWork> BroadcastAsync(float* data, size_t n, int root) override {
    return Timed("broadcast", [&] { return inner_->BroadcastAsync(data, n, root); });
  }
  std::unique_ptr<CommWork> SendAsync(const float* data, size_t n, int dst) override {
    return Timed("send", [&] { return inner_->SendAsync(data, n, dst); });
  }
  std::unique_ptr<CommWork> RecvAsync(float* data, size_t n, int src) override {
    return Timed("recv", [&] { return inner_->RecvAsync(data, n, src); });
  }
  std::unique_ptr<CommWork> BarrierAsync() override {
    return Timed("barrier", [&] { return inner_->BarrierAsync(); });
  }

 private:
  // Posting may block too (a backend that runs the op in the caller): that time counts.
  template <typename Post>
  std::unique_ptr<CommWork> Timed(const char* op, Post post) {
    const Clock::time_point t0 = Clock::now();
    std::unique_ptr<CommWork> work = post();
    times_.Add(group_, op, SecondsSince(t0));
    return std::make_unique<TimedWork>(std::move(work), times_, group_, op);
  }

  std::unique_ptr<Comm> inner_;
  CommTimes& times_;
  const std::string group_;
};

}  // namespace

void CommTimes::Add(const std::string& group, const char* op, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  seconds_[group][op] += seconds;
}

CommTimes::Table CommTimes::Take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(seconds_, {});
}

std::unique_ptr<Comm> TimeComm(std::unique_ptr<Comm> inner, CommTimes& times) {
  return std::make_unique<TimedComm>(std::move(inner), times);
}

}  // namespace difftrain::parallel
