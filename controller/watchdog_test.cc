#include <gtest/gtest.h>

#include "controller/controller.h"

namespace difftrain::controller {
namespace {

TEST(HangLimitTest, AGivenLimitIsUsedAsIs) {
  RestartPolicy policy;
  policy.hang_seconds = 2.5;
  EXPECT_EQ(HangLimitSeconds(policy, {100, 200}), 2.5);
}

TEST(HangLimitTest, AutomaticIsAMultipleOfTheMedianStepWithAFloor) {
  const RestartPolicy policy;  // hang_seconds 0: automatic
  EXPECT_EQ(HangLimitSeconds(policy, {}), RestartPolicy::kHangFloorSeconds);
  EXPECT_EQ(HangLimitSeconds(policy, {0, 0}), RestartPolicy::kHangFloorSeconds);  // no step yet
  EXPECT_EQ(HangLimitSeconds(policy, {0.5, 0.4, 0.6}), RestartPolicy::kHangFloorSeconds);
  // The median, not the slowest: one straggler does not stretch the limit.
  EXPECT_EQ(HangLimitSeconds(policy, {9, 10, 11, 500}), RestartPolicy::kHangFactor * 11);
  EXPECT_EQ(HangLimitSeconds(policy, {0, 8, 0, 8}), RestartPolicy::kHangFactor * 8);
}

}  // namespace
}  // namespace difftrain::controller
