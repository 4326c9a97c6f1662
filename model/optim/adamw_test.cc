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
  config.ema_schedule = "diffusers_warmup";  // EMAModel's use_ema_warmup
  config.ema_inv_gamma = 1.0;
  config.ema_power = 0.75;
  EXPECT_EQ(EmaDecayAt(config, 1), 0.0);
  EXPECT_EQ(EmaDecayAt(config, 2), 1.0 - std::pow(2.0, -0.75));  // s = 1: about 0.405
  EXPECT_EQ(EmaDecayAt(config, 100000), 0.99);
  EXPECT_EQ(config.ToJson()["ema_power"], 0.75);
  config.ema_power = 0;
  EXPECT_EQ(config.Validate().message(), "optimizer.ema_power must be positive, got 0");
  config.ema_power = 0.75;
  config.ema_schedule = "karras";
  EXPECT_EQ(config.Validate().message(),
            "optimizer.ema_schedule: expected constant, diffusers or diffusers_warmup, found "
            "'karras'");
}

TEST(LearningRateTest, DiffusersLinearStartsAtZeroAndEndsOneStepAboveIt) {
  // get_scheduler("linear", num_warmup_steps=10, num_training_steps=110): LambdaLR's first
  // rate is lambda(0) = 0; the decay is (110 − step)/100 from step 10.
  OptimizerConfig config;
  config.lr = 1e-3;
  config.warmup_steps = 10;
  config.lr_schedule = "diffusers_linear";
  EXPECT_EQ(LearningRate(config, 0, 110), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(config, 5, 110), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(config, 10, 110), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(config, 60, 110), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(config, 109, 110), 1e-5);
  EXPECT_FALSE(config.ToJson().contains("lr_power"));
  // diffusers' constant ignores the warm-up, as get_scheduler does.
  config.lr_schedule = "diffusers_constant";
  EXPECT_EQ(LearningRate(config, 0, 110), 1e-3);
  config.lr_schedule = "diffusers_polynomial";
  config.lr_power = 2;
  EXPECT_EQ(config.ToJson()["lr_power"], 2.0);
  EXPECT_DOUBLE_EQ(LearningRate(config, 60, 110), (1e-3 - 1e-7) * 0.25 + 1e-7);
  config.lr = 1e-7;
  EXPECT_EQ(config.Validate().message(),
            "optimizer.lr must exceed diffusers_polynomial's final rate 1e-07, got 1e-07");
}

TEST(OptimizerConfigTest, UnknownScheduleNamesTheField) {
  OptimizerConfig config;
  config.lr_schedule = "linear";
  const Status s = config.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "optimizer.lr_schedule: expected constant, cosine or one of diffusers' schedules "
            "(diffusers_constant, diffusers_constant_with_warmup, diffusers_linear, "
            "diffusers_cosine, diffusers_cosine_with_restarts, diffusers_polynomial), found "
            "'linear'");
  config.lr_schedule = "diffusers_cosine_with_restarts";
  config.lr_num_cycles = 0;
  EXPECT_EQ(config.Validate().message(), "optimizer.lr_num_cycles must be >= 1, got 0");
}

}  // namespace
}  // namespace difftrain
