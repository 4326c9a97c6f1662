#include "model/optim/adamw.h"

#include <cmath>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

TEST(LearningRateTest, ConstantScheduleWarmsUpThenHolds) {
  OptimizerConfig config;
  config.lr = 1e-3;
  config.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(config, 0, 100), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(config, 4, 100), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(config, 9, 100), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(config, 99, 100), 1e-3);
  config.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRate(config, 0, 100), 1e-3);
}

TEST(LearningRateTest, CosineScheduleDecaysToZeroOverTheRun) {
  OptimizerConfig config;
  config.lr = 2e-3;
  config.warmup_steps = 100;
  config.lr_schedule = "cosine";
  // The warm-up and the decay multiply: half-way through the warm-up, cos(π·50/1000) ≈ 0.988.
  EXPECT_NEAR(LearningRate(config, 49, 1000), 1e-3 * 0.5 * (1 + std::cos(M_PI * 0.049)), 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(config, 500, 1000), 1e-3);
  EXPECT_LT(LearningRate(config, 999, 1000), 1e-8);
  EXPECT_GT(LearningRate(config, 999, 1000), 0);
}

TEST(EmaScheduleTest, ConstantOrDiffusersRamp) {
  OptimizerConfig config;
  config.ema_decay = 0.99;
  EXPECT_EQ(EmaDecayAt(config, 1), 0.99);
  EXPECT_EQ(EmaDecayAt(config, 500), 0.99);
  config.ema_schedule = "diffusers";
  EXPECT_EQ(EmaDecayAt(config, 1), 0.0);           // the average starts at the first step's weights
  EXPECT_EQ(EmaDecayAt(config, 2), 2.0 / 11.0);    // s = 1
  EXPECT_EQ(EmaDecayAt(config, 11), 11.0 / 20.0);  // s = 10
  EXPECT_EQ(EmaDecayAt(config, 2000), 0.99);       // capped
  EXPECT_FALSE(config.ToJson().is_null());
  EXPECT_EQ(config.ToJson()["ema_schedule"], "diffusers");
  EXPECT_FALSE(OptimizerConfig{}.ToJson().contains("ema_schedule"));
  config.ema_schedule = "karras";
  EXPECT_EQ(config.Validate().message(),
            "optimizer.ema_schedule: expected constant or diffusers, found 'karras'");
}

TEST(OptimizerConfigTest, UnknownScheduleNamesTheField) {
  OptimizerConfig config;
  config.lr_schedule = "linear";
  const Status s = config.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "optimizer.lr_schedule: expected constant or cosine, found 'linear'");
}

}  // namespace
}  // namespace difftrain
