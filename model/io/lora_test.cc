// FuseLora on a hand-made table: the update of each key form against W + scale · alpha/rank ·
// B·A worked out here, a convolution's LoCon, and every refusal by name. diffusers' own reading
// of the forms is the reference in tests/lora_reference_test.cc.
#include "model/io/lora.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/io/safetensors.h"

namespace difftrain::io {
namespace {

using ::testing::HasSubstr;

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("lora_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    table_.Add("blocks.0.attn1.to_q.weight", {3, 4});
    table_.Add("blocks.0.attn1.to_q.bias", {3});
    table_.Add("blocks.0.attn1.to_out.0.weight", {2, 3});
    table_.Add("blocks.0.conv1.weight", {2, 3, 3, 3});
    params_.resize(table_.total());
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i] = 0.01f * static_cast<float>(i);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `writer` to a file of that name; its path.
  std::string Write(const SafetensorsWriter& writer, const std::string& name) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(writer.WriteAtomic(path).ok());
    return path;
  }
  // The UNet target of `params`.
  std::vector<LoraTarget> UNet(std::vector<float>& params) const {
    return {{kLoraUNet, &table_, params.data()}};
  }
  // The weight of `name` after fusing: a copy of the arena.
  std::vector<float> Weight(const std::vector<float>& params, const std::string& name) const {
    const TensorSpec* t = table_.Find(name);
    return {params.begin() + t->offset, params.begin() + t->offset + t->numel};
  }
  // Equal up to float32's rounding of the product (FuseLora adds it in float32 on BLAS).
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "element " << i;
  }
  // W + factor · B·A, out × in.
  static std::vector<float> Expected(std::vector<float> w, const std::vector<float>& b,
                                     const std::vector<float>& a, int out, int rank, int in,
                                     double factor) {
    for (int o = 0; o < out; ++o) {
      for (int j = 0; j < in; ++j) {
        double d = 0;
        for (int r = 0; r < rank; ++r)
          d += double(b[o * rank + r]) * a[r * in + j];
        w[o * in + j] = static_cast<float>(w[o * in + j] + factor * d);
      }
    }
    return w;
  }

  std::filesystem::path dir_;
  TensorTable table_;
  std::vector<float> params_;
  const std::vector<float> a_ = {0.5f, -1, 2, 0.25f, 1, 1, -0.5f, 3};  // [2, 4]
  const std::vector<float> b_ = {1, 2, -1, 0.5f, 0, 3};                // [3, 2]
};

TEST_F(LoraTest, EveryKeyFormFusesTheSameUpdate) {
  const std::vector<float> want =
      Expected(Weight(params_, "blocks.0.attn1.to_q.weight"), b_, a_, 3, 2, 4, 0.5 * 1.0);
  const std::vector<std::pair<std::string, std::string>> forms = {
      {"unet.blocks.0.attn1.to_q.lora_A.weight", "unet.blocks.0.attn1.to_q.lora_B.weight"},
      {"blocks.0.attn1.to_q.lora.down.weight", "blocks.0.attn1.to_q.lora.up.weight"},
      {"unet.blocks.0.attn1.to_q.lora_linear_layer.down.weight",
       "unet.blocks.0.attn1.to_q.lora_linear_layer.up.weight"},
      {"unet.blocks.0.attn1.processor.to_q_lora.down.weight",
       "unet.blocks.0.attn1.processor.to_q_lora.up.weight"},
      {"lora_unet_blocks_0_attn1_to_q.lora_down.weight",
       "lora_unet_blocks_0_attn1_to_q.lora_up.weight"}};
  for (const auto& [down, up] : forms) {
    SCOPED_TRACE(down);
    SafetensorsWriter w;
    w.AddF32(down, {2, 4}, a_.data());
    w.AddF32(up, {3, 2}, b_.data());
    std::vector<float> params = params_;
    Result<LoraFused> fused = FuseLora(Write(w, "form.safetensors"), 0.5, UNet(params));
    ASSERT_TRUE(fused.ok()) << fused.status().message();
    EXPECT_EQ(fused->modules, 1);
    EXPECT_EQ(fused->rank, 2);
    ExpectClose(Weight(params, "blocks.0.attn1.to_q.weight"), want);
    // Nothing else moves.
    EXPECT_EQ(Weight(params, "blocks.0.attn1.to_q.bias"),
              Weight(params_, "blocks.0.attn1.to_q.bias"));
    EXPECT_EQ(Weight(params, "blocks.0.conv1.weight"), Weight(params_, "blocks.0.conv1.weight"));
  }
}

