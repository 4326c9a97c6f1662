// Checks difftrain's text encoders (model/text/encoder.h) against transformers 4.40.2:
// tests/reference/text_encoder.py builds small BERT and CLIP text models with random weights,
// saves them as transformers does, and computes their hidden states in float64; the C++
// model, loaded from those folders, must give them within fp32's rounding (relative L2 ≤ 1e-5;
// a wrong layer is off by far more). Then the real all-MiniLM-L6-v2 (the encoder of
// scripts/text_encoder.py) on captions its own tokenizer made into ids, and Stable Diffusion
// 1.x, 2.x and XL's prompt embeddings (XL's two encoders and its pooled embedding) as diffusers
// makes them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/data/text_table.h"
#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/text/encoder.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

struct EncoderCase {
  const char* name;
  const char* kind;    // bert | clip | clip_projection
  const char* config;  // BertConfig / CLIPTextConfig(**config)
  int seed;
  int length;
};

void PrintTo(const EncoderCase& c, std::ostream* os) {
  *os << c.name;
}

// fp32's rounding through these models measures 1–3e-7 (MiniLM 8e-7). The tanh GELU in place
// of the exact one is off by 2–3e-5 (the tiny BERT; 1e-4 the tiny CLIP, 1.2e-3 MiniLM),
// BERT's LayerNorm at eps 1e-5 instead of 1e-12 by 2.9e-5 (MiniLM 3.5e-4).
constexpr double kBound = 1e-5;

// The reference's token ids and masks as Tokens, one per text.
std::vector<text::Tokens> ReadTokens(const io::SafetensorsFile& file) {
  std::vector<int64_t> shape;
  const std::vector<float> ids = ReferenceTensor(file, "ids", &shape);
  const std::vector<float> mask = ReferenceTensor(file, "mask");
  std::vector<text::Tokens> texts(shape.empty() ? 0 : shape[0]);
  for (size_t n = 0; n < texts.size(); ++n) {
    for (int64_t l = 0; l < shape[1]; ++l) {
      texts[n].ids.push_back(static_cast<int32_t>(ids[n * shape[1] + l]));
      texts[n].mask.push_back(static_cast<uint8_t>(mask[n * shape[1] + l]));
    }
  }
  return texts;
}

class TextEncoderReferenceTest : public TransformersReference,
                                 public ::testing::WithParamInterface<EncoderCase> {};

TEST_P(TextEncoderReferenceTest, HiddenStatesAreTransformers) {
  const EncoderCase& c = GetParam();
  const CommandResult made =
      RunScript("text_encoder.py", fmt::format("make {} {} {} {} {}", ShellQuote(dir_.string()),
                                               c.kind, ShellQuote(c.config), c.seed, c.length));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Result<io::SafetensorsFile> expected =
      io::SafetensorsFile::Read((dir_ / "expected.safetensors").string());
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  const std::vector<text::Tokens> texts = ReadTokens(*expected);
  ASSERT_EQ(texts.size(), 3u);
  std::vector<float> first;
  for (const char* folder : {"model", "prefixed"}) {
    if (std::string(c.kind) != "bert" && std::string(folder) == "prefixed") continue;
    SCOPED_TRACE(folder);
    Result<TextEncoder> encoder = TextEncoder::Load((dir_ / folder).string());
    ASSERT_TRUE(encoder.ok()) << encoder.status().message();
    for (int skip : {0, 1}) {
      SCOPED_TRACE(fmt::format("skip_layers {}", skip));
      const std::vector<float> want = ReferenceTensor(*expected, fmt::format("out{}", skip));
      std::vector<float> got(want.size());
      ASSERT_TRUE(encoder->Encode(texts, skip, got.data()).ok());
      const double error = RelativeL2(got, want);
      EXPECT_LE(error, kBound);
      std::cout << c.name << " " << folder << " skip " << skip << ": relative L2 " << error << "\n";
      if (skip == 0 && first.empty()) first = got;
      if (skip == 0) {
        EXPECT_EQ(got, first) << "the prefixed names read other weights";
      }
    }
    // CLIPTextModelWithProjection's text_embeds, at end-of-text positions that the first
    // eos_token_id and the largest id (a legacy config's rule) tell apart.
    if (expected->Find("pooled") == nullptr) {
      EXPECT_EQ(encoder->projection_dim(), 0);
      continue;
    }
    const std::vector<float> want = ReferenceTensor(*expected, "pooled");
    ASSERT_EQ(want.size(), 3u * encoder->projection_dim());
    std::vector<float> got(want.size());
    ASSERT_TRUE(encoder->Pool(texts, got.data()).ok());
    const double error = RelativeL2(got, want);
    std::cout << c.name << " pooled: relative L2 " << error << "\n";
    EXPECT_LE(error, kBound);
    for (int n = 0; n < 3; ++n) {  // each text's own, not only all of them together
      const int P = encoder->projection_dim();
      const std::vector<float> row(got.begin() + n * P, got.begin() + (n + 1) * P);
      EXPECT_LE(RelativeL2(row, {want.begin() + n * P, want.begin() + (n + 1) * P}), kBound) << n;
    }
  }
}

