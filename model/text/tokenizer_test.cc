// The tokenizers (model/text/tokenizer.h) on small hand-made vocabularies: WordPiece's greedy
// longest match and its unknown words, CLIP's BPE merge order and "</w>", truncation, padding,
// the folders LoadTokenizer accepts and what it refuses. tests/tokenizer_reference_test.cc
// checks the real vocabularies against transformers.
#include "model/text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/text/clip_bpe.h"
#include "model/text/text_testing.h"
#include "model/text/unicode.h"
#include "model/text/wordpiece.h"

namespace difftrain::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

void Write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// The message of what `f` throws as E ("" when it throws nothing).
template <typename E, typename F>
std::string Thrown(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// A BERT tokenizer.json as `tokenizers` writes it, on a tiny vocabulary.
json WordPieceJson() {
  return difftrain::testing::WordPieceTokenizerJson(
      {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "##a", "a", "hello",
       ",", "!", "日", "##af", "cafe"},
      /*max_input_chars_per_word=*/9);
}

class WordPieceTest : public ::testing::Test {
 protected:
  std::unique_ptr<WordPieceTokenizer> Load(const json& file) {
    Write(dir_ / "tokenizer.json", file.dump());
    return WordPieceTokenizer::Load(dir_ / "tokenizer.json");
  }
  TempDir temp_{"tokenizer_test"};
  fs::path dir_ = temp_.path();
};

TEST_F(WordPieceTest, TakesTheLongestPieceFirst) {
  const auto tok = Load(WordPieceJson());
  // "##aff" before "##af" and "##a"; then "##able".
  EXPECT_EQ(tok->PieceIds("unaffable"), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(tok->PieceIds("aaaaa"), (std::vector<int32_t>{9, 8, 8, 8, 8}));
  // Lowercased, accents stripped, punctuation its own word, CJK ideographs split.
  EXPECT_EQ(tok->PieceIds("Hello, UNAFFÄBLE!"), (std::vector<int32_t>{10, 11, 5, 6, 7, 12}));
  EXPECT_EQ(tok->PieceIds("Café\t日日"), (std::vector<int32_t>{15, 13, 13}));
  EXPECT_EQ(tok->vocab_size(), 16);
}

TEST_F(WordPieceTest, UnknownWordsAreOneUnk) {
  const auto tok = Load(WordPieceJson());
  EXPECT_EQ(tok->PieceIds("xyz"), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->PieceIds("unxaff hello"), (std::vector<int32_t>{1, 10}));  // not un + [UNK]
  // Ten characters: over max_input_chars_per_word (9), though "a" + "##a"… would cover them.
  EXPECT_EQ(tok->PieceIds("aaaaaaaaaa"), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->PieceIds("aaaaaaaaa").size(), 9u);
  EXPECT_EQ(tok->PieceIds("本"), (std::vector<int32_t>{1}));
}

TEST_F(WordPieceTest, SpecialTokensInTheTextAreThemselves) {
  const auto tok = Load(WordPieceJson());
  EXPECT_EQ(tok->PieceIds("a[MASK]a [CLS]"), (std::vector<int32_t>{9, 4, 9, 2}));
  // Not lowercased first: "[mask]" is punctuation and an unknown word.
  EXPECT_EQ(tok->PieceIds("[mask]"), (std::vector<int32_t>{1, 1, 1}));
}

TEST_F(WordPieceTest, TruncatesAndPads) {
  const auto tok = Load(WordPieceJson());
  Tokens t = tok->Encode("hello", 6);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{2, 10, 3, 0, 0, 0}));
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
  t = tok->Encode("unaffable hello", 4);  // [CLS] and [SEP] stay
  EXPECT_EQ(t.ids, (std::vector<int32_t>{2, 5, 6, 3}));
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{1, 1, 1, 1}));
  t = tok->Encode("", 2);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("a", 1); }), HasSubstr("1"));
}

TEST_F(WordPieceTest, RefusesInvalidUtf8NamingTheOffset) {
  const auto tok = Load(WordPieceJson());
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("ab\xC3(", 8); }),
              HasSubstr("byte offset 3"));  // 0xC3 then '(' which continues nothing
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("abc\xE2\x82", 8); }),
              HasSubstr("byte offset 3"));  // ends inside a character
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("a\xED\xA0\x80", 8); }),
              HasSubstr("byte offset 1"));  // a surrogate
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("ok \xC0\xAF", 8); }),
              HasSubstr("byte offset 3"));  // overlong '/'
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->Encode("\x80", 8); }),
              HasSubstr("byte offset 0"));
}

