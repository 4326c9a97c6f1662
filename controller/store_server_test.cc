#include "controller/store_server.h"

#include <gtest/gtest.h>

namespace difftrain::controller {
namespace {

using wire::Message;
using wire::MessageType;
using Clock = StoreServer::Clock;
using namespace std::chrono_literals;

Message Set(int64_t id, const std::string& key, const std::string& value) {
  return {MessageType::kStoreSet, {{"id", id}, {"key", key}}, value};
}
Message Get(int64_t id, const std::string& key, int64_t timeout_ms) {
  return {MessageType::kStoreGet, {{"id", id}, {"key", key}, {"timeout_ms", timeout_ms}}, ""};
}
Message Add(int64_t id, const std::string& key, int64_t delta) {
  return {MessageType::kStoreAdd, {{"id", id}, {"key", key}, {"delta", delta}}, ""};
}

class StoreServerTest : public ::testing::Test {
 protected:
  // Handles `m` from `peer` and returns the replies it caused.
  std::vector<Outgoing> Handle(const std::string& peer, const Message& m) {
    std::vector<Outgoing> out;
    store_.Handle(peer, m, now_, out);
    return out;
  }

  StoreServer store_;
  Clock::time_point now_ = Clock::now();
};

TEST_F(StoreServerTest, GetOfAMissingKeyWaitsUntilItIsSet) {
  EXPECT_TRUE(Handle("a", Get(1, "k", 5000)).empty());
  EXPECT_TRUE(Handle("b", Get(2, "k", 5000)).empty());
  EXPECT_EQ(store_.waiting(), 2u);
  const std::vector<Outgoing> out = Handle("c", Set(3, "k", std::string("v\0w", 3)));
  ASSERT_EQ(out.size(), 3u);  // both waiters, then the setter
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].peer, i == 0 ? "a" : "b");
    EXPECT_EQ(out[i].message.header["id"], i + 1);
    EXPECT_EQ(out[i].message.header["ok"], true);
    EXPECT_EQ(out[i].message.payload, std::string("v\0w", 3));
  }
  EXPECT_EQ(out[2].peer, "c");
  EXPECT_EQ(store_.waiting(), 0u);
  // Present now: answered at once.
  ASSERT_EQ(Handle("a", Get(4, "k", 0)).size(), 1u);
}

TEST_F(StoreServerTest, AGetTimesOutAtItsDeadlineAndNotBefore) {
  EXPECT_TRUE(Handle("a", Get(1, "k", 100)).empty());
  std::vector<Outgoing> out;
  store_.Expire(now_ + 99ms, out);
  EXPECT_TRUE(out.empty());
  store_.Expire(now_ + 100ms, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.header["ok"], false);
  EXPECT_EQ(out[0].message.header["error"], "timed out");
  // A zero timeout checks once.
  const std::vector<Outgoing> once = Handle("a", Get(2, "missing", 0));
  ASSERT_EQ(once.size(), 1u);
  EXPECT_EQ(once[0].message.header["error"], "no such key");
}

TEST_F(StoreServerTest, AddCountsFromZeroAndRefusesAValueThatIsNoCounter) {
  EXPECT_EQ(Handle("a", Add(1, "n", 5))[0].message.header["number"], 5);
  EXPECT_EQ(Handle("a", Add(2, "n", -2))[0].message.header["number"], 3);
  // Counters are decimal text, so a get reads them.
  EXPECT_EQ(Handle("a", Get(3, "n", 0))[0].message.payload, "3");
  Handle("a", Set(4, "s", "abc"));
  const std::vector<Outgoing> out = Handle("a", Add(5, "s", 1));
  EXPECT_EQ(out[0].message.header["ok"], false);
  EXPECT_EQ(out[0].message.header["error"], "the key holds no counter");
}

// The attempt fence's key is the controller's: ranks read it, and cannot overwrite it.
TEST_F(StoreServerTest, RanksReadTheControllersKeysButCannotWriteThem) {
  std::vector<Outgoing> published;
  store_.Publish("controller/attempt", "c0ffee:2", published);
  EXPECT_TRUE(published.empty());
  for (const Message& m :
       {Set(1, "controller/attempt", "c0ffee:9"), Add(2, "controller/attempt", 1)}) {
    const std::vector<Outgoing> out = Handle("rank", m);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].message.header["ok"], false);
    EXPECT_NE(out[0].message.header["error"].get<std::string>().find("the controller's key"),
              std::string::npos);
  }
  const std::vector<Outgoing> got = Handle("rank", Get(3, "controller/attempt", 0));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.payload, "c0ffee:2");
}

TEST(StoreServerLimitTest, RefusesToGrowPastItsLimit) {
  StoreServer store(100);
  auto ok = [&](const Message& m) {
    std::vector<Outgoing> out;
    store.Handle("a", m, Clock::now(), out);
    return out.back().message.header["ok"].get<bool>();
  };
  const std::string half(49, 'x');  // with its 1-byte key: 50 bytes
  EXPECT_TRUE(ok(Set(1, "a", half)));
  // Replacing a value frees the old one first.
  EXPECT_TRUE(ok(Set(2, "a", half)));
  EXPECT_TRUE(ok(Set(3, "b", half)));
  EXPECT_FALSE(ok(Set(4, "c", "")));
}

}  // namespace
}  // namespace difftrain::controller
