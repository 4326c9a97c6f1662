// Checks difftrain's text encoders (model/text/encoder.h) against transformers 4.40.2:
// tests/reference/text_encoder.py builds small BERT and CLIP text models with random weights,
// saves them as transformers does, and computes their hidden states in float64; the C++
// model, loaded from those folders, must give them within fp32's rounding (relative L2 ≤ 1e-5;
// a wrong layer is off by far more). Then the real all-MiniLM-L6-v2 (the encoder of
// scripts/text_encoder.py) on captions its own tokenizer made into ids.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/text/encoder.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

struct EncoderCase {
  const char* name;
  const char* kind;    // bert | clip
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
    if (std::string(c.kind) == "clip" && std::string(folder) == "prefixed") continue;
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
                                  4, 7}),
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

}  // namespace
}  // namespace difftrain::testing
