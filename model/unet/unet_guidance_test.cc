// A guidance-distilled UNet (diffusers' time_cond_proj_dim, as LCM's): time_embedding.cond_proj
// in the parameter table and the config, the guidance embedding added to the timestep features
// (and nothing without one, as in training), its weight's gradient against finite differences,
// and the pipeline's guidance-scale embedding.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "model/cpu/embed.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"
#include "model/unet/unet.h"
#include "model/unet/unet_testing.h"

namespace difftrain {
namespace {

constexpr int kDim = 6;  // the guidance embedding's width
constexpr int kB = 2;

UNetConfig GuidedConfig() {
  UNetConfig c = testing::TinyUNetConfig();
  c.time_cond_proj_dim = kDim;
  return c;
}

// Inputs of a batch of 2, and a guidance embedding per sample.
struct Batch {
  std::vector<float> x = std::vector<float>(kB * 4 * 64), t = {10, 500},
                     context = std::vector<float>(kB * 3 * 6),
                     guidance = std::vector<float>(kB * kDim);
  Batch() {
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.3f * i);
    for (size_t i = 0; i < context.size(); ++i)
      context[i] = std::cos(1.3f * i);
    for (size_t i = 0; i < guidance.size(); ++i)
      guidance[i] = std::sin(2.1f * i + 0.4f);
  }
  ModelInputs Inputs(bool guided) const {
    return {x.data(), t.data(), nullptr, context.data(), guided ? guidance.data() : nullptr};
  }
};

std::vector<float> Output(UNet& model, const ModelInputs& in) {
  model.Reserve(kB, 1);
  EXPECT_TRUE(model.Forward(0, in, nullptr, nullptr).ok());
  return {model.output(0), model.output(0) + kB * 4 * 64};
}

TEST(UNetGuidance, CondProjIsAParameterAndAConfigKey) {
  const UNetPlan plan(GuidedConfig());
  const TensorSpec* w = plan.table.Find("time_embedding.cond_proj.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, kDim}));  // [block_out_channels[0], dim]
  EXPECT_EQ(plan.table.Find("time_embedding.cond_proj.bias"), nullptr);
  EXPECT_EQ(ParameterCount(GuidedConfig()), ParameterCount(testing::TinyUNetConfig()) + 4 * kDim);
  EXPECT_EQ(UNetPlan(testing::TinyUNetConfig()).table.Find("time_embedding.cond_proj.weight"),
            nullptr);

  nlohmann::json j = GuidedConfig().ToJson();
  EXPECT_EQ(j["time_cond_proj_dim"], kDim);
  Result<UNetConfig> back = UNetConfig::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->time_cond_proj_dim, kDim);
  EXPECT_FALSE(testing::TinyUNetConfig().ToJson().contains("time_cond_proj_dim"));
  j["time_cond_proj_dim"] = nullptr;
  EXPECT_EQ(UNetConfig::FromJson(j)->time_cond_proj_dim, 0);
  UNetConfig small = GuidedConfig();
  small.time_cond_proj_dim = 2;
  const Status refused = small.Validate();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("model.time_cond_proj_dim"), std::string::npos);
}

// Without a guidance embedding the model is the same model without cond_proj, bit for bit; with
// one its output moves.
TEST(UNetGuidance, TheEmbeddingJoinsTheTimestepFeatures) {
  UNet guided(GuidedConfig());
  guided.InitializeRandom(5);
  UNet plain(testing::TinyUNetConfig());
  for (const TensorSpec& t : plain.global_parameter_table().tensors()) {
    const TensorSpec* g = guided.global_parameter_table().Find(t.name);
    ASSERT_NE(g, nullptr) << t.name;
    std::copy_n(guided.params() + g->offset, t.numel, plain.params() + t.offset);
  }
  const Batch batch;
  const std::vector<float> unguided = Output(guided, batch.Inputs(false));
  EXPECT_EQ(unguided, Output(plain, batch.Inputs(false)));
  const std::vector<float> with = Output(guided, batch.Inputs(true));
  double moved = 0;
  for (size_t i = 0; i < with.size(); ++i)
    moved = std::max(moved, double(std::abs(with[i] - unguided[i])));
  EXPECT_GT(moved, 1e-3);
}

// dL/dW of cond_proj for L = Σ r · output, against central differences; without guidance the
// weight gets no gradient.
TEST(UNetGuidance, CondProjGradientMatchesFiniteDifferences) {
  UNet model(GuidedConfig());
  model.InitializeRandom(7);
  const Batch batch;
  std::vector<float> r(kB * 4 * 64);
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = std::cos(0.7f * i);
  const auto loss = [&] {
    const std::vector<float> out = Output(model, batch.Inputs(true));
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i)
      l += double(r[i]) * out[i];
    return l;
  };
  const TensorSpec* w = model.global_parameter_table().Find("time_embedding.cond_proj.weight");
  ASSERT_NE(w, nullptr);
  std::fill(model.grads(), model.grads() + model.num_params(), 0.0f);
  Output(model, batch.Inputs(true));
  ASSERT_TRUE(model.Backward(0, r.data(), nullptr).ok());
  const std::vector<float> grad(model.grads() + w->offset, model.grads() + w->offset + w->numel);
  double largest = 0;
  for (float g : grad)
    largest = std::max(largest, double(std::abs(g)));
  ASSERT_GT(largest, 0);
  constexpr float kStep = 1e-2f;
  for (size_t i = 0; i < w->numel; ++i) {
    float& p = model.params()[w->offset + i];
    const float kept = p;
    p = kept + kStep;
    const double up = loss();
    p = kept - kStep;
    const double down = loss();
    p = kept;
    EXPECT_NEAR(grad[i], (up - down) / (2 * kStep), 2e-2 * largest) << "element " << i;
  }
  std::fill(model.grads(), model.grads() + model.num_params(), 0.0f);
  Output(model, batch.Inputs(false));
  ASSERT_TRUE(model.Backward(0, r.data(), nullptr).ok());
  for (size_t i = 0; i < w->numel; ++i)
    EXPECT_EQ(model.grads()[w->offset + i], 0.0f);
}

// The pipeline's embedding of g = 8.5 (w = 7.5): sin then cos of 7500·f_k, f_0 = 1 and
// f_{half−1} = 10⁻⁴, within float32's phase error at 7500; an odd width ends in a 0.
TEST(UNetGuidance, GuidanceScaleEmbedding) {
  std::vector<float> e(9);
  cpu::GuidanceScaleEmbedding(e.data(), 8.5, 8);
  for (int k = 0; k < 4; ++k) {
    const double arg = 7500 * std::exp(-k * std::log(10000.0) / 3);
    EXPECT_NEAR(e[k], std::sin(arg), 1e-3) << k;
    EXPECT_NEAR(e[4 + k], std::cos(arg), 1e-3) << k;
  }
  EXPECT_NEAR(e[3], std::sin(0.75), 1e-6);
  cpu::GuidanceScaleEmbedding(e.data(), 1.0, 9);  // w = 0: sin 0, cos 1
  EXPECT_EQ(e, (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 0}));
}

}  // namespace
}  // namespace difftrain