TEST_F(WordPieceTest, RefusesOtherKindsNamingFileAndKey) {
  json file = WordPieceJson();
  file["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  std::string error = Thrown<std::runtime_error>([&] { Load(file); });
  EXPECT_THAT(error, HasSubstr("normalizer.type is \"Sequence\""));
  EXPECT_THAT(error, HasSubstr((dir_ / "tokenizer.json").string()));

  file = WordPieceJson();
  file["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }),
              HasSubstr("pre_tokenizer.type is \"Whitespace\""));
  file = WordPieceJson();
  file["model"]["type"] = "Unigram";
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }),
              HasSubstr("model.type is \"Unigram\""));
  file = WordPieceJson();
  file["post_processor"] = nullptr;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }),
              HasSubstr("post_processor.type is null"));
  file = WordPieceJson();
  file["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }), HasSubstr("model.unk_token"));
  Write(dir_ / "tokenizer.json", "{not json");
  EXPECT_THAT(
      Thrown<std::runtime_error>([&] { WordPieceTokenizer::Load(dir_ / "tokenizer.json"); }),
      HasSubstr("is not JSON"));
}

// Ids index the text encoder's embedding table, which is checked against vocab_size() alone:
// an id a file gives outside [0, kMaxTokenId] is refused naming it (tokenizer_fuzz found a
// negative one accepted and encoded), and those of the post-processor and the padding count
// toward vocab_size().
TEST_F(WordPieceTest, RefusesIdsOutsideTheTableAndCountsTheSpecialOnes) {
  json file = WordPieceJson();
  file["model"]["vocab"]["hello"] = -1;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }),
              HasSubstr("the id of model.vocab[\"hello\"] is -1, not an integer in [0, 16777215]"));
  file = WordPieceJson();
  file["model"]["vocab"]["hello"] = 2.5;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }), HasSubstr("is 2.5, not an integer"));
  file = WordPieceJson();
  file["padding"]["pad_id"] = uint64_t{1} << 40;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }), HasSubstr("padding.pad_id"));
  file = WordPieceJson();
  file["added_tokens"][0]["id"] = -3;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }), HasSubstr("added token \"[PAD]\""));
  file = WordPieceJson();
  file["post_processor"]["special_tokens"]["[SEP]"]["ids"][0] = 40;
  auto tok = Load(file);
  EXPECT_EQ(tok->vocab_size(), 41);
  EXPECT_EQ(tok->Encode("hello", 4).ids, (std::vector<int32_t>{2, 10, 40, 0}));
  file["post_processor"]["special_tokens"]["[SEP]"]["ids"][0] = -40;
  EXPECT_THAT(Thrown<std::runtime_error>([&] { Load(file); }),
              HasSubstr("post_processor.special_tokens[\"[SEP]\"] is -40"));
}

// A CLIP tokenizer folder: merges ranked l o, lo w</w>, e r</w>, lo w, n e.
void WriteClip(const fs::path& folder) {
  const std::vector<std::string> vocab = {"!",
                                          "!</w>",
                                          "'",
                                          "e",
                                          "l",
                                          "n",
                                          "o",
                                          "r",
                                          "s</w>",
                                          "w",
                                          "w</w>",
                                          "lo",
                                          "low</w>",
                                          "er</w>",
                                          "low",
                                          "ne",
                                          "n</w>",
                                          "'s</w>",
                                          "'s",
                                          "i",
                                          "t</w>",
                                          "it</w>",
                                          "<|startoftext|>",
                                          "<|endoftext|>"};
  json v = json::object();
  for (size_t i = 0; i < vocab.size(); ++i)
    v[vocab[i]] = i;
  Write(folder / "vocab.json", v.dump());
  Write(folder / "merges.txt",
        "#version: 0.2\nl o\nlo w</w>\ne r</w>\nlo w\nn e\ni t</w>\n' s</w>\n");
}