// BERT (exact GELU, LayerNorm eps 1e-12); BERT with the tanh GELU and its eps changed; CLIP
// as OpenAI's (quick GELU); CLIP as OpenCLIP's, Stable Diffusion 2's (GELU).
INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, TextEncoderReferenceTest,
    ::testing::Values(EncoderCase{"Bert", "bert",
                                  R"({"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "intermediate_size": 24,
                        "max_position_embeddings": 12})",
                                  1, 10},
                      EncoderCase{"BertTanhGelu", "bert",
                                  R"({"vocab_size": 40, "hidden_size": 24, "num_hidden_layers": 3,
                        "num_attention_heads": 4, "intermediate_size": 20,
                        "max_position_embeddings": 9, "hidden_act": "gelu_new",
                        "layer_norm_eps": 1e-5, "type_vocab_size": 1})",
                                  2, 9},
                      EncoderCase{"ClipQuickGelu", "clip",
                                  R"({"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 3,
                        "num_attention_heads": 4, "intermediate_size": 24,
                        "max_position_embeddings": 12})",
                                  3, 12},
                      EncoderCase{"ClipGelu", "clip",
                                  R"({"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "intermediate_size": 48,
                        "max_position_embeddings": 8, "hidden_act": "gelu"})",
                                  4, 7},
                      EncoderCase{"ClipProjectionFirstEos", "clip_projection",
                                  R"({"vocab_size": 50, "hidden_size": 24, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "intermediate_size": 40, "hidden_act": "gelu",
                        "max_position_embeddings": 10, "projection_dim": 12,
                        "eos_token_id": 7})",
                                  5, 9},
                      EncoderCase{"ClipProjectionLegacyEos", "clip_projection",
                                  R"({"vocab_size": 50, "hidden_size": 24, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "intermediate_size": 40, "hidden_act": "gelu",
                        "max_position_embeddings": 10, "projection_dim": 12,
                        "eos_token_id": 2})",
                                  6, 9}),
    [](const ::testing::TestParamInfo<EncoderCase>& info) { return std::string(info.param.name); });

// The real all-MiniLM-L6-v2 (22.7 M parameters), on captions its tokenizer made into 16 ids.
class MiniLmReferenceTest : public TransformersReference {};

TEST_F(MiniLmReferenceTest, EmbedsCaptionsAsScriptsTextEncoder) {
  const std::string captions =
      R"(["a photo of a t-shirt", "a grayscale snapshot showing an ankle boot",
          "a small low-resolution photograph of a pair of trousers, taken outdoors on a sunny day"])";
  const CommandResult made =
      RunScript("text_encoder.py",
                fmt::format("minilm {} 16 {}", ShellQuote(dir_.string()), ShellQuote(captions)));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Result<io::SafetensorsFile> expected =
      io::SafetensorsFile::Read((dir_ / "expected.safetensors").string());
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  Result<TextEncoder> encoder = TextEncoder::Load((dir_ / "minilm").string());
  ASSERT_TRUE(encoder.ok()) << encoder.status().message();
  EXPECT_EQ(encoder->config().Describe(), "BERT, 6 layers, 384 features, 12 heads");
  const std::vector<float> want = ReferenceTensor(*expected, "out0");
  std::vector<float> got(want.size());
  ASSERT_TRUE(encoder->Encode(ReadTokens(*expected), 0, got.data()).ok());
  const double error = RelativeL2(got, want);
  std::cout << "all-MiniLM-L6-v2: relative L2 " << error << "\n";
  EXPECT_LE(error, kBound);
}

// Stable Diffusion's prompt embeddings end to end: a pipeline's tokenizer/ (CLIP's real
// vocabulary) and text_encoder/ (small, random), prompts embedded as diffusers'
// encode_prompt embeds them (77 ids, no mask; clip_skip 1), the empty prompt among them.
class StableDiffusionPromptTest : public TransformersReference,
                                  public ::testing::WithParamInterface<int> {};

