#include "model/text/embedder.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "model/io/ldm_checkpoint.h"
#include "model/text/clip_bpe.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// Texts encoded at once: [64, 77, 768] floats of activations per buffer at most.
constexpr size_t kChunk = 64;

// Where the tokenizer of the encoder at `path` (its config.json `config`) is (see
// TextEmbedder::Load): a pipeline's text_encoder_2/ has its own in ../tokenizer_2.
fs::path TokenizerFolder(const std::string& path, const std::string& config) {
  const fs::path encoder_dir = fs::path(config).parent_path();
  const std::string sibling =
      encoder_dir.filename() == "text_encoder_2" ? "tokenizer_2" : "tokenizer";
  std::error_code ec;
  const auto has_tokenizer = [&](const fs::path& dir) {
    return fs::is_regular_file(dir / "tokenizer.json", ec) ||
           fs::is_regular_file(dir / "vocab.json", ec);
  };
  for (const fs::path& dir :
       {encoder_dir, fs::path(path) / "tokenizer", encoder_dir.parent_path() / sibling}) {
    if (has_tokenizer(dir)) return dir;
  }
  return encoder_dir;  // LoadTokenizer says what it lacks
}

// The encoder at `path` and its tokenizer (TextEmbedder::Load of one encoder).
Result<std::pair<TextEncoder, std::shared_ptr<const text::Tokenizer>>> LoadEncoderAndTokenizer(
    const std::string& path, const io::SafetensorsFile* weights, size_t part) {
  DT_ASSIGN_OR_RETURN(TextEncoder encoder, TextEncoder::Load(path, weights, part));
  const fs::path folder = TokenizerFolder(path, encoder.config_source());
  std::shared_ptr<const text::Tokenizer> tokenizer;
  try {
    tokenizer = text::LoadTokenizer(folder);
  } catch (const std::exception& e) {
    return Errorf("text encoder '{}': its tokenizer: {}", path, e.what());
  }
  if (tokenizer->vocab_size() > encoder.config().vocab_size) {
    return Errorf(
        "text encoder '{}': its tokenizer ({}) has {} ids, the encoder's vocab_size only {}", path,
        folder.string(), tokenizer->vocab_size(), encoder.config().vocab_size);
  }
  return std::pair(std::move(encoder), std::move(tokenizer));
}

}  // namespace

TextEmbedder::TextEmbedder(TextEncoder encoder, std::shared_ptr<const text::Tokenizer> tokenizer,
                           std::string path)
    : path_(std::move(path)) {
  parts_.push_back({std::move(encoder), std::move(tokenizer)});
}

TextEmbedder::TextEmbedder(std::vector<Part> parts, std::string path)
    : parts_(std::move(parts)), path_(std::move(path)) {}

Result<TextEmbedder> TextEmbedder::Load(const std::string& path,
                                        const io::SafetensorsFile* weights) {
  std::vector<Part> parts;
  std::error_code ec;
  const fs::path second = fs::path(path) / "text_encoder_2";
  // SDXL's refiner, encoded as SDXL encodes: a pipeline of text_encoder_2/ alone, or the
  // original file's one text model with the config and tokenizer of the folder's
  // text_encoder_2/ (a refiner's or a base's pipeline), else of the folder itself.
  const bool refiner_file = weights != nullptr && io::IsSdxlRefinerCheckpoint(*weights);
  if (refiner_file || (weights == nullptr && fs::is_directory(second, ec) &&
                       !fs::is_directory(fs::path(path) / "text_encoder", ec))) {
    const std::string from = fs::is_directory(second, ec) ? second.string() : path;
    DT_ASSIGN_OR_RETURN(auto only, LoadEncoderAndTokenizer(from, weights, 0));
    if (only.first.config().kind != TextEncoderKind::kClip)
      return Errorf("text encoder '{}': text_encoder_2/ must be a CLIP text model", path);
    parts.push_back({std::move(only.first), std::move(only.second)});
    TextEmbedder embedder(std::move(parts), path);
    embedder.sdxl_ = true;
    return embedder;
  }
  DT_ASSIGN_OR_RETURN(auto first, LoadEncoderAndTokenizer(path, weights, 0));
  parts.push_back({std::move(first.first), std::move(first.second)});
  if (weights != nullptr && io::LdmTextModels(*weights).size() > 1 &&
      !fs::is_directory(second, ec)) {
    return Errorf(
        "text encoder '{}': '{}' holds SDXL's two text models, which take the configs and "
        "tokenizers of an SDXL pipeline's folder (text_encoder/ and text_encoder_2/)",
        path, weights->path());
  }
  if (fs::is_directory(second, ec)) {
    DT_ASSIGN_OR_RETURN(auto part, LoadEncoderAndTokenizer(second.string(), weights, 1));
    if (parts[0].encoder.config().kind != TextEncoderKind::kClip ||
        part.first.config().kind != TextEncoderKind::kClip) {
      return Errorf("text encoder '{}': text_encoder/ and text_encoder_2/ must be CLIP text models",
                    path);
    }
    parts.push_back({std::move(part.first), std::move(part.second)});
  }
  TextEmbedder embedder(std::move(parts), path);
  embedder.sdxl_ = embedder.dual();
  return embedder;
}

