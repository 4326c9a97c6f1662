// A text encoder with its tokenizer: texts → the [L, D] embeddings a text-conditional model
// takes, as a text table holds them (model/data/text_table.h). `difftrain data embed --encoder`
// makes tables with it, and `difftrain sample` embeds prompts with it (docs/text-encoders.md).
// Stable Diffusion XL's pipeline has two: text_encoder (CLIP ViT-L) and text_encoder_2
// (OpenCLIP bigG, with a projection), each with its tokenizer; a text's embedding is both
// encoders' hidden states side by side, and its pooled embedding text_encoder_2's projected
// end-of-text state, as diffusers' StableDiffusionXLPipeline.encode_prompt makes them.
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

// [K, L, D] hidden states and, for an encoder with a pooled output (SDXL's), [K, P] pooled ones.
struct TextEmbeddings {
  std::vector<float> hidden;
  std::vector<float> pooled;
};

class TextEmbedder {
 public:
  // The encoder at `path` (TextEncoder::Load) and its tokenizer: in the same folder
  // (all-MiniLM-L6-v2's), in tokenizer/ of a diffusers pipeline's folder, or in ../tokenizer of
  // an encoder folder that is a pipeline's text_encoder/ (Stable Diffusion's; ../tokenizer_2 of
  // a text_encoder_2/). With `weights`, the encoder's weights from that file
  // (TextEncoder::Load). A pipeline's folder with text_encoder_2/ beside text_encoder/ (SDXL's)
  // loads both, each with its tokenizer (tokenizer/, tokenizer_2/), and with `weights` the
  // file's two text models (an original SDXL checkpoint's), which one encoder's folder does not
  // take. A pipeline's folder with text_encoder_2/ and no text_encoder/ (SDXL's refiner) loads
  // that one, encoded as SDXL encodes (its hidden states and pooled output).
  static Result<TextEmbedder> Load(const std::string& path,
                                   const io::SafetensorsFile* weights = nullptr);
  TextEmbedder(TextEncoder encoder, std::shared_ptr<const text::Tokenizer> tokenizer,
               std::string path);

  // The first encoder (SDXL's text_encoder) and its tokenizer.
  const TextEncoder& encoder() const { return parts_[0].encoder; }
  TextEncoder& encoder() { return parts_[0].encoder; }
  const text::Tokenizer& tokenizer() const { return *parts_[0].tokenizer; }
  // SDXL's text_encoder_2 and tokenizer_2; nullptr for a single encoder.
  const TextEncoder* encoder_2() const { return dual() ? &parts_[1].encoder : nullptr; }
  TextEncoder* encoder_2() { return dual() ? &parts_[1].encoder : nullptr; }
  const text::Tokenizer* tokenizer_2() const {
    return dual() ? parts_[1].tokenizer.get() : nullptr;
  }
  const std::string& path() const { return path_; }
  // D: the encoder's width; SDXL's the sum of both (768 + 1280).
  int dim() const;
  // P: the width of the last encoder's projection (SDXL's text_encoder_2; a
  // CLIPTextModelWithProjection loaded alone has one too); 0 when the embedder has no pooled
  // output.
  int pooled_dim() const { return parts_.back().encoder.projection_dim(); }

  // Textual inversion, as diffusers' load_textual_inversion: the safetensors `file` holds one
  // tensor, an embedding [D] or several [n, D] (diffusers' learned_embeds.safetensors names it
  // by its token; A1111's embeddings name it emb_params); it becomes the token `token` (empty:
  // the tensor's name), and n > 1 the tokens token, token_1, …, token_{n−1}, appended to the
  // tokenizer and the encoder's token embeddings. SDXL's pair of encoders takes a file of two
  // tensors, clip_l [n, 768] for text_encoder and clip_g [n, 1280] for text_encoder_2 (the form
  // SDXL embeddings ship in, which diffusers loads into each encoder with its tokenizer), and a
  // `token`. Errors name the file: not one tensor (SDXL: no clip_l and clip_g, or no token), D
  // not the encoder's width, n not the same in both, a token a tokenizer has, a tokenizer other
  // than CLIP's.
  Status LoadTextualInversion(const std::string& file, const std::string& token);
  // The same for vectors in memory: the tokens `token`, token_1, …, token_{n−1} with `rows`,
  // one [n, D] per encoder (SDXL's two). Returns their ids in the first encoder's tokenizer
  // (consecutive). Errors: a token a tokenizer has, a tokenizer other than CLIP's.
  Result<std::vector<int32_t>> AddTextualInversion(const std::string& token, int n,
                                                   const std::vector<std::vector<float>>& rows);
  // The tokens textual inversion added, with their vectors' count.
  const std::vector<std::pair<std::string, int>>& inversions() const { return inversions_; }
  // `text` with every multi-vector token the tokenizer cuts out of it spelled out in full ("<x>"
  // → "<x> <x>_1 <x>_2", every occurrence), as diffusers' maybe_convert_prompt; Embed does it.
  std::string SpellInversions(std::string text) const;

  // texts (UTF-8) → [K, length, D]: each (with its inversions spelled) tokenized to `length`
  // ids (start, pieces, end, padding) and encoded (TextEncoder::Encode with skip_layers). SDXL's
  // pair: each encoder's tokens (its own tokenizer's) encoded to hidden_states[-(skip_layers +
  // 2)] without the final LayerNorm (diffusers' clip_skip = skip_layers), text_encoder's D₁
  // features then text_encoder_2's D₂ per token. Errors name the text.
  Result<std::vector<float>> Embed(const std::vector<std::string>& texts, int length,
                                   int skip_layers) const;
  // Embed's hidden states and, where pooled_dim() > 0, the pooled ones [K, P]
  // (TextEncoder::Pool of the last encoder), from one pass of each encoder.
  Result<TextEmbeddings> EmbedWithPooled(const std::vector<std::string>& texts, int length,
                                         int skip_layers) const;

  // A text table of `captions` (no labels, no held-out flags) that records this encoder; with
  // the pooled embeddings where pooled_dim() > 0.
  Result<TextTable> EmbedTable(const std::vector<std::string>& captions, int length,
                               int skip_layers) const;

 private:
  struct Part {
    TextEncoder encoder;
    std::shared_ptr<const text::Tokenizer> tokenizer;
  };
  TextEmbedder(std::vector<Part> parts, std::string path);
  bool dual() const { return parts_.size() > 1; }
  Result<TextEmbeddings> Run(const std::vector<std::string>& texts, int length, int skip_layers,
                             bool pooled) const;

  std::vector<Part> parts_;  // one encoder, or SDXL's text_encoder and text_encoder_2
  // Encoded as SDXL's pipelines encode: hidden_states[-(skip_layers + 2)] without the final
  // LayerNorm (SDXL's pair, and its refiner's text_encoder_2 alone).
  bool sdxl_ = false;
  std::string path_;
  std::vector<std::pair<std::string, int>> inversions_;
  std::vector<int32_t> inversion_ids_;  // the first id of each
};

}  // namespace difftrain