// DoRA's magnitude (peft's lora_magnitude_vector, a Linear's [out] and a convolution's
// [1, out, 1, 1]) scales each row of W0 + scale·B·A to its magnitude, as peft merges it.
TEST_F(LoraTest, DoraMagnitudesScaleEachRowOfTheUpdatedWeight) {
  const std::vector<float> magnitude = {0.5f, 2, 1.5f};
  const std::vector<float> conv_a(2 * 27, 0.125f), conv_b = {1, -1, 0.5f, 2}, conv_m = {3, 0.25f};
  SafetensorsWriter w;
  w.AddF32("unet.blocks.0.attn1.to_q.lora_A.weight", {2, 4}, a_.data());
  w.AddF32("unet.blocks.0.attn1.to_q.lora_B.weight", {3, 2}, b_.data());
  w.AddF32("unet.blocks.0.attn1.to_q.lora_magnitude_vector", {3}, magnitude.data());
  w.AddF32("unet.blocks.0.conv1.lora_A.weight", {2, 3, 3, 3}, conv_a.data());
  w.AddF32("unet.blocks.0.conv1.lora_B.weight", {2, 2, 1, 1}, conv_b.data());
  w.AddF32("unet.blocks.0.conv1.lora_magnitude_vector", {1, 2, 1, 1}, conv_m.data());
  std::vector<float> params = params_;
  Result<LoraFused> fused = FuseLora(Write(w, "dora.safetensors"), 0.5, UNet(params));
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  EXPECT_EQ(fused->modules, 2);
  const auto scaled = [](std::vector<float> v, const std::vector<float>& m, int in) {
    for (size_t o = 0; o < m.size(); ++o) {
      double norm = 0;
      for (int j = 0; j < in; ++j)
        norm += double(v[o * in + j]) * v[o * in + j];
      for (int j = 0; j < in; ++j)
        v[o * in + j] = static_cast<float>(v[o * in + j] * m[o] / std::sqrt(norm));
    }
    return v;
  };
  ExpectClose(Weight(params, "blocks.0.attn1.to_q.weight"),
              scaled(Expected(Weight(params_, "blocks.0.attn1.to_q.weight"), b_, a_, 3, 2, 4, 0.5),
                     magnitude, 4));
  ExpectClose(
      Weight(params, "blocks.0.conv1.weight"),
      scaled(Expected(Weight(params_, "blocks.0.conv1.weight"), conv_b, conv_a, 2, 2, 27, 0.5),
             conv_m, 27));
  EXPECT_EQ(Weight(params, "blocks.0.attn1.to_q.bias"),
            Weight(params_, "blocks.0.attn1.to_q.bias"));
}

// kohya's alpha scales by alpha/rank (F16 tensors converted exactly); a 3×3 convolution's LoCon
// multiplies over the flattened input and kernel; to_out_lora is to_out.0.
TEST_F(LoraTest, AlphaLoConAndProcessorsToOut) {
  const std::vector<uint16_t> alpha = {0x4600};  // 6.0 in F16
  std::vector<float> conv_a(2 * 27), conv_b(2 * 2);
  for (size_t i = 0; i < conv_a.size(); ++i)
    conv_a[i] = 0.1f * static_cast<float>(i % 7) - 0.2f;
  conv_b = {1, -2, 0.5f, 4};
  SafetensorsWriter w;
  w.AddF32("lora_unet_blocks_0_conv1.lora_down.weight", {2, 3, 3, 3}, conv_a.data());
  w.AddF32("lora_unet_blocks_0_conv1.lora_up.weight", {2, 2, 1, 1}, conv_b.data());
  w.Add("lora_unet_blocks_0_conv1.alpha", DType::kF16, {}, alpha.data());
  const std::vector<float> out_a = {1, 0, -1}, out_b = {2, 3};  // rank 1 onto [2, 3]
  w.AddF32("unet.blocks.0.attn1.processor.to_out_lora.down.weight", {1, 3}, out_a.data());
  w.AddF32("unet.blocks.0.attn1.processor.to_out_lora.up.weight", {2, 1}, out_b.data());
  std::vector<float> params = params_;
  Result<LoraFused> fused = FuseLora(Write(w, "locon.safetensors"), 2.0, UNet(params));
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  EXPECT_EQ(fused->modules, 2);
  ExpectClose(
      Weight(params, "blocks.0.conv1.weight"),
      Expected(Weight(params_, "blocks.0.conv1.weight"), conv_b, conv_a, 2, 2, 27, 2.0 * 6.0 / 2));
  ExpectClose(
      Weight(params, "blocks.0.attn1.to_out.0.weight"),
      Expected(Weight(params_, "blocks.0.attn1.to_out.0.weight"), out_b, out_a, 2, 1, 3, 2.0));
}

