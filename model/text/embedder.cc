#include "model/text/embedder.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/text/clip_bpe.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// Texts encoded at once: [64, 77, 768] floats of activations per buffer at most.
constexpr size_t kChunk = 64;

// Where the tokenizer of the encoder at `path` (its config.json `config`) is (see
// TextEmbedder::Load).
fs::path TokenizerFolder(const std::string& path, const std::string& config) {
  const fs::path encoder_dir = fs::path(config).parent_path();
  std::error_code ec;
  const auto has_tokenizer = [&](const fs::path& dir) {
    return fs::is_regular_file(dir / "tokenizer.json", ec) ||
           fs::is_regular_file(dir / "vocab.json", ec);
  };
  for (const fs::path& dir :
       {encoder_dir, fs::path(path) / "tokenizer", encoder_dir.parent_path() / "tokenizer"}) {
    if (has_tokenizer(dir)) return dir;
  }
  return encoder_dir;  // LoadTokenizer says what it lacks
}

}  // namespace

TextEmbedder::TextEmbedder(TextEncoder encoder, std::shared_ptr<const text::Tokenizer> tokenizer,
                           std::string path)
    : encoder_(std::move(encoder)), tokenizer_(std::move(tokenizer)), path_(std::move(path)) {}

Result<TextEmbedder> TextEmbedder::Load(const std::string& path,
                                        const io::SafetensorsFile* weights) {
  DT_ASSIGN_OR_RETURN(TextEncoder encoder, TextEncoder::Load(path, weights));
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
  return TextEmbedder(std::move(encoder), std::move(tokenizer), path);
}

Status TextEmbedder::LoadTextualInversion(const std::string& file, const std::string& token) {
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile read, io::SafetensorsFile::Read(file));
  const std::vector<std::string> names = read.Names();
  if (names.size() != 1) {
    return Errorf(
        "textual inversion '{}': holds {} tensors; an embedding file holds one ([D] or [n, D]: "
        "diffusers' learned_embeds, A1111's emb_params)",
        file, names.size());
  }
  const std::vector<int64_t> shape = read.Find(names[0])->shape;
  const int64_t D = dim();
  if (shape.empty() || shape.size() > 2 || shape.back() != D || shape.front() < 1) {
    return Errorf(
        "textual inversion '{}': tensor '{}' is [{}], and the text encoder '{}' embeds tokens "
        "of {} ([{}] or [n, {}])",
        file, names[0], fmt::join(shape, ", "), path_, D, D, D);
  }
  const int n = shape.size() == 2 ? static_cast<int>(shape[0]) : 1;
  std::vector<float> rows(size_t(n) * D);
  DT_RETURN_IF_ERROR(read.CopyAsF32(names[0], shape, rows.data()));
  const std::string name = token.empty() ? names[0] : token;
  std::vector<std::string> tokens = {name};
  for (int i = 1; i < n; ++i)
    tokens.push_back(fmt::format("{}_{}", name, i));
  const auto* clip = dynamic_cast<const text::ClipBpeTokenizer*>(tokenizer_.get());
  if (!clip) {
    return Errorf("textual inversion '{}': the text encoder '{}' has no CLIP tokenizer", file,
                  path_);
  }
  auto grown = std::make_shared<text::ClipBpeTokenizer>(*clip);
  std::vector<int32_t> ids;
  try {
    ids = grown->AddTokens(tokens);
  } catch (const std::invalid_argument& e) {
    return Errorf("textual inversion '{}': {}", file, e.what());
  }
  DT_RETURN_IF_ERROR(encoder_.SetTokenEmbeddings(grown->vocab_size(), ids, rows.data())
                         .WithContext(fmt::format("textual inversion '{}'", file)));
  tokenizer_ = std::move(grown);
  inversions_.emplace_back(name, n);
  inversion_ids_.push_back(ids[0]);
  return Status::Ok();
}

std::string TextEmbedder::SpellInversions(std::string text) const {
  const auto* clip = dynamic_cast<const text::ClipBpeTokenizer*>(tokenizer_.get());
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
  const int max = encoder_.config().max_positions;
  if (length < 2 || length > max) {
    return Errorf("text encoder '{}': texts of {} tokens; it takes 2 to {}", path_, length, max);
  }
  const size_t text_floats = size_t(length) * dim();
  std::vector<float> out(texts.size() * text_floats);
  for (size_t first = 0; first < texts.size(); first += kChunk) {
    const size_t count = std::min(kChunk, texts.size() - first);
    std::vector<text::Tokens> tokens;
    for (size_t k = first; k < first + count; ++k) {
      try {
        tokens.push_back(tokenizer_->Encode(SpellInversions(texts[k]), length));
      } catch (const std::exception& e) {
        return Errorf("text {} ('{}'): {}", k, texts[k], e.what());
      }
    }
    DT_RETURN_IF_ERROR(encoder_.Encode(tokens, skip_layers, out.data() + first * text_floats));
  }
  return out;
}

Result<TextTable> TextEmbedder::EmbedTable(const std::vector<std::string>& captions, int length,
                                           int skip_layers) const {
  TextTable table;
  table.length = length;
  table.dim = dim();
  table.captions = captions;
  DT_ASSIGN_OR_RETURN(table.embeddings, Embed(captions, length, skip_layers));
  table.encoder = fmt::format(
      "{} ({}){}, L {}, D {}", encoder_.config().Describe(), encoder_.source(),
      skip_layers > 0 ? fmt::format(", last {} layers skipped", skip_layers) : std::string(),
      length, dim());
  table.text_encoder = fs::absolute(path_).lexically_normal().string();
  table.skip_layers = skip_layers;
  return table;
}

}  // namespace difftrain
