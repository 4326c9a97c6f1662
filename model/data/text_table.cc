#include "model/data/text_table.h"

#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

constexpr char kEmbeddings[] = "embeddings";
constexpr char kPooled[] = "pooled";

Status TableError(const std::string& path, const std::string& what) {
  return Errorf("text table '{}': {}", path, what);
}

// Metadata `key` parsed as a JSON list; absent → an empty list when `required` is false.
Result<nlohmann::json> ListField(const io::SafetensorsFile& file, const char* key, bool required) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    if (required) return TableError(file.path(), fmt::format("metadata has no '{}'", key));
    return nlohmann::json::array();
  }
  nlohmann::json list = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array()) {
    return TableError(file.path(), fmt::format("metadata '{}' is not a JSON list", key));
  }
  return list;
}

uint64_t Fnv1a(std::string_view word) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : word) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<std::string> Words(std::string_view caption) {
  std::vector<std::string> words;
  std::string word;
  for (char c : caption) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '\'') {
      word.push_back(static_cast<char>(std::tolower(u)));
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

}  // namespace

std::optional<int64_t> TextTable::Find(std::string_view caption) const {
  for (int64_t k = 0; k < size(); ++k) {
    if (captions[k] == caption) return k;
  }
  return std::nullopt;
}

Status TextTable::Validate() const {
  if (length < 1 || dim < 1) {
    return Errorf("text length and dim must be positive, got {} and {}", length, dim);
  }
  if (captions.empty()) return Status::Error("the table holds no texts");
  if (!labels.empty() && labels.size() != captions.size()) {
    return Errorf("{} labels for {} captions", labels.size(), captions.size());
  }
  if (!held_out.empty() && held_out.size() != captions.size()) {
    return Errorf("{} held_out flags for {} captions", held_out.size(), captions.size());
  }
  if (embeddings.size() != captions.size() * text_floats()) {
    return Errorf("{} embedding floats for {} texts of {}x{}", embeddings.size(), captions.size(),
                  length, dim);
  }
  if (pooled_dim < 0 || pooled.size() != captions.size() * pooled_dim) {
    return Errorf("{} pooled floats for {} texts of {}", pooled.size(), captions.size(),
                  pooled_dim);
  }
  return Status::Ok();
}

Result<TextTable> ReadTextTable(const std::string& path) {
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  auto format = file.metadata().find("format");
  if (format == file.metadata().end() || format->second != kTextTableFormat) {
    return TableError(path, fmt::format("metadata 'format' is not \"{}\"", kTextTableFormat));
  }
  auto version = file.metadata().find("version");
  if (version == file.metadata().end() || version->second != "1") {
    return TableError(path, "metadata 'version' is not \"1\" (the version this difftrain reads)");
  }
  const io::TensorView* view = file.Find(kEmbeddings);
  if (view == nullptr || view->dtype != io::DType::kF32 || view->shape.size() != 3 ||
      view->shape[1] < 1 || view->shape[2] < 1 || view->shape[1] > INT32_MAX ||
      view->shape[2] > INT32_MAX) {
    return TableError(path, "needs a tensor 'embeddings' F32 [K, L, D] with L, D positive");
  }
  TextTable table;
  table.length = static_cast<int>(view->shape[1]);
  table.dim = static_cast<int>(view->shape[2]);
  auto encoder = file.metadata().find("encoder");
  if (encoder != file.metadata().end()) table.encoder = encoder->second;

  DT_ASSIGN_OR_RETURN(nlohmann::json captions, ListField(file, "captions", true));
  DT_ASSIGN_OR_RETURN(nlohmann::json labels, ListField(file, "labels", false));
  DT_ASSIGN_OR_RETURN(nlohmann::json held_out, ListField(file, "held_out", false));
  for (const nlohmann::json& c : captions) {
    if (!c.is_string()) return TableError(path, "metadata 'captions' holds a non-string");
    table.captions.push_back(c.get<std::string>());
  }
  for (const nlohmann::json& l : labels) {
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > INT32_MAX) {
      return TableError(path, fmt::format("metadata 'labels' holds {}, not a class", l.dump()));
    }
    table.labels.push_back(l.get<int>());
  }
  if (auto it = file.metadata().find("text_encoder"); it != file.metadata().end()) {
    const nlohmann::json e = nlohmann::json::parse(it->second, nullptr, false);
    const auto skip = [&e] { return e.value("skip_layers", nlohmann::json(0)); };
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string() ||
        !skip().is_number_integer() || skip().get<int64_t>() < 0 ||
        skip().get<int64_t>() > INT32_MAX) {
      return TableError(path, "metadata 'text_encoder' is not {\"path\": …, \"skip_layers\": …}");
    }
    table.text_encoder = e["path"].get<std::string>();
    table.skip_layers = skip().get<int>();
  }
  for (const nlohmann::json& h : held_out) {
    if (!h.is_boolean()) return TableError(path, "metadata 'held_out' holds a non-boolean");
    table.held_out.push_back(h.get<bool>());
  }
  if (view->shape[0] != table.size()) {
    return TableError(path, fmt::format("'embeddings' holds {} texts and metadata 'captions' {}",
                                        view->shape[0], table.size()));
  }
  table.embeddings.resize(table.size() * table.text_floats());
  DT_RETURN_IF_ERROR(file.CopyF32(kEmbeddings, view->shape, table.embeddings.data()));
  if (const io::TensorView* pooled = file.Find(kPooled); pooled != nullptr) {
    if (pooled->dtype != io::DType::kF32 || pooled->shape.size() != 2 ||
        pooled->shape[0] != table.size() || pooled->shape[1] < 1 || pooled->shape[1] > INT32_MAX) {
      return TableError(path,
                        fmt::format("'pooled' must be F32 [{}, P] with P positive", table.size()));
    }
    table.pooled_dim = static_cast<int>(pooled->shape[1]);
    table.pooled.resize(table.size() * table.pooled_dim);
    DT_RETURN_IF_ERROR(file.CopyF32(kPooled, pooled->shape, table.pooled.data()));
  }
  if (Status valid = table.Validate(); !valid.ok()) return TableError(path, valid.message());
  return table;
}

