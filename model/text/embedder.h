// A text encoder with its tokenizer: texts → the [L, D] embeddings a text-conditional model
// takes, as a text table holds them (model/data/text_table.h). `difftrain data embed --encoder`
// makes tables with it, and `difftrain sample` embeds prompts with it (docs/text-encoders.md).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/data/text_table.h"
#include "model/text/encoder.h"
#include "model/text/tokenizer.h"

namespace difftrain {

class TextEmbedder {
 public:
  // The encoder at `path` (TextEncoder::Load) and its tokenizer: in the same folder
  // (all-MiniLM-L6-v2's), in tokenizer/ of a diffusers pipeline's folder, or in ../tokenizer of
  // an encoder folder that is a pipeline's text_encoder/ (Stable Diffusion's). With `weights`,
  // the encoder's weights from that file (TextEncoder::Load).
  static Result<TextEmbedder> Load(const std::string& path,
                                   const io::SafetensorsFile* weights = nullptr);
  TextEmbedder(TextEncoder encoder, std::shared_ptr<const text::Tokenizer> tokenizer,
               std::string path);

  const TextEncoder& encoder() const { return encoder_; }
  TextEncoder& encoder() { return encoder_; }
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& path() const { return path_; }
  int dim() const { return encoder_.config().hidden_size; }

  // Textual inversion, as diffusers' load_textual_inversion: the safetensors `file` holds one
  // tensor, an embedding [D] or several [n, D] (diffusers' learned_embeds.safetensors names it
  // by its token; A1111's embeddings name it emb_params); it becomes the token `token` (empty:
  // the tensor's name), and n > 1 the tokens token, token_1, …, token_{n−1}, appended to the
  // tokenizer and the encoder's token embeddings. Errors name the file: not one tensor, D not
  // the encoder's width, a token the tokenizer has, a tokenizer other than CLIP's.
  Status LoadTextualInversion(const std::string& file, const std::string& token);
  // The tokens textual inversion added, with their vectors' count.
  const std::vector<std::pair<std::string, int>>& inversions() const { return inversions_; }
  // `text` with every multi-vector token the tokenizer cuts out of it spelled out in full ("<x>"
  // → "<x> <x>_1 <x>_2", every occurrence), as diffusers' maybe_convert_prompt; Embed does it.
  std::string SpellInversions(std::string text) const;

  // texts (UTF-8) → [K, length, D]: each (with its inversions spelled) tokenized to `length`
  // ids (start, pieces, end, padding) and encoded (TextEncoder::Encode with skip_layers). Errors
  // name the text.
  Result<std::vector<float>> Embed(const std::vector<std::string>& texts, int length,
                                   int skip_layers) const;

  // A text table of `captions` (no labels, no held-out flags) that records this encoder.
  Result<TextTable> EmbedTable(const std::vector<std::string>& captions, int length,
                               int skip_layers) const;

 private:
  TextEncoder encoder_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  std::string path_;
  std::vector<std::pair<std::string, int>> inversions_;
  std::vector<int32_t> inversion_ids_;  // the first id of each
};

}  // namespace difftrain