TEST_P(StableDiffusionPromptTest, EmbedsPromptsAsDiffusers) {
  const std::vector<std::string> prompts = {
      "a photograph of an astronaut riding a horse", "", "Crème brûlée, 4K!! (trending on art)",
      "a long prompt that goes on and on " + std::string(400, 'x') + " until it is truncated"};
  const CommandResult made = RunScript(
      "text_encoder.py", fmt::format("sd {} {} {} 7", ShellQuote(dir_.string()), GetParam(),
                                     ShellQuote(nlohmann::json(prompts).dump())));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Result<io::SafetensorsFile> expected =
      io::SafetensorsFile::Read((dir_ / "expected.safetensors").string());
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  const std::vector<text::Tokens> want_tokens = ReadTokens(*expected);
  // The pipeline's folder, and its text_encoder/ alone (the tokenizer found beside it).
  for (const std::string folder : {"pipeline", "pipeline/text_encoder"}) {
    SCOPED_TRACE(folder);
    Result<TextEmbedder> embedder = TextEmbedder::Load((dir_ / folder).string());
    ASSERT_TRUE(embedder.ok()) << embedder.status().message();
    for (size_t k = 0; k < prompts.size(); ++k)
      EXPECT_EQ(embedder->tokenizer().Encode(prompts[k], 77).ids, want_tokens[k].ids) << k;
    for (int skip : {0, 1}) {
      Result<std::vector<float>> got = embedder->Embed(prompts, 77, skip);
      ASSERT_TRUE(got.ok()) << got.status().message();
      const double error = RelativeL2(*got, ReferenceTensor(*expected, fmt::format("out{}", skip)));
      std::cout << "SD " << GetParam() << " " << folder << " skip " << skip << ": relative L2 "
                << error << "\n";
      EXPECT_LE(error, kBound);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, StableDiffusionPromptTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return fmt::format("Sd{}", info.param);
                         });

// Stable Diffusion XL's prompt embeddings end to end: a pipeline's text_encoder/ (CLIP ViT-L's
// shape, small) with tokenizer/, and text_encoder_2/ (a CLIPTextModelWithProjection, OpenCLIP
// bigG's GELU) with tokenizer_2/ (padding with "!"), both with CLIP's real vocabulary; prompts
// embedded as diffusers' StableDiffusionXLPipeline.encode_prompt does: hidden_states[-2]
// (clip_skip 1: [-3]) of each, side by side, and text_encoder_2's text_embeds pooled.
class StableDiffusionXlPromptTest : public TransformersReference {
 protected:
  void SetUp() override {
    TransformersReference::SetUp();
    if (IsSkipped()) return;
    const CommandResult made =
        RunScript("text_encoder.py", fmt::format("sdxl {} {} 11", ShellQuote(dir_.string()),
                                                 ShellQuote(nlohmann::json(prompts_).dump())));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    Result<io::SafetensorsFile> expected =
        io::SafetensorsFile::Read((dir_ / "expected.safetensors").string());
    ASSERT_TRUE(expected.ok()) << expected.status().message();
    expected_.emplace(std::move(expected).value());
  }

  std::vector<int32_t> Ids(const char* name, size_t k) const {
    std::vector<int64_t> shape;
    const std::vector<float> ids = ReferenceTensor(*expected_, name, &shape);
    return {ids.begin() + k * shape[1], ids.begin() + (k + 1) * shape[1]};
  }

  // The empty prompt (pooled at position 1), "!" (tokenizer_2's pad token, cut out of the text),
  // a literal end-of-text token (pooled at the first), and one truncated at 77 (pooled at 76).
  const std::vector<std::string> prompts_ = {
      "a photograph of an astronaut riding a horse!!", "", "Crème brûlée <|endoftext|> 4K",
      "a long prompt that goes on and on " + std::string(400, 'x') + " until it is truncated"};
  std::optional<io::SafetensorsFile> expected_;
};

TEST_F(StableDiffusionXlPromptTest, EmbedsPromptsAndPooledAsDiffusers) {
  Result<TextEmbedder> embedder = TextEmbedder::Load((dir_ / "pipeline").string());
  ASSERT_TRUE(embedder.ok()) << embedder.status().message();
  ASSERT_NE(embedder->encoder_2(), nullptr);
  EXPECT_EQ(embedder->dim(), 32 + 48);
  EXPECT_EQ(embedder->pooled_dim(), 40);
  for (size_t k = 0; k < prompts_.size(); ++k) {
    EXPECT_EQ(embedder->tokenizer().Encode(prompts_[k], 77).ids, Ids("ids", k)) << k;
    EXPECT_EQ(embedder->tokenizer_2()->Encode(prompts_[k], 77).ids, Ids("ids2", k)) << k;
  }
  EXPECT_EQ(Ids("ids2", 1)[2], 0) << "tokenizer_2 pads with '!' (id 0)";
  const std::vector<float> want_pooled = ReferenceTensor(*expected_, "pooled");
  for (int skip : {0, 1}) {
    SCOPED_TRACE(fmt::format("clip_skip {}", skip));
    Result<TextEmbeddings> got = embedder->EmbedWithPooled(prompts_, 77, skip);
    ASSERT_TRUE(got.ok()) << got.status().message();
    const double error =
        RelativeL2(got->hidden, ReferenceTensor(*expected_, fmt::format("out{}", skip)));
    const double pooled_error = RelativeL2(got->pooled, want_pooled);
    std::cout << "SDXL clip_skip " << skip << ": relative L2 " << error << ", pooled "
              << pooled_error << "\n";
    EXPECT_LE(error, kBound);
    EXPECT_LE(pooled_error, kBound);
    // Each prompt's pooled embedding on its own: the end-of-text position is each one's.
    for (size_t k = 0; k < prompts_.size(); ++k) {
      const std::vector<float> got_k(got->pooled.begin() + k * 40,
                                     got->pooled.begin() + (k + 1) * 40);
      EXPECT_LE(
          RelativeL2(got_k, {want_pooled.begin() + k * 40, want_pooled.begin() + (k + 1) * 40}),
          kBound)
          << k;
    }
    Result<std::vector<float>> hidden = embedder->Embed(prompts_, 77, skip);
    ASSERT_TRUE(hidden.ok()) << hidden.status().message();
    EXPECT_EQ(*hidden, got->hidden);
  }
  // The text table carries the pooled embeddings, through its file too.
  Result<TextTable> table = embedder->EmbedTable(prompts_, 77, 0);
  ASSERT_TRUE(table.ok()) << table.status().message();
  EXPECT_EQ(table->dim, 80);
  EXPECT_EQ(table->pooled_dim, 40);
  EXPECT_LE(RelativeL2(table->pooled, want_pooled), kBound);
  const std::string file = (dir_ / "texts.safetensors").string();
  ASSERT_TRUE(WriteTextTable(*table, file).ok());
  Result<TextTable> read = ReadTextTable(file);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->pooled, table->pooled);
  EXPECT_EQ(read->embeddings, table->embeddings);
}