int TextEmbedder::dim() const {
  int D = 0;
  for (const Part& p : parts_)
    D += p.encoder.config().hidden_size;
  return D;
}

Status TextEmbedder::LoadTextualInversion(const std::string& file, const std::string& token) {
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile read, io::SafetensorsFile::Read(file));
  const std::vector<std::string> names = read.Names();
  // The tensor each encoder takes: the file's one, or SDXL's clip_l and clip_g.
  std::vector<std::string> tensors = names;
  if (dual()) {
    if (read.Find("clip_l") == nullptr || read.Find("clip_g") == nullptr) {
      return Errorf(
          "textual inversion '{}': the text encoder '{}' is SDXL's pair (text_encoder and "
          "text_encoder_2), whose embeddings hold a clip_l and a clip_g tensor; it holds {}",
          file, path_, fmt::join(names, ", "));
    }
    if (token.empty()) {
      return Errorf("textual inversion '{}': an SDXL embedding names no token: give one", file);
    }
    tensors = {"clip_l", "clip_g"};
  } else if (sdxl_) {
    // The refiner's text_encoder_2 takes an SDXL embedding's clip_g.
    if (read.Find("clip_g") == nullptr || token.empty()) {
      return Errorf(
          "textual inversion '{}': the text encoder '{}' is SDXL's refiner's (text_encoder_2 "
          "alone), which takes an SDXL embedding's clip_g tensor and a token; it holds {}",
          file, path_, fmt::join(names, ", "));
    }
    tensors = {"clip_g"};
  } else if (names.size() != 1) {
    return Errorf(
        "textual inversion '{}': holds {} tensors; an embedding file holds one ([D] or [n, D]: "
        "diffusers' learned_embeds, A1111's emb_params)",
        file, names.size());
  }
  // Each encoder's n vectors, n the same for all.
  int n = 0;
  std::vector<std::vector<float>> rows;
  for (size_t p = 0; p < tensors.size(); ++p) {
    const std::vector<int64_t> shape = read.Find(tensors[p])->shape;
    const int64_t D = parts_[p].encoder.config().hidden_size;
    if (shape.empty() || shape.size() > 2 || shape.back() != D || shape.front() < 1) {
      return Errorf(
          "textual inversion '{}': tensor '{}' is [{}], and the text encoder '{}' embeds tokens "
          "of {} ([{}] or [n, {}])",
          file, tensors[p], fmt::join(shape, ", "), path_, D, D, D);
    }
    const int vectors = shape.size() == 2 ? static_cast<int>(shape[0]) : 1;
    if (p > 0 && vectors != n) {
      return Errorf("textual inversion '{}': '{}' holds {} vectors and '{}' {}", file, tensors[0],
                    n, tensors[p], vectors);
    }
    n = vectors;
    DT_RETURN_IF_ERROR(read.CopyAsF32(tensors[p], shape, rows.emplace_back(n * D).data()));
  }
  const std::string name = token.empty() ? names[0] : token;
  return AddTextualInversion(name, n, rows)
      .status()
      .WithContext(fmt::format("textual inversion '{}'", file));
}

Result<std::vector<int32_t>> TextEmbedder::AddTextualInversion(
    const std::string& name, int n, const std::vector<std::vector<float>>& rows) {
  DT_CHECK(rows.size() == parts_.size(), "{} encoders' vectors for {} encoders", rows.size(),
           parts_.size());
  std::vector<std::string> tokens = {name};
  for (int i = 1; i < n; ++i)
    tokens.push_back(fmt::format("{}_{}", name, i));
  // Every tokenizer takes the tokens before any encoder changes, as diffusers adds them to each.
  std::vector<std::shared_ptr<text::ClipBpeTokenizer>> grown;
  std::vector<std::vector<int32_t>> ids;
  for (const Part& part : parts_) {
    const auto* clip = dynamic_cast<const text::ClipBpeTokenizer*>(part.tokenizer.get());
    if (!clip) return Errorf("the text encoder '{}' has no CLIP tokenizer", path_);
    try {
      grown.push_back(std::make_shared<text::ClipBpeTokenizer>(*clip));
      ids.push_back(grown.back()->AddTokens(tokens));
    } catch (const std::invalid_argument& e) {
      return Status::Error(e.what());
    }
  }
  for (size_t p = 0; p < parts_.size(); ++p) {
    DT_RETURN_IF_ERROR(
        parts_[p].encoder.SetTokenEmbeddings(grown[p]->vocab_size(), ids[p], rows[p].data()));
    parts_[p].tokenizer = std::move(grown[p]);
  }
  inversions_.emplace_back(name, n);
  inversion_ids_.push_back(ids[0][0]);
  return ids[0];
}

