// Checks difftrain's tokenizers (model/text/tokenizer.h) against transformers 4.40.2
// (tests/reference/tokenizer_reference.py): all-MiniLM-L6-v2's WordPiece tokenizer (the package's
// own tokenizer.json, against the fast AutoTokenizer) and CLIP's BPE (open_clip's vocabulary as
// Stable Diffusion's tokenizer/ folder, padded as SD 1.x and SD 2.x, against the slow
// CLIPTokenizer without ftfy). Every id and mask of texts of many kinds, at lengths that
// truncate and that pad, must be equal; so must every code point's normalization and
// pre-tokenization.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/text/clip_bpe.h"
#include "model/text/tokenizer.h"
#include "model/text/unicode.h"
#include "model/text/wordpiece.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

using nlohmann::json;

std::string LongWord() {
  std::string word;
  for (int i = 0; i < 12; ++i)
    word += "antidisest";  // 120 characters: over max_input_chars_per_word (100)
  return word;
}

std::string LongText() {
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += fmt::format("a photo number {} of a sneaker, an ankle boot and a bag; ", i);
  return text;
}

const std::vector<std::string> kTexts = {
    // Fashion-MNIST-like captions.
    "a photo of a t-shirt", "A photo of a Trouser.", "an ankle boot",
    "pullover, dress, coat, sandal, shirt, sneaker, bag", "a black-and-white photo of a sneaker",
    // Punctuation and contractions.
    "don't", "it's", "they'll", "I'd've", "we're you've I'm", "DON'T STOP", "rock'n'roll", "hello!",
    "wow!!! really?!", "(parens) [brackets] {braces} <angles>", "e-mail@example.com",
    "quotes \"double\" 'single' `back`", "ſ's it'ſ 'S",
    // Numbers.
    "1234", "3.14", "$19.99 for 2", "1,000,000 and 12345678901234567890", "½ ² Ⅻ ①",
    // Accents and case.
    "Crème Brûlée", "ÜBER", "naïve café", "e\u0301 combining acute", "İstanbul", "ǅ title",
    "ﬁne ligature", "Ａｂｃ fullwidth",
    // German, Greek (final sigma), Cyrillic, CJK, Korean.
    "Straße ẞ", "ΑΒΓ Σίσυφος ΟΔΟΣ σοφός", "Привет, мир! ЁЖ", "日本語のテキスト", "中文字符，标点。",
    "한국어 텍스트", "ไทย العربية עברית",
    // Emoji, the zero-width joiner, other format and control characters.
    "emoji 😀👍🏽 ❤️", "family 👨‍👩‍👧", "zero\u200Dwidth\u200Bspace",
    "\uFEFFbyte order mark", "tabs\tand\nnewlines\r\n  multiple   spaces",
    "bell\x07 start\x01 del\x7F end",
    "nbsp\u00A0thin\u2009ideographic\u3000line\u2028para\u2029end", "private \uE000 use",
    "unassigned \u0378 and U+1FAE8 \U0001FAE8 (Unicode 15)", "replacement \uFFFD char",
    // Special tokens, literally.
    "[CLS] hello [SEP] [MASK]", "a[MASK]b", "[cls] lower [Mask]", "[UNK] [PAD]", "<|endoftext|>",
    "<|startoftext|>hi<|endoftext|>", "!<|ENDOFTEXT|>", "a <|endoftext|>b", "<|ſtartoftext|>",
    // Empty, blank, long.
    "", "   ", "\t\n", LongWord(), "a " + LongWord() + " b", LongText()};

constexpr int kLengths[] = {5, 16, 77};

class TokenizerReferenceTest : public TransformersReference {};

TEST_F(TokenizerReferenceTest, EncodesTextsAsTransformers) {
  {
    std::ofstream texts(dir_ / "texts.json");
    texts << json(kTexts).dump();
  }
  std::string lengths;
  for (int length : kLengths)
    lengths += fmt::format(" {}", length);
  const CommandResult made = RunScript(
      "tokenizer_reference.py", fmt::format("texts {} {}{}", ShellQuote(dir_.string()),
                                            ShellQuote((dir_ / "texts.json").string()), lengths));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::ifstream in(dir_ / "expected.json");
  const json expected = json::parse(in);

  for (const char* name : {"minilm", "clip", "clip_sd2"}) {
    SCOPED_TRACE(name);
    const std::unique_ptr<text::Tokenizer> tok = text::LoadTokenizer(dir_ / name);
    EXPECT_EQ(tok->vocab_size(), std::string(name) == "minilm" ? 30522 : 49408);
    for (int length : kLengths) {
      const json& want = expected.at(name).at(std::to_string(length));
      for (size_t i = 0; i < kTexts.size(); ++i) {
        SCOPED_TRACE(fmt::format("length {}, text {}: \"{}\"", length, i, kTexts[i]));
        const text::Tokens got = tok->Encode(kTexts[i], length);
        EXPECT_EQ(got.ids, want.at("input_ids").at(i).get<std::vector<int32_t>>());
        EXPECT_EQ(got.mask, want.at("attention_mask").at(i).get<std::vector<uint8_t>>());
      }
    }
  }
}