// text_encoder_2/ alone: the tokenizer beside it is ../tokenizer_2, and its own Pool (the last
// hidden state's end-of-text row) is the pipeline's pooled embedding.
TEST_F(StableDiffusionXlPromptTest, TextEncoder2AlonePoolsAsThePipeline) {
  Result<TextEmbedder> embedder =
      TextEmbedder::Load((dir_ / "pipeline" / "text_encoder_2").string());
  ASSERT_TRUE(embedder.ok()) << embedder.status().message();
  EXPECT_EQ(embedder->encoder_2(), nullptr);
  EXPECT_EQ(embedder->dim(), 48);
  EXPECT_EQ(embedder->pooled_dim(), 40);
  std::vector<text::Tokens> tokens;
  for (size_t k = 0; k < prompts_.size(); ++k) {
    tokens.push_back(embedder->tokenizer().Encode(prompts_[k], 77));
    EXPECT_EQ(tokens.back().ids, Ids("ids2", k)) << k;
  }
  std::vector<float> pooled(prompts_.size() * 40);
  ASSERT_TRUE(embedder->encoder().Pool(tokens, pooled.data()).ok());
  EXPECT_LE(RelativeL2(pooled, ReferenceTensor(*expected_, "pooled")), kBound);
}

TEST_F(StableDiffusionXlPromptTest, RefusesWhatItDoesNotSupport) {
  Result<TextEmbedder> embedder = TextEmbedder::Load((dir_ / "pipeline").string());
  ASSERT_TRUE(embedder.ok()) << embedder.status().message();
  // 3 and 4 layers: hidden_states[-(s + 2)] for s up to 1.
  EXPECT_TRUE(embedder->Embed({"x"}, 77, 1).ok());
  EXPECT_THAT(embedder->Embed({"x"}, 77, 2).status().message(),
              ::testing::HasSubstr("skip_layers 2 is outside 0 to 1"));
  EXPECT_THAT(
      embedder->LoadTextualInversion((dir_ / "expected.safetensors").string(), "<x>").message(),
      ::testing::HasSubstr("SDXL's pair"));
  // The single encoder without a projection has no pooled output.
  Result<TextEmbedder> single = TextEmbedder::Load((dir_ / "pipeline" / "text_encoder").string());
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ(single->pooled_dim(), 0);
  Result<TextEmbeddings> got = single->EmbedWithPooled({"x"}, 77, 0);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(got->pooled.empty());
  std::vector<float> out(40);
  EXPECT_THAT(single->encoder().Pool({single->tokenizer().Encode("x", 77)}, out.data()).message(),
              ::testing::HasSubstr("no text_projection"));
}

}  // namespace
}  // namespace difftrain::testing
