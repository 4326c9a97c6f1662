#include "model/parallel/roll_call.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

namespace difftrain::parallel {
namespace {

using std::chrono::milliseconds;

// How long a rank whose op failed waits to hear from the others (see Diagnose): enough
// for peers that started the op a little later to time out too, and longer than a
// progress report may lag (ProgressInterval).
milliseconds ReportGrace(milliseconds timeout) {
  return std::clamp(timeout / 4, milliseconds(50), milliseconds(5000));
}

// How often a rank's progress reaches the store at most.
milliseconds ProgressInterval(milliseconds timeout) {
  return std::clamp(timeout / 10, milliseconds(10), milliseconds(1000));
}

std::string ArrivedKey(int rank) {
  return fmt::format("arrived/{}", rank);
}
std::string ProgressKey(int rank) {
  return fmt::format("progress/{}", rank);
}
std::string FailedKey(int64_t seq, int rank) {
  return fmt::format("failed/{}/{}", seq, rank);
}

}  // namespace

RollCall::RollCall(Store& store, std::string name, int rank, std::vector<int> global_ranks,
                   milliseconds timeout)
    : store_(store),
      name_(std::move(name)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      publisher_([this] { Publish(); }) {}

RollCall::~RollCall() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  publisher_.join();
}

Status RollCall::Arrive() {
  const int me = global_ranks_[rank_];
  DT_RETURN_IF_ERROR(store_.Set(ArrivedKey(rank_), {})
                         .WithContext(fmt::format("{}: rendezvous of rank {}", name_, me)));
  const int size = static_cast<int>(global_ranks_.size());
  std::vector<std::string> arrivals;
  for (int q = 0; q < size; ++q)
    arrivals.push_back(ArrivedKey(q));
  if (store_.Wait(arrivals, timeout_).ok()) return Status::Ok();
  std::vector<int> missing;
  for (int q = 0; q < size; ++q) {
    if (!store_.Get(arrivals[q], milliseconds(0)).ok()) missing.push_back(global_ranks_[q]);
  }
  // Wait also fails on a store error, after which every rank may have arrived.
  if (missing.empty()) return Status::Ok();
  return Errorf("{}: rendezvous of rank {} timed out after {} ms; ranks that did not arrive: {}",
                name_, me, timeout_.count(), fmt::join(missing, ", "));
}

template <typename Change>
void RollCall::Update(Change change) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    change();
    ++version_;
  }
  cv_.notify_all();
}

void RollCall::Entered(int64_t seq) {
  Update([&] { latest_.entered = seq; });
}

void RollCall::Completed(int64_t seq) {
  // Ops finish in order, but a backend may learn of them out of order (a caller that
  // waits for a later op first): the furthest completion counts.
  Update([&] { latest_.completed = std::max(latest_.completed, seq); });
}

// The publisher thread: writes the latest Progress as "entered completed", then rests
// for ProgressInterval, so changes in between are folded into the next write.
void RollCall::Publish() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t published = 0;
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || version_ != published; });
    if (stopping_) return;
    const Progress progress = latest_;
    published = version_;
    lock.unlock();
    const std::string text = fmt::format("{} {}", progress.entered, progress.completed);
    // A failed write only makes a later diagnosis less precise; the ops go on, and fail
    // by themselves if the network is gone.
    (void)store_.Set(ProgressKey(rank_), {text.begin(), text.end()});
    lock.lock();
    cv_.wait_for(lock, ProgressInterval(timeout_), [&] { return stopping_; });
  }
}

RollCall::Progress RollCall::ReadProgress(int q) {
  Progress progress;  // zeros while q has published nothing
  Result<std::vector<char>> value = store_.Get(ProgressKey(q), milliseconds(0));
  if (value.ok()) {
    std::istringstream(std::string(value->begin(), value->end())) >> progress.entered >>
        progress.completed;
  }
  return progress;
}

// A peer took part in op `seq` if it completed it or reports that it failed for it too.
// Peers that started the op at about the same time fail within the timeout of each
// other, so we listen until our own deadline plus a grace; whoever has not answered by
// then is missing, and its progress tells whether it ever entered the op.
std::string RollCall::Diagnose(int64_t seq, Clock::time_point start) {
  const Status reported = store_.Set(FailedKey(seq, rank_), {});
  if (!reported.ok()) return "the store is unusable (" + reported.message() + ")";
  const Clock::time_point deadline =
      std::max(Clock::now(), start + timeout_) + ReportGrace(timeout_);
  const int size = static_cast<int>(global_ranks_.size());
  std::vector<int> silent;
  for (int q = 0; q < size; ++q) {
    if (q != rank_) silent.push_back(q);
  }
  std::vector<Progress> progress(size);
  while (true) {
    std::vector<int> still_silent;
    for (int q : silent) {
      progress[q] = ReadProgress(q);
      const bool took_part =
          progress[q].completed >= seq || store_.Get(FailedKey(seq, q), milliseconds(0)).ok();
      if (!took_part) still_silent.push_back(q);
    }
    silent = std::move(still_silent);
    if (silent.empty() || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  if (silent.empty()) return "every rank of the group reached it";
  std::vector<std::string> missing;
  for (int q : silent) {
    missing.push_back(fmt::format(
        "{} ({})", global_ranks_[q],
        progress[q].entered < seq ? "never started it" : "started it, then went silent"));
  }
  return fmt::format("missing ranks: {}", fmt::join(missing, ", "));
}

}  // namespace difftrain::parallel
