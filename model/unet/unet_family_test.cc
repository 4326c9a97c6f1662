// The UNet family: SD configs' parameter counts and state-dict names and shapes (MODELS.md),
// the forward MACs at 512 px, diffusers config keys in and out, refusals by name, and the
// model's contracts (gradients accumulate, the ready offsets only decrease).
#include "model/unet/family.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/data/dataset.h"
#include "model/train/trainer.h"
#include "model/unet/plan.h"
#include "model/unet/unet.h"
#include "model/unet/unet_testing.h"

namespace difftrain {
namespace {

UNetConfig Named(const std::string& name) {
  Result<UNetConfig> c = UNetConfigByName(name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

std::vector<int64_t> Shape(const UNetPlan& plan, const std::string& name) {
  const TensorSpec* t = plan.table.Find(name);
  return t ? t->shape : std::vector<int64_t>{};
}

// A config.json's numbers past int's range are refused by key (tests/fuzz/config_fuzz: a float
// of 3e57 read as an int was undefined behaviour); an integral float is an int.
TEST(UNetFamily, ConfigNumbersMustBeInts) {
  nlohmann::json j = testing::TinyUNetConfig().ToJson();
  j["sample_size"] = 3.05227e57;
  EXPECT_THAT(UNetConfig::FromJson(j).status().message(),
              ::testing::HasSubstr("sample_size: 3.05227e+57 is not an integer"));
  j = testing::TinyUNetConfig().ToJson();
  j["block_out_channels"] = {8, int64_t{1} << 33};
  EXPECT_THAT(UNetConfig::FromJson(j).status().message(),
              ::testing::HasSubstr("block_out_channels: 8589934592 is not an integer"));
  j = testing::TinyUNetConfig().ToJson();
  j["cross_attention_dim"] = double(testing::TinyUNetConfig().cross_attention_dim);
  Result<UNetConfig> read = UNetConfig::FromJson(j);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->ToJson(), testing::TinyUNetConfig().ToJson());
}

TEST(UNetFamily, StableDiffusionParameterCountsAndNames) {
  const UNetPlan sd1(Named("SD1.5"));
  EXPECT_EQ(sd1.table.total(), 859'520'964u);
  EXPECT_EQ(sd1.table.tensors().size(), 686u);
  EXPECT_EQ(UNetPlan(Named("SD2-base")).table.total(), 865'910'724u);
  EXPECT_EQ(UNetPlan(Named("SD2-v")).table.total(), 865'910'724u);
  using S = std::vector<int64_t>;
  EXPECT_EQ(Shape(sd1, "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"),
            (S{320, 768}));
  EXPECT_EQ(Shape(sd1, "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"),
            (S{2560, 320}));
  EXPECT_EQ(Shape(sd1, "down_blocks.0.attentions.0.proj_in.weight"), (S{320, 320, 1, 1}));
  EXPECT_EQ(Shape(sd1, "up_blocks.0.resnets.0.conv1.weight"), (S{1280, 2560, 3, 3}));
  EXPECT_EQ(Shape(sd1, "up_blocks.3.resnets.0.conv_shortcut.weight"), (S{320, 960, 1, 1}));
  EXPECT_EQ(Shape(sd1, "up_blocks.0.upsamplers.0.conv.weight"), (S{1280, 1280, 3, 3}));
  EXPECT_EQ(Shape(sd1, "down_blocks.2.downsamplers.0.conv.weight"), (S{1280, 1280, 3, 3}));
  EXPECT_EQ(Shape(sd1, "mid_block.attentions.0.transformer_blocks.0.attn1.to_out.0.bias"),
            (S{1280}));
  EXPECT_EQ(Shape(sd1, "time_embedding.linear_1.weight"), (S{1280, 320}));
  EXPECT_TRUE(Shape(sd1, "down_blocks.3.downsamplers.0.conv.weight").empty());
  const UNetPlan sd2(Named("SD2-base"));
  EXPECT_EQ(Shape(sd2, "down_blocks.1.attentions.0.proj_out.weight"), (S{640, 640}));
  EXPECT_EQ(Shape(sd2, "up_blocks.1.attentions.2.transformer_blocks.0.attn2.to_v.weight"),
            (S{1280, 1024}));
}

// SDXL's UNet as stabilityai/stable-diffusion-xl-base-1.0 holds it: 2,567,463,684
// parameters under diffusers' names, transformers of 1, 2 and 10 blocks (up blocks mirrored,
// the mid block's 10), the micro-conditioning's add_embedding; its config.json as the hub has
// it (upcast_attention null) reads back; the trainer's inputs are a pooled text of 1280 and
// the time ids of a 1024 px image.
TEST(UNetFamily, StableDiffusionXL) {
  const UNetConfig xl = Named("SDXL");
  const UNetPlan plan(xl);
  EXPECT_EQ(plan.table.total(), 2'567'463'684u);
  using S = std::vector<int64_t>;
  EXPECT_EQ(Shape(plan, "add_embedding.linear_1.weight"), (S{1280, 2816}));
  EXPECT_EQ(Shape(plan, "add_embedding.linear_2.bias"), (S{1280}));
  EXPECT_EQ(Shape(plan, "down_blocks.2.attentions.1.transformer_blocks.9.attn2.to_k.weight"),
            (S{1280, 2048}));
  EXPECT_EQ(Shape(plan, "down_blocks.1.attentions.0.transformer_blocks.1.ff.net.2.weight"),
            (S{640, 2560}));
  EXPECT_TRUE(Shape(plan, "down_blocks.1.attentions.0.transformer_blocks.2.norm1.weight").empty());
  EXPECT_EQ(Shape(plan, "mid_block.attentions.0.transformer_blocks.9.norm3.weight"), (S{1280}));
  EXPECT_EQ(Shape(plan, "up_blocks.0.attentions.2.transformer_blocks.9.attn1.to_q.weight"),
            (S{1280, 1280}));
  EXPECT_EQ(Shape(plan, "up_blocks.1.attentions.2.transformer_blocks.1.attn1.to_q.weight"),
            (S{640, 640}));
  EXPECT_TRUE(Shape(plan, "up_blocks.1.attentions.0.transformer_blocks.2.norm1.weight").empty());
  EXPECT_TRUE(Shape(plan, "down_blocks.0.attentions.0.norm.weight").empty());
  EXPECT_EQ(Shape(plan, "up_blocks.0.attentions.0.proj_in.weight"), (S{1280, 1280}));

  nlohmann::json hub = xl.ToJson();
  hub.erase("name");
  hub["upcast_attention"] = nullptr;
  hub["addition_embed_type_num_heads"] = 64;
  hub["num_attention_heads"] = nullptr;
  hub["_class_name"] = "UNet2DConditionModel";
  Result<ModelSpec> spec = UNetFamily().FromJson(hub);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->config["transformer_layers_per_block"], (nlohmann::json{1, 2, 10}));
  EXPECT_EQ(spec->config["addition_embed_type"], "text_time");
  const SampleSchema x = UNetFamily().Samples(*spec);
  EXPECT_EQ(x.pooled_text_dim, 1280);
  EXPECT_EQ(x.context_dim, 2048);
  EXPECT_EQ(x.time_ids, (std::vector<float>{1024, 1024, 0, 0, 1024, 1024}));
  Result<ModelSpec> wide = UNetFamily().Resized(*spec, 96, 160);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(UNetFamily().Samples(*wide).time_ids, (std::vector<float>{768, 1280, 0, 0, 768, 1280}));
  EXPECT_EQ(UNetFamily().Samples(UNetSpec(Named("SD1.5"))).pooled_text_dim, 0);
}

// SDXL's refiner (stabilityai/stable-diffusion-xl-refiner-1.0's UNet): five time ids, the last
// the aesthetic score, so its 2560 inputs of add_embedding are 1280 pooled + 5 · 256; the key is
// difftrain's, kept by its JSON, dropped from the diffusers config, refused without text_time.
TEST(UNetFamily, SdxlsRefinerHasFiveTimeIds) {
  nlohmann::json refiner = Named("SDXL").ToJson();
  refiner["block_out_channels"] = {384, 768, 1536, 1536};
  refiner["down_block_types"] = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                 "DownBlock2D"};
  refiner["up_block_types"] = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                               "UpBlock2D"};
  refiner["transformer_layers_per_block"] = 4;
  refiner["attention_head_dim"] = {6, 12, 24, 24};
  refiner["cross_attention_dim"] = 1280;
  refiner["projection_class_embeddings_input_dim"] = 2560;
  refiner["name"] = "custom";
  refiner["requires_aesthetics_score"] = true;
  Result<ModelSpec> spec = UNetFamily().FromJson(refiner);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->config["requires_aesthetics_score"], true);
  const SampleSchema x = UNetFamily().Samples(*spec);
  EXPECT_EQ(x.pooled_text_dim, 1280);
  EXPECT_TRUE(x.aesthetic_score);
  EXPECT_EQ(x.time_ids, (std::vector<float>{1024, 1024, 0, 0, 6}));
  Result<nlohmann::json> diffusers = UNetFamily().DiffusersConfig(*spec);
  ASSERT_TRUE(diffusers.ok());
  EXPECT_FALSE(diffusers->contains("requires_aesthetics_score"));
  // The same UNet read as the base's six ids would take a pooled embedding of 1024.
  refiner.erase("requires_aesthetics_score");
  EXPECT_EQ(UNetFamily().Samples(*UNetFamily().FromJson(refiner)).pooled_text_dim, 1024);

