#include "common/wire.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

namespace difftrain::wire {
namespace {

Message Heartbeat() {
  return {MessageType::kHeartbeat,
          {{"node", "n0"},
           {"attempt", 1},
           {"ranks",
            {{{"rank", 3},
              {"pid", 42},
              {"step", 7},
              {"loss", 0.5},
              {"step_seconds", 0.1},
              {"samples_per_second", 40.0},
              {"compute_seconds", 0.1},
              {"flops_per_second", 2e9}}}}},
          ""};
}

// The frame of `m` with its JSON header replaced by `header`.
std::string WithHeader(const Message& m, const std::string& header) {
  std::string frame = Encode(m).substr(0, kFixedHeaderBytes);
  for (int i = 0; i < 4; ++i)
    frame[4 + i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return frame + header;
}

TEST(WireTest, RoundTripKeepsTypeHeaderAndBinaryPayload) {
  const std::string payload("a\0b\xff", 4);
  const Message m{MessageType::kStoreSet, {{"id", 5}, {"key", "job/0/dp[0,1]/addr"}}, payload};
  Result<Message> back = Decode(Encode(m));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->type, MessageType::kStoreSet);
  EXPECT_EQ(back->header, m.header);
  EXPECT_EQ(back->payload, payload);
  EXPECT_TRUE(Decode(Encode(Heartbeat())).ok());
}

TEST(WireTest, RefusesWhatIsNotAMessageWithTheReason) {
  const std::string good = Encode(Heartbeat());
  std::string version = good, type = good, length = good;
  version[2] = kWireVersion - 1;  // the previous protocol
  type[3] = 99;
  length[7] = 0x7f;
  const std::pair<std::string, std::string_view> cases[] = {
      {"", "malformed"},
      {"DT", "malformed"},
      {"XX" + good.substr(2), "malformed"},
      {version, "version"},
      {type, "type"},
      {length, "malformed"},
      {WithHeader(Heartbeat(), "{not json"), "malformed"},
      {WithHeader(Heartbeat(), "[1,2]"), "fields"},
      {std::string(kMaxMessageBytes + 1, 'D'), "oversized"},
  };
  for (const auto& [frame, reason] : cases) {
    Result<Message> m = Decode(frame);
    ASSERT_FALSE(m.ok()) << reason;
    EXPECT_EQ(DropReason(m.status()), reason) << m.status().message();
  }
}

TEST(WireTest, ChecksEveryFieldTypeAndRange) {
  const Message hb = Heartbeat();
  auto refused = [&](nlohmann::json header, const std::string& mentions) {
    Result<Message> m = Decode(WithHeader(hb, header.dump()));
    ASSERT_FALSE(m.ok()) << header.dump();
    EXPECT_NE(m.status().message().find(mentions), std::string::npos) << m.status().message();
  };
  nlohmann::json h = hb.header;
  h.erase("node");
  refused(h, "node is missing");
  h = hb.header;
  h["node"] = 5;
  refused(h, "node must be a string");
  h["node"] = std::string(300, 'n');
  refused(h, "node has 300 bytes");
  h = hb.header;
  h["attempt"] = 1.5;
  refused(h, "attempt must be an integer");
  h["attempt"] = uint64_t{1} << 63;
  refused(h, "attempt out of range");
  h = hb.header;
  h["ranks"][0]["rank"] = -1;
  refused(h, "ranks[0].rank = -1 outside");
  h = hb.header;
  h["ranks"][0]["loss"] = "low";
  refused(h, "ranks[0].loss must be a number");
  h = hb.header;
  h["extra"] = true;
  refused(h, "unknown field 'extra'");
}

// The fuzzer's seeds (tests/fuzz/wire_fuzz) are valid frames of this protocol version, so that
// it starts from messages the decoder takes.
TEST(WireTest, TheFuzzersSeedsDecode) {
  int seeds = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(DIFFTRAIN_SOURCE_DIR "/tests/fuzz/wire_fuzz")) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string frame(std::istreambuf_iterator<char>(in), {});
    const Result<Message> m = Decode(frame);
    EXPECT_TRUE(m.ok()) << entry.path() << ": " << m.status().message();
    ++seeds;
  }
  EXPECT_GE(seeds, 6);
}

TEST(WireTest, EveryTypeHasAName) {
  for (int t = 0; t < 256; ++t) {
    const std::string frame = std::string("DT") + static_cast<char>(kWireVersion) +
                              static_cast<char>(t) + std::string(4, '\0');
    Result<Message> m = Decode(frame);
    if (DropReason(m.status()) != "type") {
      EXPECT_NE(TypeName(MessageType(t)), "unknown") << t;
    }
  }
}

}  // namespace
}  // namespace difftrain::wire
