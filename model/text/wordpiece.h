// BERT's WordPiece tokenizer (all-MiniLM-L6-v2's), loaded from a Hugging Face `tokenizers`
// tokenizer.json and equal to transformers' fast tokenizer (tokenizers 0.19) called as
// tok(texts, padding="max_length", max_length=L, truncation=True):
//   1. the added tokens (added_tokens: "[CLS]", "[MASK]", …) are cut out of the raw text
//      where they appear literally (leftmost, then longest; lstrip/rstrip eat whitespace);
//   2. BertNormalizer: control characters dropped and whitespace made ' ' (clean_text), spaces
//      around CJK ideographs (handle_chinese_chars), NFD without nonspacing marks
//      (strip_accents; null follows lowercase), each character lowercased (lowercase);
//   3. BertPreTokenizer: words split at whitespace, each punctuation character its own word;
//   4. WordPiece: each word greedily as the longest vocabulary entry from its start, then
//      continuing_subword_prefix + the longest from there; a word that cannot be covered, or
//      longer than max_input_chars_per_word characters, is unk_token;
//   5. the pieces cut to length − 2, the post-processor's start and end tokens around them
//      ([CLS] $A [SEP]), padded with the pad token.
// `tokenizers` takes its character categories from the `unicode_categories` crate (Unicode
// 8.0): so does this class (model/text/unicode.h), which makes it equal on every code point
// (tests/tokenizer_reference_test.cc checks each one's normalization and pre-tokenization).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/text/tokenizer.h"

namespace difftrain::text {

class WordPieceTokenizer : public Tokenizer {
 public:
  // Reads `tokenizer_json`. A file that cannot be read or parsed, or whose normalizer,
  // pre_tokenizer, model or post_processor is not the kind above, throws std::runtime_error
  // naming the file and the key.
  static std::unique_ptr<WordPieceTokenizer> Load(const std::filesystem::path& tokenizer_json);

  Tokens Encode(std::string_view text, int length) const override;
  int vocab_size() const override { return vocab_size_; }

  // The steps of Encode, for tests: the pieces' ids (no start/end token, no truncation); the
  // normalizer's output; the pre-tokenizer's words of a normalized text.
  std::vector<int32_t> PieceIds(std::string_view text) const;
  std::string Normalize(std::string_view text) const;
  std::vector<std::string> PreTokenize(std::string_view normalized) const;

  struct AddedToken {
    std::u32string content;
    int32_t id = 0;
    bool normalized = false;  // matched in the normalized text rather than the raw one
    bool lstrip = false;
    bool rstrip = false;
  };

 private:
  WordPieceTokenizer() = default;

  std::u32string NormalizeChars(std::u32string_view text) const;
  void PreTokenizeChars(std::u32string_view normalized, std::vector<std::u32string>* words) const;
  void AppendWord(std::u32string_view word, std::vector<int32_t>* ids) const;
  void AppendNormalized(std::u32string_view text, std::vector<int32_t>* ids) const;

  // BertNormalizer's settings.
  bool clean_text_ = true;
  bool handle_chinese_chars_ = true;
  bool strip_accents_ = true;
  bool lowercase_ = true;
  // WordPiece's.
  std::unordered_map<std::string, int32_t> vocab_;
  int32_t unk_id_ = 0;
  std::string prefix_ = "##";
  int max_input_chars_per_word_ = 100;
  std::vector<AddedToken> added_;
  int32_t start_id_ = 0, end_id_ = 0, pad_id_ = 0;
  int vocab_size_ = 0;
};

}  // namespace difftrain::text
