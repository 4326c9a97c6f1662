#include "model/data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "model/tensor/rng.h"

namespace difftrain {

DataLoader::DataLoader(const Dataset& dataset, const DataLoaderOptions& options)
    : dataset_(dataset), options_(options), shuffled_(options.shuffle && !dataset.unbounded()) {
  DT_CHECK(dataset.size() > 0, "the loader needs a dataset with samples");
  DT_CHECK(options.batch_size > 0, "batch size {} must be positive", options.batch_size);
  DT_CHECK(options.dp_size > 0 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
           "dp rank {} of {}", options.dp_rank, options.dp_size);
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
  for (int64_t i = static_cast<int64_t>(p.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  // Two epochs cover the training thread and a prefetch that has crossed into the next one.
  if (permutations_.size() == 2) permutations_.erase(permutations_.begin());
  permutations_.emplace_back(epoch, std::move(permutation));
  return permutations_.back().second;
}

int64_t DataLoader::IndexOf(int64_t sample) const {
  DT_CHECK(sample >= 0, "sample {} is negative", sample);
  if (dataset_.unbounded()) return sample;
  const int64_t size = dataset_.size();
  if (!shuffled_) return sample % size;
  return (*Permutation(sample / size))[sample % size];
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
  const int64_t floats = dataset_.sample_floats();
  const int C = dataset_.channels(), H = dataset_.height(), W = dataset_.width();
  for (int b = 0; b < range.count; ++b) {
    const int64_t sample = range.first + b;
    const int64_t index = IndexOf(sample);
    float* image = images + b * floats;
    Status got = dataset_.Get(index, image, &labels[b]);
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
    if (!IsFlipped(sample)) continue;
    for (int row = 0; row < dataset_.frames() * C * H; ++row)
      std::reverse(image + int64_t{row} * W, image + int64_t{row + 1} * W);
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
  const int64_t floats = dataset_.sample_floats();
  Batch work;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || queued_.has_value(); });
    if (stop_) return;
    const Range range = *queued_;
    queued_.reset();
    running_ = range;
    lock.unlock();

    work.images.resize(static_cast<size_t>(range.count * floats));
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