  nlohmann::json plain = Named("SD1.5").ToJson();
  plain["requires_aesthetics_score"] = true;
  EXPECT_NE(UNetFamily().FromJson(plain).status().message().find(
                "model.requires_aesthetics_score: an aesthetic score is a time id of SDXL's"),
            std::string::npos);
}

// What SDXL's keys take is checked, and refused by name otherwise.
TEST(UNetFamily, RefusesMalformedSdxlKeys) {
  const auto refusal = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = Named("SDXL").ToJson();
    edit(j);
    Result<ModelSpec> spec = UNetFamily().FromJson(j);
    return spec.ok() ? std::string("accepted") : spec.status().message();
  };
  EXPECT_NE(refusal([](auto& j) {
              j["transformer_layers_per_block"] = {1, 2};
            }).find("transformer_layers_per_block: expected one number or one per block (3)"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& j) {
              j["transformer_layers_per_block"] = {{1, 1}, {2, 2}, {3, 3}};
            }).find("a list per resnet"),
            std::string::npos);
  EXPECT_NE(
      refusal([](auto& j) { j["transformer_layers_per_block"] = 0; }).find("is not in [1, 64]"),
      std::string::npos);
  EXPECT_NE(refusal([](auto& j) {
              j["addition_embed_type"] = "text";
            }).find("only null and \"text_time\""),
            std::string::npos);
  EXPECT_NE(refusal([](auto& j) {
              j["addition_embed_type"] = nullptr;
            }).find("goes with addition_time_embed_dim"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& j) {
              j["projection_class_embeddings_input_dim"] = 1536;
            }).find("must exceed the 6 time ids'"),
            std::string::npos);
  EXPECT_EQ(refusal([](auto& j) { j["transformer_layers_per_block"] = 2; }), "accepted");
}

