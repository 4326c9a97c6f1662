// Activation recomputation (train.recompute) changes what is stored, not what is computed:
// the gradients of a step are the same bits, the activation arena is smaller.
#include <cstring>

#include <gtest/gtest.h>

#include "model/dit/dit.h"
#include "model/train/trainer.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

TrainConfig Config(bool recompute) {
  // Two micro-batches a step: gradients accumulate over both.
  TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/48, /*depth=*/3);
  c.learn_sigma_loss = true;
  c.seed = 11;
  c.recompute = recompute;
  return c;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainConfig& c) {
  return std::make_unique<Trainer>(c, testing::SyntheticData(c));
}

// The gradients of the first step, then the parameters after three.
struct Trajectory {
  std::vector<float> gradients, parameters;
  double loss = 0;
  size_t activation_bytes = 0;
};

Trajectory Train(bool recompute) {
  auto trainer = MakeTrainer(Config(recompute));
  Trajectory t;
  Result<StepStats> first = trainer->Step();
  EXPECT_TRUE(first.ok()) << first.status().message();
  t.loss = first->loss;
  Model& m = trainer->model();
  t.gradients.assign(m.grads(), m.grads() + m.num_params());
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(trainer->Step().ok());
  t.parameters.assign(m.params(), m.params() + m.num_params());
  t.activation_bytes = trainer->memory().activations;
  return t;
}

TEST(RecomputeTest, GradientsAndParametersAreBitIdentical) {
  const Trajectory stored = Train(false), recomputed = Train(true);
  EXPECT_EQ(stored.loss, recomputed.loss);
  ASSERT_EQ(stored.gradients.size(), recomputed.gradients.size());
  EXPECT_EQ(std::memcmp(stored.gradients.data(), recomputed.gradients.data(),
                        stored.gradients.size() * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(stored.parameters.data(), recomputed.parameters.data(),
                        stored.parameters.size() * sizeof(float)),
            0);
}

TEST(RecomputeTest, ActivationArenaKeepsOnlyBlockInputs) {
  const TrainConfig c = Config(false);
  const DiTConfig model = DiTConfigOf(c.model);
  const DiTShard whole = DiTShard::Whole(model);
  const size_t stored = DiT::ActivationBytes(model, whole, c.micro_batch, 1, false);
  const size_t recomputed = DiT::ActivationBytes(model, whole, c.micro_batch, 1, true);
  EXPECT_LT(recomputed, stored);
  // Per slot, every block but the workspace keeps only its input; with more blocks the
  // saving grows.
  DiTConfig deep = model;
  deep.depth = 12;
  const DiTShard deep_whole = DiTShard::Whole(deep);
  EXPECT_LT(2 * DiT::ActivationBytes(deep, deep_whole, c.micro_batch, 1, true),
            DiT::ActivationBytes(deep, deep_whole, c.micro_batch, 1, false));
  EXPECT_EQ(MakeTrainer(Config(true))->memory().activations, recomputed);
}

}  // namespace
}  // namespace difftrain
