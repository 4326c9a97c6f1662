#include "model/data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "model/tensor/rng.h"

namespace difftrain {

DataLoader::DataLoader(const Dataset& dataset, const DataLoaderOptions& options)
    : dataset_(dataset),
      options_(options),
      shuffled_(options.shuffle && !dataset.unbounded()),
      buckets_(dataset.buckets()),
      epoch_samples_(dataset.size()) {
  DT_CHECK(dataset.size() > 0, "the loader needs a dataset with samples");
  DT_CHECK(options.batch_size > 0, "batch size {} must be positive", options.batch_size);
  DT_CHECK(options.dp_size > 0 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
           "dp rank {} of {}", options.dp_rank, options.dp_size);
  if (buckets_.size() > 1 && !dataset.unbounded()) {
    bucket_of_.resize(dataset.size());
    std::vector<int64_t> counts(buckets_.size());
    for (int64_t i = 0; i < dataset.size(); ++i) {
      bucket_of_[i] = dataset.BucketOf(i);
      DT_CHECK(bucket_of_[i] >= 0 && bucket_of_[i] < static_cast<int>(buckets_.size()),
               "sample {} is in bucket {} of {}", i, bucket_of_[i], buckets_.size());
      ++counts[bucket_of_[i]];
    }
    epoch_samples_ = 0;
    for (int64_t n : counts)
      epoch_samples_ += n / global_batch() * global_batch();
  }
  if (options.prefetch) thread_ = std::thread([this] { PrefetchLoop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::Permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(permutation_mutex_);
  for (const auto& [e, permutation] : permutations_) {
    if (e == epoch) return permutation;
  }
  auto permutation = std::make_shared<std::vector<int64_t>>(dataset_.size());
  std::vector<int64_t>& p = *permutation;
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(options_.seed, RngStream::kData, static_cast<uint64_t>(epoch));
  for (int64_t i = static_cast<int64_t>(p.size()) - 1; i > 0 && shuffled_; --i) {
    const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  if (!bucket_of_.empty()) p = BucketedOrder(p, epoch);
  // Two epochs cover the training thread and a prefetch that has crossed into the next one.
  if (permutations_.size() == 2) permutations_.erase(permutations_.begin());
  permutations_.emplace_back(epoch, std::move(permutation));
  return permutations_.back().second;
}

std::vector<int64_t> DataLoader::BucketedOrder(const std::vector<int64_t>& permutation,
                                               int64_t epoch) const {
  const int64_t G = global_batch();
  std::vector<std::vector<int64_t>> by_bucket(buckets_.size());
  for (int64_t index : permutation)
    by_bucket[bucket_of_[index]].push_back(index);
  std::vector<std::pair<int, int64_t>> batches;  // (bucket, first position in it)
  for (size_t b = 0; b < by_bucket.size(); ++b) {
    for (int64_t first = 0; first + G <= static_cast<int64_t>(by_bucket[b].size()); first += G)
      batches.emplace_back(static_cast<int>(b), first);
  }
  if (shuffled_) {
    Rng rng(options_.seed, RngStream::kData, kBucketCounterBase + static_cast<uint64_t>(epoch));
    for (int64_t i = static_cast<int64_t>(batches.size()) - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
      std::swap(batches[i], batches[j]);
    }
  }
  std::vector<int64_t> order;
  order.reserve(batches.size() * G);
  for (const auto& [b, first] : batches)
    order.insert(order.end(), by_bucket[b].begin() + first, by_bucket[b].begin() + first + G);
  return order;
}

int64_t DataLoader::IndexOf(int64_t sample) const {
  DT_CHECK(sample >= 0, "sample {} is negative", sample);
  if (dataset_.unbounded()) return sample;
  DT_CHECK(epoch_samples_ > 0, "no bucket of the dataset fills a global batch of {}",
           global_batch());
  if (!shuffled_ && bucket_of_.empty()) return sample % epoch_samples_;
  return (*Permutation(sample / epoch_samples_))[sample % epoch_samples_];
}

SampleSize DataLoader::SizeOf(int64_t sample) const {
  return bucket_of_.empty() ? buckets_[0] : buckets_[bucket_of_[IndexOf(sample)]];
}

int64_t DataLoader::RangeFloats(Range range) const {
  int64_t floats = 0;
  for (int b = 0; b < range.count; ++b) {
    const SampleSize s = SizeOf(range.first + b);
    floats += int64_t{dataset_.frames()} * dataset_.channels() * s.area();
  }
  return floats;
}

bool DataLoader::IsFlipped(int64_t sample) const {
  if (!options_.horizontal_flip) return false;
  Rng rng(options_.seed, RngStream::kData, kFlipCounterBase + static_cast<uint64_t>(sample));
  return rng.Uniform() < 0.5;
}

Status DataLoader::Read(Range range, float* images, int32_t* labels, float* texts,
                        float* pooled) const {
  const TextTable* table = texts != nullptr ? dataset_.texts() : nullptr;
  if (table == nullptr || table->pooled_dim == 0) pooled = nullptr;
  const int C = dataset_.channels();
  int64_t offset = 0;  // of the sample in `images`: a bucketed range's samples differ in size
  for (int b = 0; b < range.count; ++b) {
    const int64_t sample = range.first + b;
    const int64_t index = IndexOf(sample);
    const SampleSize size = SizeOf(sample);
    const int H = size.height, W = size.width;
    float* image = images + offset;
    offset += int64_t{dataset_.frames()} * C * H * W;
    // A flipped sample is its mirror image: the dataset's own where it has one (a VAE's latents
    // of the flipped picture), else the sample flipped.
    const bool flipped = IsFlipped(sample);
    const bool own_mirror = flipped && dataset_.has_mirrored();
    Status got = own_mirror ? dataset_.GetMirrored(index, image, &labels[b])
                            : dataset_.Get(index, image, &labels[b]);
    if (!got.ok()) {
      return got.WithContext(fmt::format("reading sample {} (dataset index {})", sample, index));
    }
    if (table != nullptr) {
      const int64_t text = dataset_.TextId(index);
      std::copy_n(table->embedding(text), table->text_floats(), texts + b * table->text_floats());
      if (pooled != nullptr) {
        std::copy_n(table->pooled_embedding(text), table->pooled_dim,
                    pooled + int64_t{b} * table->pooled_dim);
      }
    }
    if (flipped && !own_mirror) MirrorRows(image, int64_t{dataset_.frames()} * C * H, W);
  }
  return Status::Ok();
}

Status DataLoader::Fill(int64_t first_sample, int count, float* images, int32_t* labels,
                        float* texts, float* pooled) {
  DT_CHECK(first_sample >= 0 && count >= 0, "range of {} samples from {}", count, first_sample);
  const Range range{first_sample, count};
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Reading the range again while the prefetch thread reads it would only duplicate work.
    changed_.wait(lock, [&] { return running_ != range; });
    if (ready_range_ == range) {
      std::copy(ready_.images.begin(), ready_.images.end(), images);
      std::copy(ready_.labels.begin(), ready_.labels.end(), labels);
      if (texts != nullptr) std::copy(ready_.texts.begin(), ready_.texts.end(), texts);
      if (texts != nullptr && pooled != nullptr)
        std::copy(ready_.pooled.begin(), ready_.pooled.end(), pooled);
      ready_range_.reset();
      return ready_status_;
    }
    if (queued_ == range) queued_.reset();
  }
  return Read(range, images, labels, texts, pooled);
}

void DataLoader::Prefetch(int64_t first_sample, int count) {
  DT_CHECK(first_sample >= 0 && count >= 0, "range of {} samples from {}", count, first_sample);
  if (!options_.prefetch) return;
  const Range range{first_sample, count};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ready_range_ == range || running_ == range) return;
    queued_ = range;
  }
  changed_.notify_all();
}

Status DataLoader::FillRankBatch(int64_t batch_first, float* images, int32_t* labels) {
  Status filled = Fill(RankFirstSample(batch_first), options_.batch_size, images, labels);
  Prefetch(RankFirstSample(batch_first + global_batch()), options_.batch_size);
  return filled;
}

void DataLoader::PrefetchLoop() {
  Batch work;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || queued_.has_value(); });
    if (stop_) return;
    const Range range = *queued_;
    queued_.reset();
    running_ = range;
    lock.unlock();

    work.images.resize(static_cast<size_t>(RangeFloats(range)));
    work.labels.resize(static_cast<size_t>(range.count));
    const TextTable* table = dataset_.texts();
    work.texts.resize(table != nullptr ? range.count * table->text_floats() : 0);
    work.pooled.resize(table != nullptr ? size_t(range.count) * table->pooled_dim : 0);
    Status status = Read(range, work.images.data(), work.labels.data(),
                         table != nullptr ? work.texts.data() : nullptr,
                         work.pooled.empty() ? nullptr : work.pooled.data());

    lock.lock();
    running_.reset();
    ready_range_ = range;
    std::swap(ready_, work);
    ready_status_ = std::move(status);
    changed_.notify_all();
  }
}

}  // namespace difftrain