class ClipBpeTest : public ::testing::Test {
 protected:
  TempDir temp_{"tokenizer_test"};
  fs::path dir_ = temp_.path();
};

TEST_F(ClipBpeTest, MergesLowestRankFirst) {
  WriteClip(dir_);
  const auto tok = ClipBpeTokenizer::Load(dir_);
  EXPECT_EQ(tok->Bpe("low"), (std::vector<std::string>{"low</w>"}));
  EXPECT_EQ(tok->Bpe("lower"), (std::vector<std::string>{"low", "er</w>"}));
  // (e, r</w>) ranks before (n, e): not "ne" + "r</w>".
  EXPECT_EQ(tok->Bpe("ner"), (std::vector<std::string>{"n", "er</w>"}));
  EXPECT_EQ(tok->Bpe("w"), (std::vector<std::string>{"w</w>"}));
  EXPECT_EQ(tok->Bpe("ow"), (std::vector<std::string>{"o", "w</w>"}));
  // Words: lowercased, contractions and punctuation apart; ids, unknown symbols as unk.
  EXPECT_EQ(tok->Words("Low!  It's"), (std::vector<std::string>{"low", "!", "it", "'s"}));
  EXPECT_EQ(tok->PieceIds("Low! It's"), (std::vector<int32_t>{12, 1, 21, 17}));
  EXPECT_EQ(tok->PieceIds("nx"), (std::vector<int32_t>{5, 23}));  // "x</w>" is unknown
  EXPECT_EQ(tok->vocab_size(), 24);
}

TEST_F(ClipBpeTest, TruncatesAndPadsWithTheConfiguredToken) {
  WriteClip(dir_ / "sd1");
  auto tok = ClipBpeTokenizer::Load(dir_ / "sd1");
  Tokens t = tok->Encode("low lower", 6);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{22, 12, 14, 13, 23, 23}));
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  t = tok->Encode("low low low", 4);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{22, 12, 12, 23}));
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{1, 1, 1, 1}));
  // The special tokens in the text are themselves.
  EXPECT_EQ(tok->PieceIds("low<|endoftext|>low"), (std::vector<int32_t>{12, 23, 12}));

  // SD 2.x: pad_token "!", which is then a special token in the text too.
  WriteClip(dir_ / "sd2");
  Write(dir_ / "sd2" / "tokenizer_config.json", R"({"pad_token": {"content": "<|endoftext|>"}})");
  Write(dir_ / "sd2" / "special_tokens_map.json", R"({"pad_token": "!"})");
  tok = ClipBpeTokenizer::Load(dir_ / "sd2");
  t = tok->Encode("low!", 6);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{22, 12, 0, 23, 0, 0}));
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0}));

  WriteClip(dir_ / "config");
  Write(dir_ / "config" / "tokenizer_config.json", R"({"pad_token": {"content": "!"}})");
  EXPECT_EQ(ClipBpeTokenizer::Load(dir_ / "config")->pad_id(), 0);
}

TEST_F(ClipBpeTest, RefusesIdsOutsideTheTable) {
  WriteClip(dir_);
  json vocab = json::parse(R"({"low</w>": 0, "!": -1})");
  Write(dir_ / "vocab.json", vocab.dump());
  const std::string error = Thrown<std::runtime_error>([&] { ClipBpeTokenizer::Load(dir_); });
  EXPECT_THAT(error, HasSubstr("the id of \"!\" is -1, not an integer in [0, 16777215]"));
  EXPECT_THAT(error, HasSubstr((dir_ / "vocab.json").string()));
  Write(dir_ / "vocab.json", R"({"low</w>": 16777216})");
  EXPECT_THAT(Thrown<std::runtime_error>([&] { ClipBpeTokenizer::Load(dir_); }),
              HasSubstr("is 16777216"));
  Write(dir_ / "vocab.json", R"({"low</w>": 16777215})");
  EXPECT_EQ(ClipBpeTokenizer::Load(dir_)->vocab_size(), 16777216);
}

