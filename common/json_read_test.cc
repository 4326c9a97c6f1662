// JsonInt, JsonInts, JsonIntOr and JsonStringOr (common/json_read.h): every integer of int's
// range, integral floats, and the refusals (tests/fuzz/config_fuzz found a config.json's 3e57
// read as an int: undefined behaviour in nlohmann's get<int>(); and a "_class_name" of 4 thrown
// out of the DiT config reader).
#include "common/json_read.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace difftrain {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

std::string Refusal(const json& value) {
  try {
    JsonInt(value, "sample_size");
  } catch (const json::exception& e) {
    return e.what();
  }
  return "";
}

TEST(JsonIntTest, TakesIntsAndIntegralFloatsInRange) {
  constexpr int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  EXPECT_EQ(JsonInt(json(64), "k"), 64);
  EXPECT_EQ(JsonInt(json(-3), "k"), -3);
  EXPECT_EQ(JsonInt(json(kMax), "k"), kMax);
  EXPECT_EQ(JsonInt(json(kMin), "k"), kMin);
  EXPECT_EQ(JsonInt(json(uint64_t{7}), "k"), 7);
  EXPECT_EQ(JsonInt(json(64.0), "k"), 64);
  EXPECT_EQ(JsonInt(json::parse("-2147483648.0"), "k"), kMin);
  EXPECT_EQ(JsonInts(json::parse("[320, 640.0, 1280]"), "k"), (std::vector<int>{320, 640, 1280}));
  EXPECT_TRUE(JsonInts(json::array(), "k").empty());
}

TEST(JsonIntTest, RefusesWhatIsNoIntNamingTheKey) {
  EXPECT_THAT(Refusal(json::parse("3.05227e+57")),
              HasSubstr("sample_size: 3.05227e+57 is not an integer in [-2147483648, 2147483647]"));
  EXPECT_THAT(Refusal(json(int64_t{1} << 31)), HasSubstr("2147483648 is not an integer"));
  EXPECT_THAT(Refusal(json(int64_t{-1} - (int64_t{1} << 31))), HasSubstr("is not an integer"));
  EXPECT_THAT(Refusal(json(uint64_t{1} << 63)), HasSubstr("is not an integer"));
  EXPECT_THAT(Refusal(json(64.5)), HasSubstr("sample_size: 64.5 is not an integer"));
  EXPECT_THAT(Refusal(json(std::numeric_limits<double>::infinity())),
              HasSubstr("is not an integer"));
  EXPECT_THAT(Refusal(json(std::nan(""))), HasSubstr("is not an integer"));
  EXPECT_THAT(Refusal(json("64")), HasSubstr("sample_size: type must be number, but is string"));
  EXPECT_THAT(Refusal(json(true)), HasSubstr("but is boolean"));
  EXPECT_THAT(Refusal(json(nullptr)), HasSubstr("but is null"));
  EXPECT_THROW(JsonInts(json(3), "k"), json::type_error);
  EXPECT_THROW(JsonInts(json::parse("[1, 2.5]"), "k"), json::out_of_range);
}

TEST(JsonIntTest, OrAFallbackWhereAbsent) {
  const json j = json::parse(R"({"solver_order": 3, "big": 1e99, "name": "x", "kind": 4})");
  EXPECT_EQ(JsonIntOr(j, "solver_order", 2), 3);
  EXPECT_EQ(JsonIntOr(j, "missing", 2), 2);
  EXPECT_THROW(JsonIntOr(j, "big", 2), json::out_of_range);
  EXPECT_THROW(JsonIntOr(j, "name", 2), json::type_error);
  EXPECT_EQ(JsonStringOr(j, "name", "none"), "x");
  EXPECT_EQ(JsonStringOr(j, "kind", "none"), "none");  // not a string: no kind
  EXPECT_EQ(JsonStringOr(j, "missing", "none"), "none");
  EXPECT_EQ(JsonStringOr(json::array(), "name", "none"), "none");
}

}  // namespace
}  // namespace difftrain
