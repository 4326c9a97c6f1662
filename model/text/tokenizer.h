// Text → token ids, as the tokenizers that ship with text encoders make them (Hugging Face's
// `transformers`/`tokenizers`): a text becomes the model's start token, its pieces and its end
// token, truncated or padded to a fixed length, with a mask of the real (non-padding) tokens.
//
// Two kinds are implemented, each loaded from the files a model folder ships:
//   - WordPiece (BERT, MiniLM): tokenizer.json (model/text/wordpiece.h);
//   - CLIP's byte-level BPE (Stable Diffusion's text encoders): vocab.json + merges.txt
//     (model/text/clip_bpe.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace difftrain::text {

struct Tokens {
  std::vector<int32_t> ids;   // [length]: start, pieces, end, then padding
  std::vector<uint8_t> mask;  // [length]: 1 for start, pieces and end; 0 for padding
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `text` (UTF-8) as `length` ids (length >= 2): the start token, as many of its pieces as
  // fit in length − 2, the end token, then the padding token. Invalid UTF-8 throws
  // std::invalid_argument naming the byte offset.
  virtual Tokens Encode(std::string_view text, int length) const = 0;

  // The number of ids (the embedding table's rows the ids index).
  virtual int vocab_size() const = 0;
};

// `pieces` framed as Tokenizer::Encode returns them: start, as many pieces as fit in
// length − 2, end, then pad to `length` (>= 2; fewer throws std::invalid_argument).
Tokens FrameTokens(std::vector<int32_t> pieces, int length, int32_t start, int32_t end,
                   int32_t pad);

// Throws std::runtime_error("tokenizer FILE: WHAT"): what a tokenizer's file holds that is not
// supported, or lacks.
[[noreturn]] void TokenizerFileError(const std::filesystem::path& file, const std::string& what);

// The largest id a tokenizer's file may give (the text encoders' tables have up to ~250,000
// rows); ids index an embedding table, so every one is checked when the file is read.
inline constexpr int32_t kMaxTokenId = (1 << 24) - 1;
// `id` (of `what`, in `file`) as a token id: an integer in [0, kMaxTokenId], else
// TokenizerFileError.
int32_t TokenId(const nlohmann::json& id, const std::filesystem::path& file,
                const std::string& what);

// The tokenizer of a model folder: WordPiece where its tokenizer.json's model is WordPiece,
// CLIP's BPE where it has vocab.json and merges.txt; a diffusers pipeline folder's tokenizer/
// folder likewise. Throws std::runtime_error saying what the folder lacks, or what a file
// holds that is not supported.
std::unique_ptr<Tokenizer> LoadTokenizer(const std::filesystem::path& folder);

}  // namespace difftrain::text
