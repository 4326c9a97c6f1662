#include "model/parallel/store.h"

#include <chrono>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/rank_processes.h"

namespace difftrain::parallel {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<char> Bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string Text(const std::vector<char>& v) {
  return {v.begin(), v.end()};
}

class FileStoreTest : public ::testing::Test {
 protected:
  FileStore OpenStore() {
    Result<FileStore> store = FileStore::Open(dir_.path() + "/store");
    DT_CHECK(store.ok(), "{}", store.status().message());
    return std::move(store).value();
  }

  TempDir dir_;
};

TEST_F(FileStoreTest, SetThenGetReturnsTheLatestValue) {
  FileStore store = OpenStore();
  ASSERT_TRUE(store.Set("job/0/key", Bytes("first")).ok());
  ASSERT_TRUE(store.Set("job/0/key", Bytes("second")).ok());
  Result<std::vector<char>> value = store.Get("job/0/key", milliseconds(0));
  ASSERT_TRUE(value.ok()) << value.status().message();
  EXPECT_EQ(Text(*value), "second");
}

TEST_F(FileStoreTest, ValuesAreBytesNotText) {
  FileStore store = OpenStore();
  const std::vector<char> binary = {'\0', '\xff', '\n', '\0'};
  ASSERT_TRUE(store.Set("bin", binary).ok());
  Result<std::vector<char>> value = store.Get("bin", milliseconds(0));
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, binary);
  ASSERT_TRUE(store.Set("empty", {}).ok());
  Result<std::vector<char>> empty = store.Get("empty", milliseconds(0));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_F(FileStoreTest, KeysWithAnyCharactersStayDistinct) {
  FileStore store = OpenStore();
  const std::string long_a = std::string(300, 'a') + "/1";
  const std::string long_b = std::string(300, 'a') + "/2";
  const std::vector<std::string> keys = {"a/b", "a%2Fb", "a b", ".hidden", "~x", long_a, long_b};
  for (const std::string& key : keys)
    ASSERT_TRUE(store.Set(key, Bytes(key)).ok()) << key;
  for (const std::string& key : keys) {
    Result<std::vector<char>> value = store.Get(key, milliseconds(0));
    ASSERT_TRUE(value.ok()) << key;
    EXPECT_EQ(Text(*value), key);
  }
}

TEST_F(FileStoreTest, GetTimeoutNamesTheKeyAndTheTimeout) {
  FileStore store = OpenStore();
  const auto start = std::chrono::steady_clock::now();
  Result<std::vector<char>> value = store.Get("job/0/dp[0,1]/never", milliseconds(50));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(50));
  ASSERT_FALSE(value.ok());
  EXPECT_THAT(value.status().message(), HasSubstr("'job/0/dp[0,1]/never'"));
  EXPECT_THAT(value.status().message(), HasSubstr("50 ms"));
}

TEST_F(FileStoreTest, WaitNamesTheMissingKeys) {
  FileStore store = OpenStore();
  ASSERT_TRUE(store.Set("here", {}).ok());
  EXPECT_TRUE(store.Wait({"here"}, milliseconds(0)).ok());
  Status status = store.Wait({"here", "gone", "also-gone"}, milliseconds(30));
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("'gone', 'also-gone'"));
  EXPECT_THAT(status.message(), Not(HasSubstr("'here'")));
}

TEST_F(FileStoreTest, GetAndWaitBlockUntilAnotherProcessSets) {
  FileStore store = OpenStore();
  RankProcesses writer(dir_.path(), 1, [&](int) {
    std::this_thread::sleep_for(milliseconds(100));
    DT_RETURN_IF_ERROR(store.Set("late", Bytes("value")));
    return store.Set("later", {});
  });
  Result<std::vector<char>> value = store.Get("late", milliseconds(5000));
  ASSERT_TRUE(value.ok()) << value.status().message();
  EXPECT_EQ(Text(*value), "value");
  EXPECT_TRUE(store.Wait({"late", "later"}, milliseconds(5000)).ok());
  EXPECT_TRUE(writer.WaitAll(milliseconds(5000)).ok());
}

TEST_F(FileStoreTest, AddIsAtomicAcrossProcesses) {
  FileStore store = OpenStore();
  constexpr int kProcesses = 4;
  constexpr int kAdds = 100;
  RankProcesses adders(dir_.path(), kProcesses, [&](int) {
    for (int i = 0; i < kAdds; ++i) {
      Result<int64_t> value = store.Add("counter", 1);
      if (!value.ok()) return value.status();
    }
    return Status::Ok();
  });
  Status status = adders.WaitAll(milliseconds(20000));
  ASSERT_TRUE(status.ok()) << status.message();
  Result<int64_t> total = store.Add("counter", 0);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, kProcesses * kAdds);
  // Counters are decimal text, so Get reads them.
  Result<std::vector<char>> text = store.Get("counter", milliseconds(0));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(Text(*text), std::to_string(kProcesses * kAdds));
}

TEST_F(FileStoreTest, AddToAValueThatIsNotACounterFails) {
  FileStore store = OpenStore();
  ASSERT_TRUE(store.Set("name", Bytes("dp")).ok());
  Result<int64_t> value = store.Add("name", 1);
  ASSERT_FALSE(value.ok());
  EXPECT_THAT(value.status().message(), HasSubstr("'name' does not hold a counter"));
  Result<int64_t> negative = store.Add("fresh", -3);
  ASSERT_TRUE(negative.ok());
  EXPECT_EQ(*negative, -3);
}

TEST_F(FileStoreTest, PrefixStorePutsKeysUnderItsPrefix) {
  FileStore store = OpenStore();
  PrefixStore group(store, "job/1/dp[0,2]");
  ASSERT_TRUE(group.Set("key", Bytes("v")).ok());
  ASSERT_TRUE(group.Add("count", 2).ok());
  EXPECT_TRUE(store.Wait({"job/1/dp[0,2]/key", "job/1/dp[0,2]/count"}, milliseconds(0)).ok());
  EXPECT_TRUE(group.Wait({"key", "count"}, milliseconds(0)).ok());
  Result<std::vector<char>> missing = group.Get("other", milliseconds(0));
  ASSERT_FALSE(missing.ok());
  // The error names the full key, so a reader can find it in the store.
  EXPECT_THAT(missing.status().message(), HasSubstr("'job/1/dp[0,2]/other'"));
}

}  // namespace
}  // namespace difftrain::parallel
