#include "model/train/batch_ahead.h"

#include <atomic>
#include <future>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

using namespace std::chrono_literals;

struct Batch {
  int64_t first = -1;
  std::vector<int64_t> samples;  // first, first + 1, ...
  std::thread::id made_on;
};

Status Fill(int64_t first, Batch& batch) {
  batch.first = first;
  batch.samples.assign(64, 0);
  for (size_t i = 0; i < batch.samples.size(); ++i)
    batch.samples[i] = first + static_cast<int64_t>(i);
  batch.made_on = std::this_thread::get_id();
  return Status::Ok();
}

bool Holds(const Batch& batch, int64_t first) {
  if (batch.first != first || batch.samples.size() != 64) return false;
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    if (batch.samples[i] != first + static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(BatchAheadTest, WithNothingAheadTakeMakesTheBatchOnTheCallersThread) {
  int made = 0;
  BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
    ++made;
    return Fill(first, b);
  });
  Result<const Batch*> batch = ahead.Take(5);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(Holds(**batch, 5));
  EXPECT_EQ((*batch)->made_on, std::this_thread::get_id());
  EXPECT_EQ(made, 1);
  EXPECT_EQ(ahead.taken_ahead(), 0);
}

TEST(BatchAheadTest, MakesTheNextBatchOnAHelperWhileTheCallerGoesOn) {
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> made{0};
  BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
    ++made;
    if (first == 1) {
      started.set_value();
      released.wait();
    }
    return Fill(first, b);
  });
  ahead.MakeAhead(1);
  // The helper is making batch 1 while this thread has not asked for it.
  ASSERT_EQ(started.get_future().wait_for(10s), std::future_status::ready);
  release.set_value();
  Result<const Batch*> batch = ahead.Take(1);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(Holds(**batch, 1));
  EXPECT_NE((*batch)->made_on, std::this_thread::get_id());
  EXPECT_EQ(made.load(), 1);  // taken as made, not made again
  EXPECT_EQ(ahead.taken_ahead(), 1);
}

TEST(BatchAheadTest, TheTakenBatchStaysUnchangedWhileTheNextIsMade) {
  std::atomic<int64_t> finished{-1};
  BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
    Status s = Fill(first, b);
    finished = first;
    return s;
  });
  const Batch* previous = nullptr;
  for (int64_t first = 0; first < 40; first += 4) {
    Result<const Batch*> batch = ahead.Take(first);
    ASSERT_TRUE(batch.ok());
    ASSERT_TRUE(Holds(**batch, first)) << "batch " << first;
    EXPECT_NE(*batch, previous);  // the two buffers alternate
    previous = *batch;
    ahead.MakeAhead(first + 4);
    while (finished.load() != first + 4)
      std::this_thread::yield();
    EXPECT_TRUE(Holds(**batch, first)) << "batch " << first << " changed by the next one";
  }
}

TEST(BatchAheadTest, ABatchMadeAheadForAnotherSampleIsDroppedAndTheWantedOneMade) {
  std::vector<int64_t> made;
  std::mutex mutex;
  BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
    std::lock_guard<std::mutex> lock(mutex);
    made.push_back(first);
    return Fill(first, b);
  });
  ahead.MakeAhead(30);  // e.g. the step after a checkpoint that is then restored
  Result<const Batch*> batch = ahead.Take(10);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(Holds(**batch, 10));
  EXPECT_EQ((*batch)->made_on, std::this_thread::get_id());
  EXPECT_EQ(made, (std::vector<int64_t>{30, 10}));
  EXPECT_EQ(ahead.taken_ahead(), 0);
}

TEST(BatchAheadTest, AnErrorOfTheHelperComesBackFromTake) {
  BatchAhead<Batch> ahead([](int64_t first, Batch& b) {
    if (first == 13) return Status::Error("data: sample 13 is unreadable");
    return Fill(first, b);
  });
  ahead.MakeAhead(13);
  Result<const Batch*> failed = ahead.Take(13);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "data: sample 13 is unreadable");
  // The next batch is made as usual.
  ahead.MakeAhead(14);
  Result<const Batch*> batch = ahead.Take(14);
  ASSERT_TRUE(batch.ok());
  EXPECT_TRUE(Holds(**batch, 14));
}

TEST(BatchAheadTest, DestructionWaitsForTheBatchInTheMaking) {
  std::promise<void> started;
  std::atomic<bool> finished{false};
  {
    BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
      started.set_value();
      std::this_thread::sleep_for(50ms);
      Status s = Fill(first, b);
      finished = true;
      return s;
    });
    ahead.MakeAhead(3);
    ASSERT_EQ(started.get_future().wait_for(10s), std::future_status::ready);
  }
  EXPECT_TRUE(finished.load());
}

TEST(BatchAheadTest, DestructionWithNothingAheadEndsAtOnce) {
  BatchAhead<Batch> ahead(Fill);
  ASSERT_TRUE(ahead.Take(0).ok());
  ahead.MakeAhead(1);
  ASSERT_TRUE(ahead.Take(1).ok());
  // The helper now waits for a request; the destructor must wake it and join.
}

TEST(BatchAheadTest, TakeWaitSecondsCountsTheWaitAndResets) {
  std::atomic<bool> finished{false};
  BatchAhead<Batch> ahead([&](int64_t first, Batch& b) {
    std::this_thread::sleep_for(30ms);
    Status s = Fill(first, b);
    finished = true;
    return s;
  });
  ASSERT_TRUE(ahead.Take(0).ok());  // made now: the caller waits the whole making
  EXPECT_GE(ahead.TakeWaitSeconds(), 0.029);
  EXPECT_EQ(ahead.TakeWaitSeconds(), 0.0);
  finished = false;
  ahead.MakeAhead(1);
  while (!finished.load())  // the caller's "GPU step", longer than the making
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(ahead.Take(1).ok());
  EXPECT_LT(ahead.TakeWaitSeconds(), 0.029);
}

TEST(BatchAheadDeathTest, TwoBatchesAheadStopWithAMessage) {
  EXPECT_DEATH(
      {
        BatchAhead<Batch> ahead(Fill);
        ahead.MakeAhead(1);
        ahead.MakeAhead(2);
      },
      "MakeAhead\\(2\\) while batch 1 is still ahead");
}

}  // namespace
}  // namespace difftrain