// Textual inversion's tokens: the next ids, cut out of the text as special tokens (the longest
// where one begins another); a token the vocabulary or the added tokens have is refused.
TEST_F(ClipBpeTest, AddedTokensTakeTheNextIds) {
  WriteClip(dir_);
  auto tok = ClipBpeTokenizer::Load(dir_);
  EXPECT_EQ(tok->AddTokens({"<x>", "<x>_1"}), (std::vector<int32_t>{24, 25}));
  EXPECT_EQ(tok->vocab_size(), 26);
  EXPECT_EQ(tok->PieceIds("low <x>_1 <x>low"), (std::vector<int32_t>{12, 25, 24, 12}));
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->AddTokens({"<x>"}); }),
              HasSubstr("the token '<x>' is already in"));
  EXPECT_THAT(Thrown<std::invalid_argument>([&] { tok->AddTokens({"low</w>"}); }),
              HasSubstr("the token 'low</w>' is already in"));
  EXPECT_THROW(tok->AddTokens({""}), std::invalid_argument);
  EXPECT_EQ(tok->vocab_size(), 26);
}

TEST(LoadTokenizerTest, DispatchesOnTheFolder) {
  TempDir temp("tokenizer_test");
  const fs::path dir = temp.path();
  Write(dir / "bert" / "tokenizer.json", WordPieceJson().dump());
  EXPECT_NE(dynamic_cast<WordPieceTokenizer*>(LoadTokenizer(dir / "bert").get()), nullptr);
  WriteClip(dir / "clip");
  EXPECT_NE(dynamic_cast<ClipBpeTokenizer*>(LoadTokenizer(dir / "clip").get()), nullptr);
  WriteClip(dir / "pipeline" / "tokenizer");
  Write(dir / "pipeline" / "model_index.json", "{}");
  EXPECT_NE(dynamic_cast<ClipBpeTokenizer*>(LoadTokenizer(dir / "pipeline").get()), nullptr);

  fs::create_directories(dir / "empty");
  const std::string error = Thrown<std::runtime_error>([&] { LoadTokenizer(dir / "empty"); });
  EXPECT_THAT(error, HasSubstr("has no tokenizer.json"));
  EXPECT_THAT(error, HasSubstr("vocab.json and merges.txt"));
  EXPECT_THAT(Thrown<std::runtime_error>([&] { LoadTokenizer(dir / "missing"); }),
              HasSubstr("not a folder"));
  json bpe = WordPieceJson();
  bpe["model"] = {{"type", "BPE"}, {"vocab", json::object()}, {"merges", json::array()}};
  Write(dir / "bpe" / "tokenizer.json", bpe.dump());
  EXPECT_THAT(Thrown<std::runtime_error>([&] { LoadTokenizer(dir / "bpe"); }),
              HasSubstr("model.type is \"BPE\", not WordPiece"));
  Write(dir / "halfclip" / "vocab.json", "{}");
  EXPECT_THAT(Thrown<std::runtime_error>([&] { LoadTokenizer(dir / "halfclip"); }),
              HasSubstr("has no tokenizer.json"));
}

TEST(UnicodeTest, HelpersAsPythonAndRust) {
  EXPECT_EQ(DecodeUtf8("aé日😀"), (std::u32string{U'a', U'é', U'日', U'😀'}));
  EXPECT_EQ(EncodeUtf8(U"aé日😀"), "aé日😀");
  EXPECT_EQ(EncodeUtf8(Nfd(U"é")), "e\u0301");
  EXPECT_EQ(EncodeUtf8(Nfc(U"e\u0301")), "é");
  EXPECT_EQ(EncodeUtf8(ToLower(U"ΟΔΟΣ ΣΑ İ")), "οδος σα i\u0307");  // final sigma
  std::u32string lower;
  AppendLower(U'Σ', &lower);
  EXPECT_EQ(lower, U"σ");
  EXPECT_EQ(CategoryAsOf(0x1FAE8, kUnicode14), U_UNASSIGNED);  // new in Unicode 15.0
  EXPECT_EQ(CategoryAsOf(0x1FAE8, 1500), U_OTHER_SYMBOL);
  EXPECT_EQ(CategoryAsOf(0x1885, kUnicode8), U_OTHER_LETTER);  // Mn since 9.0
  EXPECT_TRUE(IsBertChineseChar(0x4E00));
  EXPECT_FALSE(IsBertChineseChar(0x3042));  // hiragana
  EXPECT_TRUE(IsPythonSpace(0x2028));
  EXPECT_FALSE(IsPythonSpace(0x200B));
}

}  // namespace
}  // namespace difftrain::text