TEST_F(LoraTest, RefusesByName) {
  struct Case {
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", {2, 4}}},
       "adapts the text_encoder, which is not fused here"},
      {{{"text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", {2, 4}}},
       "adapts the text_encoder, which is not fused here"},
      {{{"lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", {2, 4}}},
       "adapts the text_encoder_2"},
      {{{"lora_unet_input_blocks_4_1_proj_in.lora_down.weight", {2, 4}},
        {"lora_unet_input_blocks_4_1_proj_in.lora_up.weight", {3, 2}}},
       "the unet has no module 'lora_unet_input_blocks_4_1_proj_in'"},
      {{{"unet.blocks.0.attn9.to_q.lora_A.weight", {2, 4}},
        {"unet.blocks.0.attn9.to_q.lora_B.weight", {3, 2}}},
       "the unet has no module 'blocks.0.attn9.to_q'"},
      {{{"unet.blocks.0.attn1.to_q.lora_A.weight", {2, 4}}}, "without its up (B) matrix"},
      {{{"unet.blocks.0.attn1.to_q.lora_A.weight", {2, 5}},
        {"unet.blocks.0.attn1.to_q.lora_B.weight", {3, 2}}},
       "down [2, 5] and up [3, 2] do not make its weight [3, 4]"},
      {{{"unet.blocks.0.attn1.to_q.weight", {3, 4}}}, "not a LoRA key difftrain reads"},
      {{{"unet.blocks.0.attn1.to_q.lora_A.weight", {2, 4}},
        {"unet.blocks.0.attn1.to_q.lora_B.weight", {3, 2}},
        {"unet.blocks.0.attn1.to_q.lora_magnitude_vector", {4}}},
       "expected one magnitude per output row of 'blocks.0.attn1.to_q' (3)"},
      {{{"unet.blocks.0.attn1.to_q.lora_magnitude_vector", {3}}},
       "has 'unet.blocks.0.attn1.to_q.lora_magnitude_vector' without its down (A) matrix"},
      {{{"lora_unet_blocks_0_attn1_to_q.dora_scale", {1, 4}}}, "not a kohya LoRA key"},
      {{{"lora_unet_blocks_0_attn1_to_q.hada_w1_a", {3, 4}}}, "not a kohya LoRA key"},
      {{{"unet.blocks.0.attn1.to_q.lora_A.weight", {2, 4}},
        {"unet.blocks.0.attn1.to_q.lora.down.weight", {2, 4}},
        {"unet.blocks.0.attn1.to_q.lora_B.weight", {3, 2}}},
       "name the same tensor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    SafetensorsWriter w;
    std::vector<std::vector<float>> data;
    for (const auto& [name, shape] : c.tensors) {
      int64_t n = 1;
      for (int64_t d : shape)
        n *= d;
      data.emplace_back(n, 0.5f);
      w.AddF32(name, shape, data.back().data());
    }
    const std::string path = Write(w, "bad.safetensors");
    std::vector<float> params = params_;
    Result<LoraFused> fused = FuseLora(path, 1.0, UNet(params));
    ASSERT_FALSE(fused.ok());
    EXPECT_THAT(fused.status().message(), HasSubstr(c.message));
    EXPECT_THAT(fused.status().message(), HasSubstr(path));
  }
  EXPECT_FALSE(FuseLora((dir_ / "missing.safetensors").string(), 1.0, UNet(params_)).ok());
}

// A file of both components: each target takes its own keys (the text encoder's attention
// processors' to_q_lora is q_proj, to_out_lora out_proj; kohya's lora_te_), a skipped component
// is passed over, and one neither targeted nor skipped is refused with the caller's reason.
TEST_F(LoraTest, ComponentsTakeTheirOwnKeys) {
  TensorTable text;
  text.Add("text_model.encoder.layers.0.self_attn.q_proj.weight", {3, 4});
  text.Add("text_model.encoder.layers.0.self_attn.out_proj.weight", {2, 3});
  std::vector<float> text_params(text.total(), 0.25f);
  const std::vector<float> out_a = {1, 0, -1}, out_b = {2, 3};
  SafetensorsWriter w;
  w.AddF32("unet.blocks.0.attn1.to_q.lora_A.weight", {2, 4}, a_.data());
  w.AddF32("unet.blocks.0.attn1.to_q.lora_B.weight", {3, 2}, b_.data());
  w.AddF32("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", {2, 4},
           a_.data());
  w.AddF32("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", {3, 2},
           b_.data());
  w.AddF32("text_encoder.text_model.encoder.layers.0.self_attn.to_out_lora.down.weight", {1, 3},
           out_a.data());
  w.AddF32("text_encoder.text_model.encoder.layers.0.self_attn.to_out_lora.up.weight", {2, 1},
           out_b.data());
  const std::string path = Write(w, "both.safetensors");
  std::vector<float> params = params_, encoder = text_params;
  Result<LoraFused> unet = FuseLora(path, 1.0, UNet(params), {kLoraTextEncoder});
  ASSERT_TRUE(unet.ok()) << unet.status().message();
  EXPECT_EQ(unet->modules, 1);
  Result<LoraFused> te =
      FuseLora(path, 1.0, {{kLoraTextEncoder, &text, encoder.data()}}, {kLoraUNet});
  ASSERT_TRUE(te.ok()) << te.status().message();
  EXPECT_EQ(te->modules, 2);
  ExpectClose(std::vector<float>(encoder.begin(), encoder.begin() + 12),
              Expected(std::vector<float>(text_params.begin(), text_params.begin() + 12), b_, a_, 3,
                       2, 4, 1.0));
  ExpectClose(std::vector<float>(encoder.begin() + 12, encoder.end()),
              Expected(std::vector<float>(text_params.begin() + 12, text_params.end()), out_b,
                       out_a, 2, 1, 3, 1.0));
  Result<LoraFused> refused =
      FuseLora(path, 1.0, UNet(params), {}, "the prompts come from a table");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("adapts the text_encoder, which the prompts come from a table"));
}

}  // namespace
}  // namespace difftrain::io
