// CLIP's byte-level BPE tokenizer (Stable Diffusion's text encoders), loaded from a tokenizer
// folder (vocab.json, merges.txt, optional special_tokens_map.json / tokenizer_config.json)
// and equal to transformers' slow CLIPTokenizer (4.40) without ftfy, as diffusers' pipelines
// call it: tok(texts, padding="max_length", max_length=L, truncation=True).
//   1. The special tokens (bos <|startoftext|>, eos and unk <|endoftext|>, the pad token) are
//      cut out of the text where they appear literally (case-sensitive, leftmost-longest):
//      with SD 2.x's pad token "!", every "!" of a prompt is the id of "!" (0), not of "!</w>",
//      as transformers makes it.
//   2. The rest goes through BERT's BasicTokenizer(strip_accents=False, do_split_on_punc=False):
//      control characters (categories C*) dropped, whitespace made ' ', spaces around CJK
//      ideographs, NFC, words split at whitespace and lowercased (str.lower()), joined by ' '.
//   3. The pattern <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|
//      [^\s\p{L}\p{N}]+ (IGNORECASE) cuts that into words.
//   4. Each word's UTF-8 bytes become GPT-2's printable byte characters (bytes_to_unicode), the
//      last one with "</w>", merged pairwise, lowest merges.txt rank first, until no ranked pair
//      is left; each symbol is its vocab.json id (unk's where it has none).
//   5. The pieces cut to length − 2, between bos and eos, padded with the pad token: SD 1.x's
//      "<|endoftext|>", SD 2.x's "!" (pad_token of special_tokens_map.json, which wins over
//      tokenizer_config.json's, a string or {"content": …}; default <|endoftext|>).
// merges.txt is read as transformers reads it: its first line (the "#version" header) is
// skipped, and at most 49152 − 256 − 2 merges are used.
// Python 3.11's categories are Unicode 14.0's: characters assigned later are unassigned (Cn,
// so dropped) here too (model/text/unicode.h). The `regex` module's IGNORECASE matches neither
// letter nor symbol at U+0345 (which folds to ι), so that character is passed over, as there.
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

class ClipBpeTokenizer : public Tokenizer {
 public:
  // Reads `folder`/vocab.json and merges.txt, and the optional special_tokens_map.json and
  // tokenizer_config.json. Missing or malformed files throw std::runtime_error naming them.
  static std::unique_ptr<ClipBpeTokenizer> Load(const std::filesystem::path& folder);

  Tokens Encode(std::string_view text, int length) const override;
  int vocab_size() const override { return vocab_size_; }

  // The steps of Encode, for tests: the pieces' ids (no bos/eos, no truncation); the words
  // of step 3 (UTF-8, before the byte mapping) of a text without special tokens; the BPE
  // symbols of one word (byte characters, "</w>" on the last).
  std::vector<int32_t> PieceIds(std::string_view text) const;
  std::vector<std::string> Words(std::string_view text) const;
  std::vector<std::string> Bpe(std::string_view word) const;

  // Textual inversion's new tokens (transformers' add_tokens): cut out of texts as the special
  // tokens are (step 1), with the next ids, vocab_size() on, which grows by their number; their
  // ids. Throws std::invalid_argument for an empty token, or one the vocabulary or the added
  // tokens hold already (which diffusers' load_textual_inversion refuses too).
  std::vector<int32_t> AddTokens(const std::vector<std::string>& tokens);

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }

 private:
  ClipBpeTokenizer() = default;

  std::vector<std::u32string> WordChars(std::u32string_view text) const;
  std::vector<std::string> BpeBytes(const std::string& encoded) const;
  int32_t Id(const std::string& symbol) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int> ranks_;  // "first second" → merge rank
  std::string byte_chars_[256];                 // bytes_to_unicode, as UTF-8
  struct Special {
    std::u32string content;
    int32_t id;
  };
  std::vector<Special> specials_;  // bos, eos, unk, pad (cut out of the text)
  int32_t bos_id_ = 0, eos_id_ = 0, unk_id_ = 0, pad_id_ = 0;
  int vocab_size_ = 0;
};

}  // namespace difftrain::text
