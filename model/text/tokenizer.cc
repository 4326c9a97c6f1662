#include "model/text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/text/clip_bpe.h"
#include "model/text/wordpiece.h"

namespace difftrain::text {
namespace {

namespace fs = std::filesystem;

// tokenizer.json's model.type ("" when the file says none).
std::string ModelType(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("tokenizer {}: cannot be read", file.string()));
  const nlohmann::json root = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    throw std::runtime_error(fmt::format("tokenizer {}: is not JSON", file.string()));
  }
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object() || !model->contains("type") ||
      !(*model)["type"].is_string()) {
    return "";
  }
  return (*model)["type"].get<std::string>();
}

}  // namespace

void TokenizerFileError(const fs::path& file, const std::string& what) {
  throw std::runtime_error(fmt::format("tokenizer {}: {}", file.string(), what));
}

int32_t TokenId(const nlohmann::json& id, const fs::path& file, const std::string& what) {
  // A JSON integer beyond int64 is unsigned: beyond the bound too.
  if (id.is_number_unsigned() && id.get<uint64_t>() <= uint64_t(kMaxTokenId)) {
    return id.get<int32_t>();
  }
  if (id.is_number_integer() && !id.is_number_unsigned() && id.get<int64_t>() >= 0 &&
      id.get<int64_t>() <= kMaxTokenId) {
    return id.get<int32_t>();
  }
  TokenizerFileError(file, fmt::format("the id of {} is {}, not an integer in [0, {}]", what,
                                       id.dump(), kMaxTokenId));
}

Tokens FrameTokens(std::vector<int32_t> pieces, int length, int32_t start, int32_t end,
                   int32_t pad) {
  if (length < 2) {
    throw std::invalid_argument(
        fmt::format("token length {} leaves no room for the start and end tokens", length));
  }
  pieces.resize(std::min(pieces.size(), static_cast<size_t>(length - 2)));
  Tokens tokens;
  tokens.ids.reserve(length);
  tokens.ids.push_back(start);
  tokens.ids.insert(tokens.ids.end(), pieces.begin(), pieces.end());
  tokens.ids.push_back(end);
  tokens.mask.assign(tokens.ids.size(), 1);
  tokens.ids.resize(length, pad);
  tokens.mask.resize(length, 0);
  return tokens;
}

std::unique_ptr<Tokenizer> LoadTokenizer(const fs::path& folder) {
  const fs::path json = folder / "tokenizer.json";
  const bool has_json = fs::is_regular_file(json);
  const std::string type = has_json ? ModelType(json) : "";
  if (type == "WordPiece") return WordPieceTokenizer::Load(json);
  if (fs::is_regular_file(folder / "vocab.json") && fs::is_regular_file(folder / "merges.txt")) {
    return ClipBpeTokenizer::Load(folder);
  }
  if (has_json) {
    throw std::runtime_error(fmt::format(
        "tokenizer {}: model.type is {}, not WordPiece (and the folder has no vocab.json + "
        "merges.txt of CLIP's BPE)",
        json.string(), type.empty() ? "missing" : "\"" + type + "\""));
  }
  if (fs::is_directory(folder / "tokenizer")) return LoadTokenizer(folder / "tokenizer");
  throw std::runtime_error(fmt::format(
      "tokenizer folder {} has no tokenizer.json (WordPiece), no vocab.json and merges.txt "
      "(CLIP's BPE) and no tokenizer/ folder (a diffusers pipeline){}",
      folder.string(), fs::is_directory(folder) ? "" : ": it is not a folder"));
}

}  // namespace difftrain::text