// MODELS.md's count at 512 px and 77 tokens: conv 209.2, linear 129.4, attention 63.0 G.
TEST(UNetFamily, ForwardMacsAt512Pixels) {
  const UNetMacs m = ForwardMacs(Named("SD1.5"));
  EXPECT_NEAR(m.conv / 1e9, 209.2, 0.05);
  EXPECT_NEAR(m.linear / 1e9, 129.4, 0.05);
  EXPECT_NEAR(m.attention / 1e9, 63.0, 0.05);
  EXPECT_NEAR(ForwardMacs(Named("SD2-base")).total() / 1e9, 402.1, 0.05);
}

// A pipeline's unet/config.json (`sample --pretrained`, `checkpoint.init_from`): what
// DiffusersConfig writes reads back as the same model; the config of another class, of none,
// or whose "_class_name" is no string is no UNet's (the caller asks the next family): neither
// an error nor an exception (nlohmann's value() threw on a number there).
TEST(UNetFamily, DiffusersConfigReadsBackAndOtherClassesAreNone) {
  const ModelSpec sd2 = UNetSpec(Named("SD2-base"));
  Result<nlohmann::json> written = UNetFamily().DiffusersConfig(sd2);
  ASSERT_TRUE(written.ok()) << written.status().message();
  EXPECT_EQ((*written)["_class_name"], "UNet2DConditionModel");
  EXPECT_FALSE(written->contains("name"));
  Result<std::optional<ModelSpec>> read = UNetFamily().FromDiffusersConfig(*written);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_TRUE(read->has_value());
  // The same model, under the name a pipeline's UNet takes (a config.json names none).
  nlohmann::json expected = Named("SD2-base").ToJson();
  expected["name"] = "unet";
  EXPECT_EQ(UNetConfigOf(**read).ToJson(), expected);

  for (const nlohmann::json& other : {nlohmann::json("AutoencoderKL"), nlohmann::json(42),
                                      nlohmann::json::array(), nlohmann::json(nullptr)}) {
    nlohmann::json config = *written;
    config["_class_name"] = other;
    Result<std::optional<ModelSpec>> none = UNetFamily().FromDiffusersConfig(config);
    ASSERT_TRUE(none.ok()) << other << ": " << none.status().message();
    EXPECT_FALSE(none->has_value()) << other;
  }
  nlohmann::json unnamed = *written;
  unnamed.erase("_class_name");
  EXPECT_FALSE(UNetFamily().FromDiffusersConfig(unnamed)->has_value());
  // A UNet's config that is no valid UNet is an error naming the key.
  nlohmann::json bad = *written;
  bad["act_fn"] = "gelu";
  EXPECT_THAT(UNetFamily().FromDiffusersConfig(bad).status().message(),
              ::testing::HasSubstr("act_fn"));
}

