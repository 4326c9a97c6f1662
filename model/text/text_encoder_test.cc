#include "model/text/encoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;

TextEncoderConfig Tiny(TextEncoderKind kind) {
  TextEncoderConfig c;
  c.kind = kind;
  c.vocab_size = 20;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 2;
  c.num_heads = 2;
  c.max_positions = 6;
  c.type_vocab_size = 2;
  c.layer_norm_eps = kind == TextEncoderKind::kBert ? 1e-12 : 1e-5;
  c.activation =
      kind == TextEncoderKind::kBert ? TextActivation::kGelu : TextActivation::kQuickGelu;
  return c;
}

TextEncoder RandomEncoder(const TextEncoderConfig& c, uint64_t seed) {
  Rng rng(seed, RngStream::kData);
  std::vector<float> w(TextEncoder::Tensors(c).total());
  for (float& x : w)
    x = static_cast<float>(0.5 * rng.Normal());
  return TextEncoder(c, std::move(w));
}

text::Tokens Text(std::vector<int32_t> ids, int real) {
  text::Tokens t;
  t.ids = std::move(ids);
  t.mask.assign(t.ids.size(), 0);
  std::fill(t.mask.begin(), t.mask.begin() + real, 1);
  return t;
}

std::vector<float> Encode(const TextEncoder& e, const std::vector<text::Tokens>& texts,
                          int skip = 0) {
  std::vector<float> out(texts.size() * texts[0].ids.size() * e.config().hidden_size);
  const Status s = e.Encode(texts, skip, out.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// A row of [L, D] as a vector.
std::vector<float> Row(const std::vector<float>& v, int l, int D) {
  return {v.begin() + l * D, v.begin() + (l + 1) * D};
}

TEST(TextEncoderTest, TensorsAreTransformersNames) {
  const TensorTable bert = TextEncoder::Tensors(Tiny(TextEncoderKind::kBert));
  EXPECT_NE(bert.Find("encoder.layer.1.attention.self.query.weight"), nullptr);
  EXPECT_NE(bert.Find("embeddings.token_type_embeddings.weight"), nullptr);
  // 20·8 + 6·8 + 2·8 + 16 + 2 · (4 · 72 + 16 + 12·8 + 12 + 8·12 + 8 + 16)
  EXPECT_EQ(bert.total(), 160u + 48 + 16 + 16 + 2 * (4 * 72 + 16 + 96 + 12 + 96 + 8 + 16));
  const TensorTable clip = TextEncoder::Tensors(Tiny(TextEncoderKind::kClip));
  EXPECT_NE(clip.Find("text_model.encoder.layers.0.mlp.fc2.bias"), nullptr);
  EXPECT_NE(clip.Find("text_model.final_layer_norm.weight"), nullptr);
  EXPECT_EQ(clip.Find("embeddings.token_type_embeddings.weight"), nullptr);
}

// BERT's padding is masked out of attention: what fills it does not change the real tokens'
// states, and the mask does.
TEST(TextEncoderTest, BertDoesNotAttendToPadding) {
  const TextEncoder e = RandomEncoder(Tiny(TextEncoderKind::kBert), 1);
  const int D = 8;
  const std::vector<float> a = Encode(e, {Text({1, 5, 7, 2, 0, 0}, 4)});
  const std::vector<float> b = Encode(e, {Text({1, 5, 7, 2, 9, 13}, 4)});
  const std::vector<float> c = Encode(e, {Text({1, 5, 7, 2, 9, 13}, 6)});
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(Row(a, l, D), Row(b, l, D)) << l;
    EXPECT_NE(Row(b, l, D), Row(c, l, D)) << l;
  }
}

// CLIP's attention is causal: a token's state depends on the tokens before it only.
TEST(TextEncoderTest, ClipIsCausal) {
  const TextEncoder e = RandomEncoder(Tiny(TextEncoderKind::kClip), 2);
  const int D = 8;
  const std::vector<float> a = Encode(e, {Text({1, 5, 7, 2, 3, 3}, 6)});
  const std::vector<float> b = Encode(e, {Text({1, 5, 7, 4, 3, 3}, 6)});
  for (int l = 0; l < 3; ++l)
    EXPECT_EQ(Row(a, l, D), Row(b, l, D)) << l;
  for (int l = 3; l < 6; ++l)
    EXPECT_NE(Row(a, l, D), Row(b, l, D)) << l;
}

// Texts are encoded independently: two at once give what each gives alone (up to the GEMM's
// blocking, which may differ with the number of rows).
TEST(TextEncoderTest, TextsInABatchAreIndependent) {
  for (TextEncoderKind kind : {TextEncoderKind::kBert, TextEncoderKind::kClip}) {
    const TextEncoder e = RandomEncoder(Tiny(kind), 3);
    const text::Tokens x = Text({1, 5, 7, 0, 0}, 3), y = Text({4, 4, 19, 2, 8}, 5);
    std::vector<float> both = Encode(e, {x, y}, 1);
    std::vector<float> one = Encode(e, {x}, 1), two = Encode(e, {y}, 1);
    one.insert(one.end(), two.begin(), two.end());
    ASSERT_EQ(both.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_NEAR(both[i], one[i], 1e-5 * (1 + std::abs(one[i]))) << i;
  }
}

TEST(TextEncoderTest, RefusesWhatItCannotEncode) {
  const TextEncoder e = RandomEncoder(Tiny(TextEncoderKind::kClip), 4);
  std::vector<float> out(1000);
  Status s = e.Encode({Text({1, 20}, 2)}, 0, out.data());
  EXPECT_THAT(s.message(), HasSubstr("token 1 of text 0 is id 20, outside [0, 20)"));
  s = e.Encode({Text({1, 2, 3, 4, 5, 6, 7}, 7)}, 0, out.data());
  EXPECT_THAT(s.message(), HasSubstr("texts of 7 tokens; it takes 1 to 6"));
  s = e.Encode({Text({1, 2}, 2)}, 2, out.data());
  EXPECT_THAT(s.message(), HasSubstr("cannot skip 2 of its 2 layers"));
  s = e.Encode({Text({1, 2}, 2), Text({1, 2, 3}, 3)}, 0, out.data());
  EXPECT_THAT(s.message(), HasSubstr("text 1 has 3 tokens"));
}

// The pooled output is the last hidden state (after the final LayerNorm) at the end-of-text
// position, projected: the first eos_token_id, or with the legacy id 2 the largest id's first
// position, or position 0 where the id is missing, as transformers' CLIPTextTransformer takes it.
TEST(TextEncoderTest, ClipPoolsTheProjectedEndOfTextState) {
  TextEncoderConfig c = Tiny(TextEncoderKind::kClip);
  c.projection_dim = 3;
  c.eos_token_id = 7;
  TextEncoder e = RandomEncoder(c, 6);
  ASSERT_EQ(e.projection_dim(), 3);
  const int D = 8, P = 3;
  const float* projection = e.weights() + e.tensors().Find("text_projection.weight")->offset;
  const auto project = [&](const std::vector<float>& row) {
    std::vector<float> out(P, 0.0f);
    for (int p = 0; p < P; ++p) {
      for (int d = 0; d < D; ++d)
        out[p] += projection[p * D + d] * row[d];
    }
    return out;
  };
  const std::vector<text::Tokens> texts = {Text({1, 7, 19, 7, 3, 3}, 6),
                                           Text({1, 5, 9, 2, 3, 3}, 6)};
  const std::vector<float> hidden = Encode(e, texts);
  std::vector<float> pooled(2 * P), hidden_too(hidden.size()), pooled_too(2 * P);
  ASSERT_TRUE(e.Pool(texts, pooled.data()).ok());
  ASSERT_TRUE(e.Encode(texts, 0, hidden_too.data(), true, pooled_too.data()).ok());
  EXPECT_EQ(hidden_too, hidden);
  EXPECT_EQ(pooled_too, pooled);
  const auto expect_pooled = [&](const std::vector<float>& got, int n, int l) {
    const std::vector<float> want = project(Row(hidden, n * 6 + l, D));
    for (int p = 0; p < P; ++p)
      EXPECT_NEAR(got[n * P + p], want[p], 1e-5 * (1 + std::abs(want[p]))) << n << " " << p;
  };
  expect_pooled(pooled, 0, 1);  // the first 7
  expect_pooled(pooled, 1, 0);  // no 7
  e = RandomEncoder(
      [&] {
        TextEncoderConfig legacy = c;
        legacy.eos_token_id = 2;
        return legacy;
      }(),
      6);
  ASSERT_TRUE(e.Pool(texts, pooled.data()).ok());
  expect_pooled(pooled, 0, 2);  // the first 19, the largest id
  expect_pooled(pooled, 1, 2);  // 9
}

// SDXL takes the hidden state without the final LayerNorm; Stable Diffusion 1.x/2.x take the
// final LayerNorm of it.
TEST(TextEncoderTest, ClipHiddenStateWithoutTheFinalNorm) {
  TextEncoder e = RandomEncoder(Tiny(TextEncoderKind::kClip), 7);
  const int L = 6, D = 8;
  const std::vector<text::Tokens> texts = {Text({1, 5, 7, 2, 3, 3}, L)};
  std::vector<float> raw(L * D), normed(L * D);
  ASSERT_TRUE(e.Encode(texts, 1, raw.data(), false).ok());
  ASSERT_TRUE(e.Encode(texts, 1, normed.data(), true).ok());
  EXPECT_EQ(normed, Encode(e, texts, 1));
  EXPECT_NE(raw, normed);
  const float* gamma = e.weights() + e.tensors().Find("text_model.final_layer_norm.weight")->offset;
  const float* beta = e.weights() + e.tensors().Find("text_model.final_layer_norm.bias")->offset;
  for (int l = 0; l < L; ++l) {
    double mean = 0, var = 0;
    for (int d = 0; d < D; ++d)
      mean += raw[l * D + d] / double(D);
    for (int d = 0; d < D; ++d)
      var += (raw[l * D + d] - mean) * (raw[l * D + d] - mean) / D;
    for (int d = 0; d < D; ++d) {
      const double want = (raw[l * D + d] - mean) / std::sqrt(var + 1e-5) * gamma[d] + beta[d];
      EXPECT_NEAR(normed[l * D + d], want, 1e-4 * (1 + std::abs(want))) << l << " " << d;
    }
  }
}

TEST(TextEncoderTest, RefusesToPoolWithoutAProjection) {
  const TextEncoder e = RandomEncoder(Tiny(TextEncoderKind::kClip), 9);
  EXPECT_EQ(e.projection_dim(), 0);
  std::vector<float> out(100);
  const Status s = e.Pool({Text({1, 2}, 2)}, out.data());
  EXPECT_THAT(s.message(), HasSubstr("no text_projection, so no pooled output"));
  std::vector<float> hidden(100);
  EXPECT_FALSE(e.Encode({Text({1, 2}, 2)}, 0, hidden.data(), true, out.data()).ok());
}

TEST(TextEncoderConfigTest, ReadsTransformersConfigs) {
  Result<TextEncoderConfig> c = TextEncoderConfig::FromJson(nlohmann::json::parse(
      R"({"model_type": "clip_text_model", "hidden_size": 1024, "num_hidden_layers": 23,
          "num_attention_heads": 16, "intermediate_size": 4096, "hidden_act": "gelu",
          "projection_dim": 512, "torch_dtype": "float32"})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kind, TextEncoderKind::kClip);
  EXPECT_EQ(c->activation, TextActivation::kGelu);
  EXPECT_EQ(c->vocab_size, 49408);  // CLIP's default
  EXPECT_EQ(c->max_positions, 77);
  EXPECT_EQ(c->layer_norm_eps, 1e-5);
  EXPECT_EQ(c->Describe(), "CLIP text, 23 layers, 1024 features, 16 heads");
  EXPECT_EQ(c->projection_dim, 0);  // a CLIPTextModel: projection_dim is not read
  EXPECT_EQ(c->eos_token_id, 49407);
  // SDXL's text_encoder_2 (eos_token_id 2, a legacy config's).
  c = TextEncoderConfig::FromJson(nlohmann::json::parse(
      R"({"model_type": "clip_text_model", "architectures": ["CLIPTextModelWithProjection"],
          "hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 20,
          "intermediate_size": 5120, "hidden_act": "gelu", "projection_dim": 1280,
          "eos_token_id": 2})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->projection_dim, 1280);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_EQ(c->Describe(), "CLIP text, 32 layers, 1280 features, 20 heads, projection to 1280");
  c = TextEncoderConfig::FromJson(nlohmann::json::parse(
      R"({"model_type": "clip", "text_config": {"hidden_size": 64, "num_attention_heads": 4}})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->activation, TextActivation::kQuickGelu);
  c = TextEncoderConfig::FromJson(nlohmann::json::parse(R"({"model_type": "bert"})"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->layer_norm_eps, 1e-12);
  EXPECT_EQ(c->max_positions, 512);
}

TEST(TextEncoderConfigTest, RefusesWhatItDoesNotImplementByName) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"model_type": "t5"})", "model_type: 't5' is not a text encoder"},
      {R"({"model_type": "bert", "hidden_act": "relu"})", "hidden_act: 'relu' is not supported"},
      {R"({"model_type": "bert", "position_embedding_type": "relative_key"})",
       "position_embedding_type: 'relative_key'"},
      {R"({"model_type": "bert", "is_decoder": true})", "is_decoder"},
      {R"({"model_type": "bert", "hidden_size": 10, "num_attention_heads": 3})",
       "hidden_size 10 is not a multiple of num_attention_heads 3"},
      {R"({"model_type": "clip"})", "without a text_config"},
      {R"({"model_type": "bert", "hidden_size": "big"})", "wrong type"},
      // A number past int's range (tests/fuzz/config_fuzz: undefined behaviour before).
      {R"({"model_type": "bert", "num_hidden_layers": 3e57})",
       "num_hidden_layers: 3e+57 is not an integer"},
  };
  for (const auto& [json, message] : cases) {
    Result<TextEncoderConfig> c = TextEncoderConfig::FromJson(nlohmann::json::parse(json));
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_THAT(c.status().message(), HasSubstr(message)) << json;
  }
}

