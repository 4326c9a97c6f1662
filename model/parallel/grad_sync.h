// Data-parallel gradient synchronisation over contiguous buckets of the gradient arena.
//
// The arena [0, n) is cut into buckets of `bucket_elements` from its end, because backward
// finishes the end of the arena (the final layer) first. As backward reports that the
// gradients of [from, n) are final, every bucket inside that range starts its reduction
// at once, so communication overlaps the rest of backward (with overlap off, all buckets
// start when backward is done: the baseline the benchmark compares against).
//
// Without ZeRO-1 each bucket is all-reduced (averaged) and every rank updates every
// parameter. With ZeRO-1 each bucket is reduce-scattered: rank r owns the r-th of dp
// equal pieces of every bucket, updates the parameters and optimizer moments of its
// pieces only, and the updated parameters are all-gathered bucket by bucket. A bucket
// whose length does not divide by dp is padded with zeros in a scratch buffer.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"

namespace difftrain::parallel {

struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

class GradientSync {
 public:
  GradientSync(Comm& comm, size_t n, size_t bucket_elements, bool zero1, bool overlap);

  // Starts a step's synchronisation of `grads`: call before the last micro-batch's backward.
  void Begin(float* grads);
  // Backward reports that grads [from, n) are final.
  void OnGradientsReady(size_t from);
  // Starts what is left and waits for every bucket: afterwards the owned ranges of grads
  // hold the average over the data-parallel group. Returns the seconds spent waiting.
  Result<double> Finish();
  // ZeRO-1: all-gathers the owned ranges of `params` to every rank.
  Status GatherParameters(float* params);

  // The ranges of the arena whose parameters this rank updates: everything without
  // ZeRO-1, this rank's piece of every bucket with it. In increasing order.
  const std::vector<Range>& owned() const { return owned_; }
  // The same for rank `rank` of a group of `size`, without a communicator (memory plans).
  static std::vector<Range> OwnedRanges(size_t n, size_t bucket_elements, bool zero1, int size,
                                        int rank);
  size_t owned_elements() const { return owned_elements_; }
  bool zero1() const { return zero1_; }
  Comm& comm() { return comm_; }

 private:
  struct Bucket {
    Range range;
    size_t piece = 0;  // ZeRO-1: elements per rank (the bucket padded to dp pieces)
    bool started = false;
    std::unique_ptr<CommWork> work;
  };
  // The buckets' ranges, from the end of the arena to its start.
  static std::vector<Range> BucketRanges(size_t n, size_t bucket_elements, size_t size);
  void Start(Bucket& bucket);
  bool Padded(const Bucket& b) const { return b.piece * comm_.size() != b.range.size(); }

  Comm& comm_;
  size_t n_;
  bool zero1_, overlap_;
  std::vector<Bucket> buckets_;  // from the end of the arena to its start
  std::vector<Range> owned_;
  size_t owned_elements_ = 0;
  float* grads_ = nullptr;
  std::vector<float> scratch_;  // the padded bucket
};

}  // namespace difftrain::parallel