TEST(UNetFamily, DiffusersKeysInAndOut) {
  nlohmann::json j = Named("SD2-base").ToJson();
  j["_class_name"] = "UNet2DConditionModel";
  j["act_fn"] = "silu";
  j["norm_eps"] = 1e-05;
  Result<ModelSpec> spec = UNetFamily().FromJson(j);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->config["attention_head_dim"], (nlohmann::json{5, 10, 20, 20}));
  EXPECT_EQ(spec->config["use_linear_projection"], true);
  EXPECT_EQ(UNetConfigOf(*spec).heads(2), 20);

  j["act_fn"] = "gelu";
  Result<ModelSpec> other = UNetFamily().FromJson(j);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("model.act_fn: only \"silu\""), std::string::npos)
      << other.status().message();
  j["act_fn"] = "silu";
  j["encoder_hid_dim"] = 256;
  Result<ModelSpec> unknown = UNetFamily().FromJson(j);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("model.encoder_hid_dim"), std::string::npos);

  // Sizes that would make the plan's per-layer loops unbounded are refused.
  nlohmann::json deep = Named("SD2-base").ToJson();
  deep["layers_per_block"] = 65;
  Result<ModelSpec> too_deep = UNetFamily().FromJson(deep);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.status().message().find("model.layers_per_block 65 exceeds 64"),
            std::string::npos)
      << too_deep.status().message();
}

TEST(UNetFamily, RefusesModelParallelAxesByName) {
  const ModelSpec spec = UNetSpec(Named("SD1.5"));
  EXPECT_TRUE(UNetFamily().ValidateLayout(spec, {}).ok());
  for (const char* axis : {"tp", "cp", "pp"}) {
    LayoutShape layout;
    (axis[0] == 't' ? layout.tp : axis[0] == 'c' ? layout.cp : layout.pp) = 2;
    const Status s = UNetFamily().ValidateLayout(spec, layout);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(std::string("parallel.") + axis), std::string::npos) << s.message();
  }
}

TEST(UNetFamily, RequestsOverrideSampleSizeAndCheckShapes) {
  ModelRequest r;
  r.name = "SD1.5";
  r.input_size = 16;
  Result<ModelSpec> spec = ModelSpecFromRequest(r);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->family, "unet");
  EXPECT_EQ(spec->config["sample_size"], 16);
  r.input_size = 12;  // not divisible by 2^3
  EXPECT_FALSE(ModelSpecFromRequest(r).ok());
}

