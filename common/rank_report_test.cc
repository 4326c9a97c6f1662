#include "common/rank_report.h"

#include <gtest/gtest.h>

namespace difftrain {
namespace {

TEST(RankReportTest, StepLineRoundTrips) {
  RankReport r;
  r.step = 12;
  r.rank = 3;
  r.tp = 1;
  r.dp = 1;
  r.loss = 0.25;
  r.epoch = 1.5;
  r.step_seconds = 0.5;
  r.flops_per_second = 2e9;
  r.comm_seconds["dp"]["all_reduce"] = 0.125;
  r.device_memory_allocated_bytes = 1 << 20;
  r.last_checkpoint_step = 10;
  const RankReport back = RankReport::FromJson(nlohmann::json::parse(r.ToJson().dump()));
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.tp, 1);
  EXPECT_EQ(back.dp, 1);
  EXPECT_EQ(back.loss, 0.25);
  EXPECT_EQ(back.epoch, 1.5);
  EXPECT_EQ(back.step_seconds, 0.5);
  EXPECT_EQ(back.flops_per_second, 2e9);
  EXPECT_EQ(back.comm_seconds.at("dp").at("all_reduce"), 0.125);
  EXPECT_EQ(back.device_memory_allocated_bytes, 1 << 20);
  EXPECT_EQ(back.last_checkpoint_step, 10);
  EXPECT_TRUE(back.event.empty());
  // One size: no sample_size; a bucketed step's size round-trips.
  EXPECT_FALSE(r.ToJson().contains("sample_size"));
  r.sample_height = 6;
  r.sample_width = 10;
  EXPECT_EQ(r.ToJson()["sample_size"], nlohmann::json::array({6, 10}));
  const RankReport bucketed = RankReport::FromJson(nlohmann::json::parse(r.ToJson().dump()));
  EXPECT_EQ(bucketed.sample_height, 6);
  EXPECT_EQ(bucketed.sample_width, 10);
}

TEST(RankReportTest, StartedLineHasNoStepFields) {
  RankReport r;
  r.event = "started";
  r.step = 4;
  const nlohmann::json j = r.ToJson();
  EXPECT_EQ(j["event"], "started");
  EXPECT_EQ(j["step"], 4);
  EXPECT_FALSE(j.contains("loss"));
}

// A daemon reads lines of other versions: what it does not understand keeps its default.
TEST(RankReportTest, MissingAndMistypedFieldsKeepTheirDefaults) {
  const RankReport r = RankReport::FromJson(nlohmann::json::parse(
      R"({"step": "x", "loss": 1.5, "rank": 2.5, "comm_seconds": {"dp": 3, "tp": {"send": "y"}}})"));
  EXPECT_EQ(r.step, -1);
  EXPECT_EQ(r.loss, 1.5);
  EXPECT_EQ(r.rank, 0);
  EXPECT_TRUE(r.comm_seconds.empty());
  EXPECT_EQ(RankReport::FromJson(nlohmann::json::array()).step, -1);
}

TEST(RankReportTest, ResidentBytesOfThisProcess) {
  EXPECT_GT(ResidentBytes(), 1 << 20);
}

}  // namespace
}  // namespace difftrain
