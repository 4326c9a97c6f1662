// The data loader: which dataset sample is the n-th sample of training, and a background
// thread that reads the next batch while the current one trains (docs/data.md).
//
// Training consumes one global sequence of samples n = 0, 1, 2, ... . Sample n lies in
// epoch e = n / S at position i = n % S (S = dataset size) and is dataset index perm_e[i],
// where perm_e is the Fisher–Yates permutation of [0, S) drawn from
// Rng(seed, kData, e) (the identity when shuffling is off, or when the dataset is
// unbounded: then index = n). Sample n is flipped left-right, when flips are on, iff
// Rng(seed, kData, kFlipCounterBase + n).Uniform() < 0.5. So what a sample is depends only
// on (seed, n): a data-parallel rank fills just its slice of each global batch, and a
// resumed run continues at sample n with nothing else to restore.
//
// A global batch of this loader is batch_size · dp_size consecutive samples; rank r takes
// the batch_size samples that start at r · batch_size within it.
//
// Aspect-ratio buckets (a dataset whose samples come in several sizes, Dataset::bucketed()):
// every global batch is of one bucket. Epoch e's order is perm_e cut by bucket (each bucket's
// samples in perm_e's order) into whole global batches, a bucket's remainder of fewer than one
// global batch left out of the epoch, and those batches shuffled by
// Rng(seed, kData, kBucketCounterBase + e) (kept in bucket order when shuffling is off). An
// epoch is then epoch_samples() ≤ S samples long, and sample n lies in epoch n / epoch_samples().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "model/data/dataset.h"

namespace difftrain {

// Flip draws use counters from here on, far from the epoch counters of the permutations.
inline constexpr uint64_t kFlipCounterBase = uint64_t{1} << 62;
// The shuffles of a bucketed epoch's batches use counters from here on.
inline constexpr uint64_t kBucketCounterBase = uint64_t{1} << 61;

struct DataLoaderOptions {
  uint64_t seed = 0;
  int batch_size = 1;  // samples per rank in one global batch
  int dp_rank = 0;
  int dp_size = 1;
  bool shuffle = true;
  bool horizontal_flip = false;
  bool prefetch = true;  // run the background thread
};

class DataLoader {
 public:
  // `dataset` must outlive the loader and hold at least one sample.
  DataLoader(const Dataset& dataset, const DataLoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const Dataset& dataset() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  int64_t global_batch() const { return int64_t{options_.batch_size} * options_.dp_size; }
  // The first global sample of this rank's slice of the global batch starting at `batch_first`.
  int64_t RankFirstSample(int64_t batch_first) const {
    return batch_first + int64_t{options_.dp_rank} * options_.batch_size;
  }

  // The dataset index of global sample `sample`, and whether it is flipped.
  int64_t IndexOf(int64_t sample) const;
  bool IsFlipped(int64_t sample) const;
  // The size of global sample `sample` (its bucket's; the dataset's where it has one size).
  SampleSize SizeOf(int64_t sample) const;
  // Samples of an epoch: the dataset's size, or for a bucketed dataset the whole global batches
  // its buckets fill (0 where none fills one: the loader then has nothing to give, and its
  // user must refuse the dataset first).
  int64_t epoch_samples() const { return epoch_samples_; }

  // Writes global samples [first_sample, first_sample + count) to `images` ([count, C, H, W]; a
  // bucketed range's samples one after another, each of its size)
  // and `labels`, and, when `texts` is given and the dataset has texts, their text embeddings
  // to `texts` ([count, L, D]), taking the prefetched result when it is that range (waiting for it
  // if it is still being read) and reading synchronously otherwise. The result is the same either
  // way.
  // With `pooled` too, and a table with pooled embeddings, those to `pooled` ([count, P]).
  Status Fill(int64_t first_sample, int count, float* images, int32_t* labels,
              float* texts = nullptr, float* pooled = nullptr);
  // Starts reading the range in the background (a no-op without prefetch). Only the latest
  // request is kept: one made while another waits replaces it.
  void Prefetch(int64_t first_sample, int count);

  // This rank's batch_size samples of the global batch starting at `batch_first`; then
  // prefetches its slice of the global batch that follows.
  Status FillRankBatch(int64_t batch_first, float* images, int32_t* labels);

 private:
  struct Range {
    int64_t first = 0;
    int count = 0;
    bool operator==(const Range&) const = default;
  };
  struct Batch {
    std::vector<float> images;
    std::vector<int32_t> labels;
    std::vector<float> texts;   // [count, L, D] when the dataset has texts
    std::vector<float> pooled;  // [count, P] when its table has pooled embeddings
  };

  // Reads a range; safe to call from the training and the prefetch thread at once.
  Status Read(Range range, float* images, int32_t* labels, float* texts, float* pooled) const;
  // Epoch `epoch`'s dataset indices in order (perm_e, or its bucketed batches), computed once
  // and kept for the two most recent epochs asked for.
  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch) const;
  // Epoch `epoch`'s bucketed order from its permutation.
  std::vector<int64_t> BucketedOrder(const std::vector<int64_t>& permutation, int64_t epoch) const;
  // Floats of the samples [first, first + count).
  int64_t RangeFloats(Range range) const;
  void PrefetchLoop();

  const Dataset& dataset_;
  const DataLoaderOptions options_;
  const bool shuffled_;
  const std::vector<SampleSize> buckets_;  // the dataset's
  std::vector<int32_t> bucket_of_;         // each sample's bucket, where there are several
  int64_t epoch_samples_ = 0;

  mutable std::mutex permutation_mutex_;
  mutable std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>>
      permutations_;

  // Prefetch state, guarded by mutex_: a range asked for, the one being read, the one read.
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::optional<Range> queued_, running_, ready_range_;
  Batch ready_;
  Status ready_status_;
  std::thread thread_;
};

}  // namespace difftrain