// Resized to height × width (sampling at another size): the same parameters, diffusers'
// sample_size [height, width] in the config (a side where square), the plan's values
// H × W with every halving; sides the down blocks cannot halve are refused, and so is
// resizing a DiT.
TEST(UNetFamily, ResizesToNonSquareSamples) {
  ModelRequest r;
  r.name = "SD1.5";
  r.input_size = 16;
  Result<ModelSpec> spec = ModelSpecFromRequest(r);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const ModelFamily& family = FamilyOf(*spec);
  Result<ModelSpec> wide = family.Resized(*spec, 16, 40);
  ASSERT_TRUE(wide.ok()) << wide.status().message();
  EXPECT_EQ(wide->config["sample_size"], nlohmann::json::array({16, 40}));
  const SampleSchema s = family.Samples(*wide);
  EXPECT_EQ(s.height, 16);
  EXPECT_EQ(s.width, 40);
  EXPECT_EQ(family.Cost(*wide).parameters, family.Cost(*spec).parameters);
  const UNetPlan plan(UNetConfigOf(*wide));
  const UNetValue& deepest = plan.values[plan.nodes[plan.nodes.size() / 2].output];
  EXPECT_EQ(deepest.W * 16, deepest.H * 40) << deepest.H << "x" << deepest.W;
  Result<ModelSpec> read = family.FromJson(wide->config);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, *wide);
  Result<ModelSpec> square = family.Resized(*wide, 24, 24);
  ASSERT_TRUE(square.ok());
  EXPECT_EQ(square->config["sample_size"], 24);
  Result<ModelSpec> odd = family.Resized(*spec, 16, 36);  // 36 is not divisible by 2^3
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("sample_size 36 must be divisible by 2^3"),
            std::string::npos)
      << odd.status().message();
  nlohmann::json bad = spec->config;
  bad["sample_size"] = {16};
  EXPECT_FALSE(family.FromJson(bad).ok());
  ModelRequest dit;
  dit.name = "DiT-S/2";
  Result<ModelSpec> dit_spec = ModelSpecFromRequest(dit);
  ASSERT_TRUE(dit_spec.ok());
  Result<ModelSpec> refused = FamilyOf(*dit_spec).Resized(*dit_spec, 16, 32);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the dit family runs at its model's size only"),
            std::string::npos)
      << refused.status().message();
}

// Backward adds into the gradients (two passes give twice one, up to rounding), and reports
// gradient ranges final from offsets that only decrease, ending at 0.
TEST(UNetModel, GradientsAccumulateAndReadyOffsetsDecrease) {
  UNet model(testing::TinyUNetConfig());
  model.InitializeRandom(3);
  const int B = 2;
  model.Reserve(B, 1);
  std::vector<float> x(B * 4 * 64), t = {10, 500}, context(B * 3 * 6), dout(B * 4 * 64);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.3f * i), dout[i] = std::cos(0.7f * i);
  for (size_t i = 0; i < context.size(); ++i)
    context[i] = std::cos(1.3f * i);
  const ModelInputs in{x.data(), t.data(), nullptr, context.data()};
  std::vector<size_t> offsets;
  ASSERT_TRUE(model.Forward(0, in, nullptr, nullptr).ok());
  ASSERT_TRUE(
      model.Backward(0, dout.data(), nullptr, [&](size_t o) { offsets.push_back(o); }).ok());
  ASSERT_FALSE(offsets.empty());
  EXPECT_EQ(offsets.back(), 0u);
  EXPECT_TRUE(std::is_sorted(offsets.rbegin(), offsets.rend()));
  const std::vector<float> once(model.grads(), model.grads() + model.num_params());
  ASSERT_TRUE(model.Forward(0, in, nullptr, nullptr).ok());
  ASSERT_TRUE(model.Backward(0, dout.data(), nullptr).ok());
  size_t nonzero = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    // Equal up to rounding: the second pass adds into what the first left.
    EXPECT_NEAR(model.grads()[i], 2 * once[i], 1e-5 * std::abs(once[i]) + 1e-9) << "element " << i;
    nonzero += once[i] != 0;
  }
  EXPECT_EQ(nonzero, once.size());  // every parameter is on a path to the output
}