std::string TextEmbedder::SpellInversions(std::string text) const {
  const auto* clip = dynamic_cast<const text::ClipBpeTokenizer*>(parts_[0].tokenizer.get());
  if (!clip || inversions_.empty()) return text;
  const std::vector<int32_t> pieces = clip->PieceIds(text);
  for (size_t k = 0; k < inversions_.size(); ++k) {
    const auto& [token, n] = inversions_[k];
    if (n < 2 || std::find(pieces.begin(), pieces.end(), inversion_ids_[k]) == pieces.end())
      continue;
    std::string spelled = token;
    for (int i = 1; i < n; ++i)
      spelled += fmt::format(" {}_{}", token, i);
    std::string out;
    size_t from = 0;
    for (size_t at = text.find(token); at != std::string::npos; at = text.find(token, from)) {
      out += text.substr(from, at - from) + spelled;
      from = at + token.size();
    }
    text = out + text.substr(from);
  }
  return text;
}

Result<std::vector<float>> TextEmbedder::Embed(const std::vector<std::string>& texts, int length,
                                               int skip_layers) const {
  DT_ASSIGN_OR_RETURN(TextEmbeddings out, Run(texts, length, skip_layers, false));
  return std::move(out.hidden);
}

Result<TextEmbeddings> TextEmbedder::EmbedWithPooled(const std::vector<std::string>& texts,
                                                     int length, int skip_layers) const {
  return Run(texts, length, skip_layers, pooled_dim() > 0);
}

Result<TextEmbeddings> TextEmbedder::Run(const std::vector<std::string>& texts, int length,
                                         int skip_layers, bool pooled) const {
  for (const Part& p : parts_) {
    const int max = p.encoder.config().max_positions;
    if (length < 2 || length > max) {
      return Errorf("text encoder '{}': texts of {} tokens; it takes 2 to {}", path_, length, max);
    }
  }
  // SDXL indexes hidden_states from the penultimate layer's, without the final LayerNorm.
  const int skip = sdxl_ ? skip_layers + 1 : skip_layers;
  if (sdxl_) {
    int layers = parts_[0].encoder.config().num_layers;
    for (const Part& p : parts_)
      layers = std::min(layers, p.encoder.config().num_layers);
    if (skip_layers < 0 || skip >= layers) {
      return Errorf(
          "text encoder '{}': SDXL's encoders take hidden_states[-(skip_layers + 2)]; skip_layers "
          "{} is outside 0 to {}",
          path_, skip_layers, layers - 2);
    }
  }
  const int D = dim(), P = pooled ? pooled_dim() : 0;
  TextEmbeddings out;
  out.hidden.resize(texts.size() * length * D);
  out.pooled.resize(texts.size() * P);
  std::vector<float> part_hidden;
  for (size_t first = 0; first < texts.size(); first += kChunk) {
    const size_t count = std::min(kChunk, texts.size() - first);
    // Each encoder's [count, L, D_i] beside the others', from column `column` on.
    int column = 0;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      std::vector<text::Tokens> tokens;
      for (size_t k = first; k < first + count; ++k) {
        try {
          tokens.push_back(p.tokenizer->Encode(SpellInversions(texts[k]), length));
        } catch (const std::exception& e) {
          return Errorf("text {} ('{}'): {}", k, texts[k], e.what());
        }
      }
      const int Di = p.encoder.config().hidden_size;
      float* hidden = out.hidden.data() + first * length * D;
      if (parts_.size() > 1) {
        part_hidden.resize(count * length * Di);
        hidden = part_hidden.data();
      }
      const bool last = i + 1 == parts_.size();
      DT_RETURN_IF_ERROR(p.encoder.Encode(tokens, skip, hidden, !sdxl_,
                                          last && P > 0 ? out.pooled.data() + first * P : nullptr));
      if (parts_.size() > 1) {
        for (size_t row = 0; row < count * length; ++row)
          std::copy_n(part_hidden.data() + row * Di, Di,
                      out.hidden.data() + (first * length + row) * D + column);
      }
      column += Di;
    }
  }
  return out;
}

Result<TextTable> TextEmbedder::EmbedTable(const std::vector<std::string>& captions, int length,
                                           int skip_layers) const {
  TextTable table;
  table.length = length;
  table.dim = dim();
  table.captions = captions;
  DT_ASSIGN_OR_RETURN(TextEmbeddings embedded, EmbedWithPooled(captions, length, skip_layers));
  table.embeddings = std::move(embedded.hidden);
  if (pooled_dim() > 0) {
    table.pooled_dim = pooled_dim();
    table.pooled = std::move(embedded.pooled);
  }
  std::vector<std::string> encoders;
  for (const Part& p : parts_)
    encoders.push_back(fmt::format("{} ({})", p.encoder.config().Describe(), p.encoder.source()));
  std::string skipped;
  if (sdxl_) {
    skipped = fmt::format(", hidden_states[-{}] without the final LayerNorm", skip_layers + 2);
  } else if (skip_layers > 0) {
    skipped = fmt::format(", last {} layers skipped", skip_layers);
  }
  table.encoder =
      fmt::format("{}{}, L {}, D {}{}", fmt::join(encoders, " + "), skipped, length, dim(),
                  pooled_dim() > 0 ? fmt::format(", pooled P {}", pooled_dim()) : std::string());
  table.text_encoder = fs::absolute(path_).lexically_normal().string();
  table.skip_layers = skip_layers;
  return table;
}

}  // namespace difftrain