Status WriteTextTable(const TextTable& table, const std::string& path) {
  if (Status valid = table.Validate(); !valid.ok()) return TableError(path, valid.message());
  io::SafetensorsWriter writer;
  writer.AddF32(kEmbeddings, {table.size(), table.length, table.dim}, table.embeddings.data());
  if (table.pooled_dim > 0)
    writer.AddF32(kPooled, {table.size(), table.pooled_dim}, table.pooled.data());
  writer.SetMetadata("format", std::string(kTextTableFormat));
  writer.SetMetadata("version", "1");
  writer.SetMetadata("encoder", table.encoder);
  writer.SetMetadata("captions", nlohmann::json(table.captions).dump());
  if (!table.labels.empty()) writer.SetMetadata("labels", nlohmann::json(table.labels).dump());
  if (!table.held_out.empty()) {
    writer.SetMetadata("held_out", nlohmann::json(table.held_out).dump());
  }
  if (!table.text_encoder.empty()) {
    writer.SetMetadata(
        "text_encoder",
        nlohmann::json{{"path", table.text_encoder}, {"skip_layers", table.skip_layers}}.dump());
  }
  return writer.WriteAtomic(path);
}

Result<TextTable> EmbedWithTokenTable(const std::vector<std::string>& captions, int length,
                                      int dim) {
  if (length < 1 || dim < 2 || dim % 2 != 0) {
    return Errorf("token table: length must be positive and dim even, got {} and {}", length, dim);
  }
  TextTable table;
  table.length = length;
  table.dim = dim;
  table.encoder = fmt::format(
      "token-table (difftrain: word N(0, 1/D) by FNV-1a + sinusoidal "
      "position), L {}, D {}",
      length, dim);
  table.captions = captions;
  table.embeddings.assign(captions.size() * table.text_floats(), 0.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (size_t k = 0; k < captions.size(); ++k) {
    const std::vector<std::string> words = Words(captions[k]);
    if (words.empty()) return Errorf("token table: caption {} ('{}') has no words", k, captions[k]);
    for (int i = 0; i < length && i < static_cast<int>(words.size()); ++i) {
      float* token = table.embeddings.data() + (k * length + i) * dim;
      Rng rng(Fnv1a(words[i]), RngStream::kText);
      for (int j = 0; j < dim / 2; ++j) {
        const double omega = std::pow(10000.0, -2.0 * j / dim);
        token[2 * j] = static_cast<float>(scale * (rng.Normal() + std::sin(i * omega)));
        token[2 * j + 1] = static_cast<float>(scale * (rng.Normal() + std::cos(i * omega)));
      }
    }
  }
  return table;
}

}  // namespace difftrain