TEST(TextEncoderLoadTest, ErrorsNameTheFileAndTheTensor) {
  TempDir dir("text_encoder_load");
  const auto path = [&](const char* name) {
    return (std::filesystem::path(dir.path()) / name).string();
  };
  EXPECT_THAT(TextEncoder::Load(path("nothing")).status().message(),
              HasSubstr("no such file or directory"));
  EXPECT_THAT(TextEncoder::Load(dir.path()).status().message(), HasSubstr("no model.safetensors"));
  // Weights without a config beside them; then a config, and weights lacking a tensor.
  const TextEncoderConfig c = Tiny(TextEncoderKind::kBert);
  const TextEncoder e = RandomEncoder(c, 5);
  io::SafetensorsWriter writer;
  const std::vector<float> zeros(e.tensors().total());
  for (const TensorSpec& t : e.tensors().tensors()) {
    if (t.name == "encoder.layer.1.output.dense.weight") continue;
    writer.AddF32(t.name, t.shape, zeros.data());
  }
  ASSERT_TRUE(writer.WriteAtomic(path("model.safetensors")).ok());
  EXPECT_THAT(TextEncoder::Load(dir.path()).status().message(),
              HasSubstr("cannot read its config"));
  std::ofstream(path("config.json"))
      << R"({"model_type": "bert", "vocab_size": 20, "hidden_size": 8, "intermediate_size": 12,
             "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 6})";
  EXPECT_THAT(TextEncoder::Load(dir.path()).status().message(),
              HasSubstr("encoder.layer.1.output.dense.weight"));
}

}  // namespace
}  // namespace difftrain
