// Activation recomputation of the UNet (train.recompute): each layer keeps only its input and
// output values, and backward makes its activations again in a shared workspace. What is
// computed does not change (the gradients are the same bits); what is stored shrinks, and the
// family's memory model is the arena a Trainer allocates.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "model/data/dataset.h"
#include "model/train/trainer.h"
#include "model/unet/family.h"
#include "model/unet/unet.h"
#include "model/unet/unet_testing.h"

namespace difftrain {
namespace {

// The gradients of one forward and backward of B = 2 on fixed inputs, two micro-batches in
// flight (slot 1 then slot 0, so that a slot's backward follows another slot's forward).
std::vector<float> Gradients(const UNetConfig& c, bool recompute) {
  UNet model(c);
  model.InitializeRandom(5);
  const int B = 2, S = c.sample_size;
  model.Reserve(B, 2, recompute);
  std::vector<float> x(B * 4 * S * S), t = {7, 880}, context(B * c.text_length * 6),
                                       dout(B * 4 * S * S);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * i), dout[i] = std::cos(0.71f * i);
  for (size_t i = 0; i < context.size(); ++i)
    context[i] = std::cos(1.3f * i);
  ModelInputs in{x.data(), t.data(), nullptr, context.data()};
  // SDXL's micro-conditioning, where the config has it.
  std::vector<float> pooled(B * c.pooled_text_dim(), 0.5f), time_ids(B * UNetConfig::kTimeIds);
  for (size_t i = 0; i < time_ids.size(); ++i)
    time_ids[i] = 64.0f * static_cast<float>(i % 3);
  if (c.text_time()) {
    in.pooled_text = pooled.data();
    in.time_ids = time_ids.data();
  }
  std::vector<float> x2(x.rbegin(), x.rend());
  ModelInputs in2 = in;
  in2.x_t = x2.data();
  EXPECT_TRUE(model.Forward(0, in, nullptr, nullptr).ok());
  EXPECT_TRUE(model.Forward(1, in2, nullptr, nullptr).ok());
  EXPECT_TRUE(model.Backward(1, dout.data(), nullptr).ok());
  EXPECT_TRUE(model.Backward(0, dout.data(), nullptr).ok());
  return {model.grads(), model.grads() + model.num_params()};
}

TEST(UNetRecompute, GradientsAreTheSameBits) {
  for (int kind = 0; kind < 3; ++kind) {
    const UNetConfig c = kind < 2 ? testing::TinyUNetConfig(kind == 1) : testing::TinySdxlConfig();
    const std::vector<float> stored = Gradients(c, false);
    const std::vector<float> recomputed = Gradients(c, true);
    ASSERT_EQ(stored.size(), recomputed.size());
    EXPECT_EQ(std::memcmp(stored.data(), recomputed.data(), stored.size() * sizeof(float)), 0)
        << (kind == 0   ? "1x1-conv projections"
            : kind == 1 ? "linear projections"
                        : "SDXL's");
  }
}

struct Trained {
  std::vector<double> losses;
  std::vector<float> parameters;
  MemoryBytes memory;
};

// Three optimizer steps of two micro-batches each (accumulation).
Trained Train(bool recompute) {
  TrainConfig config;
  config.model = UNetSpec(testing::TinyUNetConfig());
  config.micro_batch = 2;
  config.global_batch = 4;
  config.recompute = recompute;
  const SampleSchema x = UNetFamily().Samples(config.model);
  Trainer trainer(config, std::make_unique<SyntheticDataset>(1, x.channels, x.height, 0));
  Trained r;
  for (int i = 0; i < 3; ++i) {
    Result<StepStats> s = trainer.Step();
    EXPECT_TRUE(s.ok()) << s.status().message();
    r.losses.push_back(s.ok() ? s->loss : 0);
  }
  Model& m = trainer.model();
  r.parameters.assign(m.params(), m.params() + m.num_params());
  r.memory = trainer.memory();
  return r;
}

TEST(UNetRecompute, TrainingEqualsTrainingWithoutAndTheArenaIsThePlannedOne) {
  const Trained stored = Train(false), recomputed = Train(true);
  EXPECT_EQ(stored.losses, recomputed.losses);
  ASSERT_EQ(stored.parameters.size(), recomputed.parameters.size());
  EXPECT_EQ(std::memcmp(stored.parameters.data(), recomputed.parameters.data(),
                        stored.parameters.size() * sizeof(float)),
            0);
  const ModelSpec spec = UNetSpec(testing::TinyUNetConfig());
  Result<MemoryBytes> planned = PlanMemory(spec, {}, 0, 2, 2, false, 1, size_t{1} << 20, true);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  EXPECT_EQ(planned->activations, recomputed.memory.activations);
  EXPECT_EQ(UNetFamily().ActivationBytes(spec, {}, 0, 2, 1, true), recomputed.memory.activations);
  EXPECT_LT(recomputed.memory.activations, stored.memory.activations);
}

// At 512 px, SD 1.5 keeps a small part of its activations per sample: the values between
// layers, and one workspace (the largest layer's activations, the first level's attention).
TEST(UNetRecompute, StableDiffusionKeepsFarLessPerSample) {
  const UNetConfig sd = *UNetConfigByName("SD1.5");
  const double stored = static_cast<double>(UNet::ActivationBytes(sd, 2, 1, false)) -
                        static_cast<double>(UNet::ActivationBytes(sd, 1, 1, false));
  const double recomputed = static_cast<double>(UNet::ActivationBytes(sd, 2, 1, true)) -
                            static_cast<double>(UNet::ActivationBytes(sd, 1, 1, true));
  EXPECT_LT(recomputed, stored / 3) << "per sample: " << stored / (1 << 20) << " MiB stored, "
                                    << recomputed / (1 << 20) << " MiB recomputed";
}

}  // namespace
}  // namespace difftrain