// Textual inversion's gradient: SetContextGradient's dcontext is the gradient of
// L = Σ dout ⊙ UNet(x, t, context) with respect to the context, by central differences (float:
// h = 1e-2, within 1% of the gradient's RMS), the same with every parameter's gradient skipped
// and with recomputation, and added into what dcontext holds.
TEST(UNetModel, ContextGradientMatchesCentralDifferences) {
  const int B = 2;
  std::vector<float> x(B * 4 * 64), t = {10, 500}, context(B * 3 * 6), dout(B * 4 * 64);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.3f * i), dout[i] = std::cos(0.7f * i);
  for (size_t i = 0; i < context.size(); ++i)
    context[i] = std::cos(1.3f * i);
  const auto gradient = [&](bool skip, bool recompute, float prefill) {
    UNet model(testing::TinyUNetConfig());
    model.InitializeRandom(3);
    model.Reserve(B, 1, recompute);
    if (skip) {
      std::vector<size_t> all;
      for (const TensorSpec& t : model.parameter_table().tensors())
        all.push_back(t.offset);
      model.SkipGradients(all);
    }
    std::fill(model.grads(), model.grads() + model.num_params(), 0.0f);
    std::vector<float> dcontext(context.size(), prefill);
    EXPECT_TRUE(
        model.Forward(0, {x.data(), t.data(), nullptr, context.data()}, nullptr, nullptr).ok());
    EXPECT_TRUE(model.SetContextGradient(0, dcontext.data()).ok());
    EXPECT_TRUE(model.Backward(0, dout.data(), nullptr).ok());
    for (float& v : dcontext)
      v -= prefill;
    return dcontext;
  };
  const std::vector<float> analytic = gradient(false, false, 0.0f);
  UNet probe(testing::TinyUNetConfig());
  probe.InitializeRandom(3);
  probe.Reserve(B, 1);
  const auto loss = [&] {
    EXPECT_TRUE(
        probe.Forward(0, {x.data(), t.data(), nullptr, context.data()}, nullptr, nullptr).ok());
    double sum = 0;
    for (size_t i = 0; i < dout.size(); ++i)
      sum += double(dout[i]) * probe.output(0)[i];
    return sum;
  };
  double rms = 0;
  for (float g : analytic)
    rms += double(g) * g;
  rms = std::sqrt(rms / analytic.size());
  ASSERT_GT(rms, 0);
  const float h = 1e-2f;
  for (size_t i = 0; i < context.size(); ++i) {
    const float saved = context[i];
    context[i] = saved + h;
    const double up = loss();
    context[i] = saved - h;
    const double down = loss();
    context[i] = saved;
    EXPECT_NEAR(analytic[i], (up - down) / (2 * h), 1e-2 * rms) << "element " << i;
  }
  const std::vector<float> skipped = gradient(true, false, 0.0f);
  const std::vector<float> recomputed = gradient(false, true, 0.0f);
  const std::vector<float> added = gradient(true, false, 0.5f);
  for (size_t i = 0; i < analytic.size(); ++i) {
    EXPECT_EQ(skipped[i], analytic[i]) << "element " << i;
    EXPECT_EQ(recomputed[i], analytic[i]) << "element " << i;
    EXPECT_NEAR(added[i], analytic[i], 1e-6 * rms) << "element " << i;
  }
}