// "<count><class>"... → one class per code point (surrogates left out).
std::string RunLengthDecode(const std::string& encoded) {
  std::string out;
  for (size_t i = 0; i < encoded.size();) {
    size_t digits = 0;
    const size_t count = std::stoul(encoded.substr(i), &digits);
    out.append(count, encoded[i + digits]);
    i += digits + 1;
  }
  return out;
}

TEST_F(TokenizerReferenceTest, TreatsEveryCodePointAsTransformers) {
  const CommandResult made =
      RunScript("tokenizer_reference.py", fmt::format("codepoints {}", ShellQuote(dir_.string())));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::ifstream in(dir_ / "codepoints.json");
  const json expected = json::parse(in);
  const std::unique_ptr<text::WordPieceTokenizer> bert =
      text::WordPieceTokenizer::Load(dir_ / "minilm" / "tokenizer.json");
  const std::unique_ptr<text::ClipBpeTokenizer> clip = text::ClipBpeTokenizer::Load(dir_ / "clip");

  std::vector<bool> removed(0x110000);
  for (const json& range : expected.at("bert_removed")) {
    for (uint32_t c = range[0].get<uint32_t>(); c <= range[1].get<uint32_t>(); ++c)
      removed[c] = true;
  }
  std::map<uint32_t, std::string> normalized;
  for (const auto& [c, text] : expected.at("bert_normalized").items())
    normalized[std::stoul(c)] = text.get<std::string>();
  const std::string split = RunLengthDecode(expected.at("bert_split"));
  const std::string clip_class = RunLengthDecode(expected.at("clip_class"));
  const json& clip_words = expected.at("clip_words");
  ASSERT_EQ(split.size(), 0x110000u - 0x800u);
  ASSERT_EQ(clip_class.size(), split.size());

  int normalize_bad = 0, split_bad = 0, clip_bad = 0;
  for (uint32_t c = 0, k = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    const std::string s = text::EncodeUtf8(std::u32string(1, c));
    const std::string want = removed[c] ? "" : normalized.contains(c) ? normalized[c] : s;
    if (bert->Normalize(s) != want && ++normalize_bad <= 20) {
      ADD_FAILURE() << fmt::format("U+{:04X}: BertNormalizer \"{}\", difftrain \"{}\"", c, want,
                                   bert->Normalize(s));
    }
    const std::vector<std::string> words = bert->PreTokenize("a" + s + "b");
    const char got_split = words == std::vector<std::string>{"a", "b"}      ? 'w'
                           : words == std::vector<std::string>{"a", s, "b"} ? 'p'
                                                                            : '-';
    if (got_split != split[k] && ++split_bad <= 20) {
      ADD_FAILURE() << fmt::format("U+{:04X}: BertPreTokenizer '{}', difftrain '{}'", c, split[k],
                                   got_split);
    }
    const std::vector<std::string> clip_got = clip->Words("a" + s + "!");
    using W = std::vector<std::string>;
    const char got_class = clip_got == W{"a" + s, "!"}   ? 'L'
                           : clip_got == W{"a", s, "!"}  ? 'N'
                           : clip_got == W{"a", s + "!"} ? 'P'
                           : clip_got == W{"a", "!"}     ? 'X'
                                                         : '?';
    const bool clip_ok =
        got_class == clip_class[k] &&
        (got_class != '?' || clip_words.at(std::to_string(c)).get<W>() == clip_got);
    if (!clip_ok && ++clip_bad <= 20) {
      ADD_FAILURE() << fmt::format(
          "U+{:04X}: CLIPTokenizer '{}' {}, difftrain '{}' [{}]", c, clip_class[k],
          clip_class[k] == '?' ? clip_words.at(std::to_string(c)).dump() : "", got_class,
          fmt::join(clip_got, "|"));
    }
    ++k;
  }
  EXPECT_EQ(normalize_bad, 0);
  EXPECT_EQ(split_bad, 0);
  EXPECT_EQ(clip_bad, 0);
}

}  // namespace
}  // namespace difftrain::testing
