#include "model/parallel/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/check.h"

namespace difftrain::parallel {

std::vector<Range> GradientSync::BucketRanges(size_t n, size_t bucket_elements, size_t dp) {
  // Full buckets are a multiple of dp long, so only the bucket at the start of the arena
  // can need padding.
  const size_t step = std::max(dp, bucket_elements / dp * dp);
  std::vector<Range> ranges;
  for (size_t end = n; end > 0;) {
    const size_t begin = end > step ? end - step : 0;
    ranges.push_back({begin, end});
    end = begin;
  }
  return ranges;
}

std::vector<Range> GradientSync::OwnedRanges(size_t n, size_t bucket_elements, bool zero1, int size,
                                             int rank) {
  if (!zero1) return {{0, n}};
  const size_t dp = static_cast<size_t>(size), r = static_cast<size_t>(rank);
  const std::vector<Range> buckets = BucketRanges(n, bucket_elements, dp);
  std::vector<Range> owned;
  for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
    const size_t piece = (it->size() + dp - 1) / dp;
    const size_t begin = std::min(it->begin + r * piece, it->end);
    const size_t end = std::min(begin + piece, it->end);
    if (end > begin) owned.push_back({begin, end});
  }
  return owned;
}

GradientSync::GradientSync(Comm& comm, size_t n, size_t bucket_elements, bool zero1, bool overlap)
    : comm_(comm), n_(n), zero1_(zero1), overlap_(overlap) {
  DT_CHECK(n > 0 && bucket_elements > 0, "empty arena or bucket");
  const size_t dp = static_cast<size_t>(comm.size());
  for (const Range& r : BucketRanges(n, bucket_elements, dp)) {
    Bucket b;
    b.range = r;
    b.piece = (r.size() + dp - 1) / dp;
    buckets_.push_back(std::move(b));
  }
  owned_ = OwnedRanges(n, bucket_elements, zero1, comm.size(), comm.rank());
  for (const Range& o : owned_)
    owned_elements_ += o.size();
  for (const Bucket& b : buckets_) {
    if (zero1 && Padded(b)) scratch_.resize(b.piece * dp);
  }
}

void GradientSync::Begin(float* grads) {
  grads_ = grads;
  for (Bucket& b : buckets_) {
    b.started = false;
    b.work.reset();
  }
}

void GradientSync::Start(Bucket& b) {
  b.started = true;
  float* data = grads_ + b.range.begin;
  if (!zero1_) {
    b.work = comm_.AllReduceAsync(data, b.range.size(), ReduceOp::kAvg);
  } else if (!Padded(b)) {
    b.work = comm_.ReduceScatterAsync(data, data + comm_.rank() * b.piece, b.piece, ReduceOp::kAvg);
  } else {
    std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    std::memcpy(scratch_.data(), data, b.range.size() * sizeof(float));
    b.work = comm_.ReduceScatterAsync(scratch_.data(), scratch_.data() + comm_.rank() * b.piece,
                                      b.piece, ReduceOp::kAvg);
  }
}

void GradientSync::OnGradientsReady(size_t from) {
  if (!overlap_) return;
  for (Bucket& b : buckets_) {
    if (!b.started && b.range.begin >= from) Start(b);
  }
}

Result<double> GradientSync::Finish() {
  for (Bucket& b : buckets_) {
    if (!b.started) Start(b);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) {
    Status s = b.work->Wait();
    if (!s.ok()) return s.WithContext("gradient synchronisation");
    b.work.reset();
    if (zero1_ && Padded(b)) {
      // Copy the owned part of the averaged piece back into the arena.
      const size_t begin = std::min(b.range.begin + comm_.rank() * b.piece, b.range.end);
      const size_t end = std::min(begin + b.piece, b.range.end);
      std::memcpy(grads_ + begin, scratch_.data() + comm_.rank() * b.piece,
                  (end - begin) * sizeof(float));
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status GradientSync::GatherParameters(float* params) {
  if (!zero1_) return Status::Ok();
  std::vector<std::unique_ptr<CommWork>> works;
  for (Bucket& b : buckets_) {
    float* data = params + b.range.begin;
    if (!Padded(b)) {
      works.push_back(comm_.AllGatherAsync(data + comm_.rank() * b.piece, data, b.piece));
    }
  }
  for (auto& w : works)
    DT_RETURN_IF_ERROR(w->Wait().WithContext("parameter all-gather"));
  for (Bucket& b : buckets_) {
    if (!Padded(b)) continue;
    float* data = params + b.range.begin;
    std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    std::memcpy(scratch_.data(), data, b.range.size() * sizeof(float));
    float* mine = scratch_.data() + comm_.rank() * b.piece;
    DT_RETURN_IF_ERROR(
        comm_.AllGather(mine, scratch_.data(), b.piece).WithContext("parameter all-gather"));
    std::memcpy(data, scratch_.data(), b.range.size() * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace difftrain::parallel