// Aspect-ratio buckets: a UNet set to another sample size steps as a UNet made at that size
// with the same parameters, bit for bit, forward and backward (recomputing too), and back at
// its own size as one made there; a size its down blocks cannot halve is refused.
TEST(UNetModel, SetToAnotherSizeStepsAsAModelMadeThere) {
  const auto step = [](UNet& model, int H, int W, bool recompute) {
    const int B = 2;
    model.Reserve(B, 1, recompute);
    std::vector<float> x(B * 4 * H * W), t = {10, 500}, context(B * 3 * 6), dout(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.3f * i), dout[i] = std::cos(0.7f * i);
    for (size_t i = 0; i < context.size(); ++i)
      context[i] = std::cos(1.3f * i);
    std::fill(model.grads(), model.grads() + model.num_params(), 0.0f);
    EXPECT_TRUE(
        model.Forward(0, {x.data(), t.data(), nullptr, context.data()}, nullptr, nullptr).ok());
    std::vector<float> out(model.output(0), model.output(0) + x.size());
    EXPECT_TRUE(model.Backward(0, dout.data(), nullptr).ok());
    out.insert(out.end(), model.grads(), model.grads() + model.num_params());
    return out;
  };
  for (bool recompute : {false, true}) {
    UNet model(testing::TinyUNetConfig());
    model.InitializeRandom(5);
    const std::vector<float> square = step(model, 8, 8, recompute);
    UNetConfig wide_config = testing::TinyUNetConfig();
    wide_config.sample_size = 6;
    wide_config.sample_width = 10;
    UNet wide(wide_config);
    std::copy(model.params(), model.params() + model.num_params(), wide.params());
    ASSERT_TRUE(model.SetSampleSize(6, 10).ok());
    EXPECT_EQ(model.config().sample_size, 6);
    EXPECT_EQ(model.config().width(), 10);
    EXPECT_EQ(step(model, 6, 10, recompute), step(wide, 6, 10, recompute)) << recompute;
    ASSERT_TRUE(model.SetSampleSize(8, 8).ok());
    EXPECT_EQ(model.config().sample_width, 0);
    EXPECT_EQ(step(model, 8, 8, recompute), square) << recompute;
    const Status odd = model.SetSampleSize(8, 7);
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.message().find("must be divisible by 2^1"), std::string::npos) << odd.message();
    EXPECT_EQ(model.config().width(), 8);  // unchanged
  }
}

// An SDXL-shaped UNet trains on synthetic data (texts and pooled texts N(0, 1), dropped
// together), and its output depends on the pooled text and the time ids.
TEST(UNetModel, SdxlMicroConditioningReachesTheOutput) {
  UNet model(testing::TinySdxlConfig());
  model.InitializeRandom(4);
  const int B = 1;
  model.Reserve(B, 1);
  std::vector<float> x(4 * 64), t = {300}, context(3 * 6), pooled(4, 0.25f),
                                ids = {64, 64, 0, 0, 64, 64};
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.3f * i);
  ModelInputs in{x.data(), t.data(), nullptr, context.data()};
  in.pooled_text = pooled.data();
  in.time_ids = ids.data();
  const auto output = [&] {
    EXPECT_TRUE(model.Forward(0, in, nullptr, nullptr).ok());
    return std::vector<float>(model.output(0), model.output(0) + x.size());
  };
  const std::vector<float> base = output();
  pooled[2] = -1;
  const std::vector<float> other_text = output();
  pooled[2] = 0.25f;
  ids[0] = 48;
  const std::vector<float> other_size = output();
  EXPECT_NE(base, other_text);
  EXPECT_NE(base, other_size);
  ids[0] = 64;
  EXPECT_EQ(base, output());

  TrainConfig config;
  config.model = UNetSpec(testing::TinySdxlConfig());
  config.micro_batch = config.global_batch = 2;
  const SampleSchema s = UNetFamily().Samples(config.model);
  Trainer trainer(config, std::make_unique<SyntheticDataset>(1, s.channels, s.height, 0));
  for (int step = 0; step < 2; ++step) {
    const Result<StepStats> stats = trainer.Step();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    EXPECT_TRUE(std::isfinite(stats->loss)) << stats->loss;
  }
}

// `difftrain info`'s memory model (PlanMemory, through the family) is what a training rank
// of a tiny UNet allocates, arena by arena.
TEST(UNetModel, PlannedMemoryIsWhatATrainerAllocates) {
  TrainConfig config;
  config.model = UNetSpec(testing::TinyUNetConfig());
  config.micro_batch = config.global_batch = 3;
  const SampleSchema x = UNetFamily().Samples(config.model);
  Trainer trainer(config, std::make_unique<SyntheticDataset>(1, x.channels, x.height, 0));
  Result<MemoryBytes> planned =
      PlanMemory(config.model, {}, 0, 3, 1, false, 1, size_t{1} << 20, false);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  const MemoryBytes real = trainer.memory();
  EXPECT_EQ(planned->parameters, real.parameters);
  EXPECT_EQ(planned->gradients, real.gradients);
  EXPECT_EQ(planned->optimizer, real.optimizer);
  EXPECT_EQ(planned->ema, real.ema);
  EXPECT_EQ(planned->activations, real.activations);
  EXPECT_GT(real.activations, 0u);
}

}  // namespace
}  // namespace difftrain
