// A table of text embeddings: K texts (captions), each embedded as [L, D] floats, the input a
// text-conditional model (the UNet's cross-attention) takes for a text (docs/formats.md):
//
//   FILE.safetensors   "embeddings" F32 [K, L, D]
//                      metadata "format": "difftrain-text", "version": "1",
//                               "encoder": how the embeddings were made (free text),
//                               "captions": JSON list of the K texts,
//                               ["labels": JSON list of K integers, the class a text names,]
//                               ["held_out": JSON list of K booleans, texts kept out of
//                                training (paraphrases to test a model on)]
//                               ["text_encoder": JSON {"path", "skip_layers"}: the text
//                                encoder difftrain embedded them with (data embed --encoder)]
//                      ["pooled" F32 [K, P]: each text's pooled embedding, the projected
//                       end-of-text state SDXL's UNet adds to its time embedding
//                       (addition_embed_type text_time, docs/unet.md)]
//
// Data carry a text as its row in the table, so a data set whose samples share a few
// captions stores each embedding once. Texts are embedded once, when the table is made: by
// a real text encoder (difftrain's own, model/text/embedder.h; scripts/text_encoder.py,
// MiniLM) or by the token table below.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace difftrain {

inline constexpr std::string_view kTextTableFormat = "difftrain-text";

struct TextTable {
  int length = 0;  // L: tokens per text
  int dim = 0;     // D: features per token
  std::string encoder;
  std::vector<std::string> captions;  // K
  std::vector<int> labels;            // K, or empty: the texts name no classes
  std::vector<bool> held_out;         // K, or empty: every text is for training
  std::vector<float> embeddings;      // [K, L, D]
  int pooled_dim = 0;                 // P; 0: the table has no pooled embeddings
  std::vector<float> pooled;          // [K, P]
  // The text encoder difftrain made the embeddings with (data embed --encoder), so that new
  // texts can be embedded as these were: its path ("" when another encoder made them) and
  // the layers it skipped.
  std::string text_encoder;
  int skip_layers = 0;

  int64_t size() const { return static_cast<int64_t>(captions.size()); }
  size_t text_floats() const { return size_t(length) * dim; }
  const float* embedding(int64_t k) const { return embeddings.data() + k * text_floats(); }
  const float* pooled_embedding(int64_t k) const { return pooled.data() + k * pooled_dim; }
  bool is_held_out(int64_t k) const { return !held_out.empty() && held_out[k]; }
  // The row whose caption is `caption` exactly.
  std::optional<int64_t> Find(std::string_view caption) const;
  // Sizes agree (K captions, labels and flags; K·L·D embeddings; K·P pooled) and L, D are
  // positive.
  Status Validate() const;
};

// Errors name the file and the field that is wrong.
Result<TextTable> ReadTextTable(const std::string& path);
Status WriteTextTable(const TextTable& table, const std::string& path);

// The fixed token table, the encoder used where no real one can be had: a caption is
// lower-cased and split into words (runs of letters, digits, '-' and '\''); word i (i < L)
// becomes e(word) + p(i), where e(word) is D values N(0, 1/D) drawn from the 64-bit FNV-1a
// hash of the word (so a word means the same in every caption and every table) and p(i) is
// the sinusoidal position code of the Transformer, [sin(i·ω_j), cos(i·ω_j)] with
// ω_j = 10000^(−2j/D), scaled by 1/√D; positions after the last word are zero. Words after the
// L-th are dropped. A caption with no words is refused, as its embedding would be the
// unconditional one.
Result<TextTable> EmbedWithTokenTable(const std::vector<std::string>& captions, int length,
                                      int dim);

}  // namespace difftrain
