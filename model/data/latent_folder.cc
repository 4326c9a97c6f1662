#include "model/data/latent_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/io/posix_file.h"
#include "model/io/safetensors.h"

namespace difftrain {
namespace {

static_assert(std::endian::native == std::endian::little, "shards hold little-endian tensors");

using Json = nlohmann::json;

constexpr char kLatentsTensor[] = "latents";
constexpr char kMirroredTensor[] = "latents_mirrored";
constexpr char kLabelsTensor[] = "labels";
constexpr char kTextIdsTensor[] = "text_ids";
// PictureGeometry, six numbers a sample: original height, width, crop top, left, height, width.
constexpr char kGeometryTensor[] = "geometry";
constexpr int64_t kGeometryFields = 6;
constexpr char kTextFile[] = "text.safetensors";
// A shard header is a few hundred bytes; a larger length means a corrupt file.
constexpr uint64_t kMaxShardHeaderBytes = 1 << 20;

Status IndexError(const std::string& path, const std::string& what) {
  return Errorf("latent folder index '{}': {}", path, what);
}

Status ShardError(const std::string& path, const std::string& what) {
  return Errorf("latent shard '{}': {}", path, what);
}

// Reads exactly `bytes` bytes at `offset`; pread keeps no file position, so threads share fds.
Status ReadAt(int fd, const std::string& path, void* dst, size_t bytes, uint64_t offset) {
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io::OsError("cannot read latent shard", path, errno);
    if (n == 0) {
      return ShardError(path, fmt::format("ends at byte {}, before the {} bytes wanted at {} "
                                          "(was it truncated?)",
                                          offset + done, bytes, offset));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// A positive integer member of an index.json object (non-negative where `zero_allowed`).
Result<int64_t> PositiveField(const Json& object, const char* key, const std::string& path,
                              bool zero_allowed = false) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
      (it->get<int64_t>() == 0 && !zero_allowed)) {
    return IndexError(path, fmt::format("'{}' must be a {} integer", key,
                                        zero_allowed ? "non-negative" : "positive"));
  }
  return it->get<int64_t>();
}

// The index names shard files inside the folder only: a bare file name.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

// Where tensor `name` lies in a shard, after checking its dtype and shape.
Result<uint64_t> TensorOffset(const std::string& path, const Json& header, const char* name,
                              io::DType dtype, const std::vector<int64_t>& shape,
                              uint64_t data_start, uint64_t file_bytes) {
  auto it = header.find(name);
  const std::string expected = fmt::format("{} {}", io::DTypeName(dtype), Json(shape).dump());
  if (it == header.end() || !it->is_object()) {
    return ShardError(path, fmt::format("has no tensor '{}' (expected {})", name, expected));
  }
  const Json& info = *it;
  const Json dtype_json = info.value("dtype", Json());
  const Json shape_json = info.value("shape", Json());
  if (dtype_json != std::string(io::DTypeName(dtype)) || shape_json != Json(shape)) {
    const std::string got =
        dtype_json.is_string() ? dtype_json.get<std::string>() : dtype_json.dump();
    return ShardError(path, fmt::format("tensor '{}' is {} {}, expected {}", name, got,
                                        shape_json.dump(), expected));
  }
  const std::optional<uint64_t> size = io::TensorBytes(dtype, shape);
  if (!size) return ShardError(path, fmt::format("tensor '{}' is too large", name));
  const uint64_t bytes = *size;
  const Json offsets = info.value("data_offsets", Json());
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>() ||
      offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>() != bytes) {
    return ShardError(path, fmt::format("tensor '{}' has data_offsets {} for {} bytes", name,
                                        offsets.dump(), bytes));
  }
  // Against the data's size, not as data_start + end: an offset near 2^64 wrapped that sum
  // into the file, and the samples were read from the header.
  if (offsets[1].get<uint64_t>() > file_bytes - data_start) {
    return ShardError(path, fmt::format("truncated: tensor '{}' ends at byte {} of the data, the "
                                        "file holds {} bytes of data",
                                        name, offsets[1].get<uint64_t>(), file_bytes - data_start));
  }
  return data_start + offsets[0].get<uint64_t>();
}

// The index's "vae" entry: {"path": string, "scaling_factor": number > 0, "posterior":
// "sample"|"mode", "seed": integer ≥ 0}.
Result<std::optional<LatentFolderVae>> ParseVae(const Json& index, const std::string& path) {
  if (!index.contains("vae")) return std::optional<LatentFolderVae>();
  const Json& entry = index["vae"];
  const auto field = [&](const char* key, Json::value_t type) -> const Json* {
    auto it = entry.is_object() ? entry.find(key) : entry.end();
    if (it == entry.end()) return nullptr;
    if (type == Json::value_t::number_float ? !it->is_number() : it->type() != type) return nullptr;
    return &*it;
  };
  const Json* file = field("path", Json::value_t::string);
  const Json* scale = field("scaling_factor", Json::value_t::number_float);
  const Json* posterior = field("posterior", Json::value_t::string);
  const Json* seed = field("seed", Json::value_t::number_unsigned);
  if (file == nullptr || scale == nullptr || !(scale->get<double>() > 0) || posterior == nullptr ||
      (*posterior != "sample" && *posterior != "mode") || seed == nullptr) {
    return IndexError(path,
                      fmt::format("'vae' must be {{\"path\": string, \"scaling_factor\": positive "
                                  "number, \"posterior\": \"sample\" or \"mode\", \"seed\": "
                                  "non-negative integer}}, got {}",
                                  entry.dump()));
  }
  return std::optional<LatentFolderVae>(
      LatentFolderVae{file->get<std::string>(), scale->get<double>(), posterior->get<std::string>(),
                      seed->get<uint64_t>()});
}

Result<Json> ReadIndex(const std::string& index_path) {
  DT_ASSIGN_OR_RETURN(std::string text, io::ReadWholeFile(index_path));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return IndexError(index_path, "is not a JSON object");
  }
  return index;
}

}  // namespace

Result<std::optional<LatentFolderVae>> ReadLatentFolderVae(const std::string& dir) {
  const std::string index_path = dir + "/" + std::string(kLatentFolderIndex);
  DT_ASSIGN_OR_RETURN(const Json index, ReadIndex(index_path));
  return ParseVae(index, index_path);
}

LatentFolderDataset::~LatentFolderDataset() {
  for (Shard& shard : shards_) {
    if (shard.fd >= 0) ::close(shard.fd);
  }
}

Result<std::unique_ptr<LatentFolderDataset>> LatentFolderDataset::Open(const std::string& dir) {
  const std::string index_path = dir + "/" + std::string(kLatentFolderIndex);
  DT_ASSIGN_OR_RETURN(const Json index, ReadIndex(index_path));
  if (index.value("format", Json()) != std::string(kLatentFolderFormat)) {
    return IndexError(index_path,
                      fmt::format("format is {}, expected \"{}\"",
                                  index.value("format", Json()).dump(), kLatentFolderFormat));
  }
  if (index.value("version", Json()) != kLatentFolderVersion) {
    return IndexError(index_path,
                      fmt::format("version {} is not supported (this difftrain reads {})",
                                  index.value("version", Json()).dump(), kLatentFolderVersion));
  }
  std::unique_ptr<LatentFolderDataset> data(new LatentFolderDataset());
  for (auto [key, field] :
       {std::pair{"channels", &data->channels_}, std::pair{"height", &data->height_},
        std::pair{"width", &data->width_}, std::pair{"num_classes", &data->num_classes_}}) {
    // num_classes 0: unlabelled samples (every label 0), as Dataset says.
    DT_ASSIGN_OR_RETURN(int64_t value, PositiveField(index, key, index_path,
                                                     std::string_view(key) == "num_classes"));
    if (value > INT32_MAX) return IndexError(index_path, fmt::format("'{}' is too large", key));
    *field = static_cast<int>(value);
  }
  if (index.contains("frames")) {  // a folder of videos
    DT_ASSIGN_OR_RETURN(int64_t frames, PositiveField(index, "frames", index_path));
    if (frames > INT32_MAX) return IndexError(index_path, "'frames' is too large");
    data->frames_ = static_cast<int>(frames);
  }
  if (index.contains("text")) DT_RETURN_IF_ERROR(data->OpenTexts(dir, index["text"], index_path));
  if (index.contains("geometry")) {
    if (index["geometry"] != true)
      return IndexError(index_path, "'geometry' must be true (the shards hold it) or absent");
    data->has_geometry_ = true;
  }
  if (index.contains("mirrored")) {
    if (index["mirrored"] != true)
      return IndexError(index_path, "'mirrored' must be true (the shards hold them) or absent");
    data->mirrored_ = true;
  }
  DT_ASSIGN_OR_RETURN(data->vae_, ParseVae(index, index_path));
  if (index.contains("buckets")) {
    const Json& list = index["buckets"];
    if (!list.is_array() || list.empty()) {
      return IndexError(index_path,
                        "'buckets' must be a non-empty list of {\"height\", \"width\"}");
    }
    for (const Json& bucket : list) {
      if (!bucket.is_object()) {
        return IndexError(index_path,
                          fmt::format("bucket {} must be {{\"height\": positive integer, "
                                      "\"width\": positive integer}}, got {}",
                                      data->buckets_.size(), bucket.dump()));
      }
      SampleSize size;
      for (auto [key, field] :
           {std::pair{"height", &size.height}, std::pair{"width", &size.width}}) {
        Result<int64_t> value = PositiveField(bucket, key, index_path);
        if (!value.ok() || *value > INT32_MAX) {
          return IndexError(index_path, fmt::format("bucket {}: '{}' must be a positive integer",
                                                    data->buckets_.size(), key));
        }
        *field = static_cast<int>(*value);
      }
      data->buckets_.push_back(size);
    }
  }
  DT_ASSIGN_OR_RETURN(int64_t total, PositiveField(index, "total", index_path));
  auto shards = index.find("shards");
  if (shards == index.end() || !shards->is_array() || shards->empty()) {
    return IndexError(index_path, "'shards' must be a non-empty list");
  }
  int64_t first = 0;
  for (const Json& entry : *shards) {
    const Json file = entry.is_object() ? entry.value("file", Json()) : Json();
    if (!file.is_string() || !IsPlainFileName(file.get<std::string>())) {
      return IndexError(index_path,
                        fmt::format("shard {}: 'file' must be a file name in the folder, got {}",
                                    data->shards_.size(), file.dump()));
    }
    DT_ASSIGN_OR_RETURN(int64_t count, PositiveField(entry, "count", index_path));
    if (count > total - first) {  // (summed, counts near 2^63 overflowed)
      return IndexError(
          index_path, fmt::format("'total' is {} but shard {}'s count {} takes the shards past it",
                                  total, data->shards_.size(), count));
    }
    int bucket = 0;
    if (!data->buckets_.empty()) {  // each shard's samples are of one bucket's size
      const Json b = entry.value("bucket", Json());
      if (!b.is_number_integer() || b.get<int64_t>() < 0 ||
          b.get<int64_t>() >= static_cast<int64_t>(data->buckets_.size())) {
        return IndexError(index_path,
                          fmt::format("shard {}: 'bucket' must be a bucket's number in [0, {}), "
                                      "got {}",
                                      data->shards_.size(), data->buckets_.size(), b.dump()));
      }
      bucket = b.get<int>();
    }
    data->shards_.push_back({dir + "/" + file.get<std::string>(), -1, first, count, 0, bucket, 0});
    first += count;
  }
  if (first != total) {
    return IndexError(index_path,
                      fmt::format("'total' is {} but the shards hold {} samples", total, first));
  }
  for (Shard& shard : data->shards_)
    DT_RETURN_IF_ERROR(data->OpenShard(shard));
  return data;
}

// Reads the text table the index's "text" entry names and checks it against the entry.
Status LatentFolderDataset::OpenTexts(const std::string& dir, const Json& entry,
                                      const std::string& index_path) {
  const Json file = entry.is_object() ? entry.value("file", Json()) : Json();
  if (!file.is_string() || !IsPlainFileName(file.get<std::string>())) {
    return IndexError(index_path, fmt::format("text: 'file' must be a file name in the folder, "
                                              "got {}",
                                              file.dump()));
  }
  DT_ASSIGN_OR_RETURN(int64_t length, PositiveField(entry, "length", index_path));
  DT_ASSIGN_OR_RETURN(int64_t dim, PositiveField(entry, "dim", index_path));
  DT_ASSIGN_OR_RETURN(int64_t count, PositiveField(entry, "count", index_path));
  DT_ASSIGN_OR_RETURN(texts_, ReadTextTable(dir + "/" + file.get<std::string>()));
  if (texts_.length != length || texts_.dim != dim || texts_.size() != count) {
    return IndexError(index_path, fmt::format("text: the index says {} texts of {}x{}, '{}' holds "
                                              "{} of {}x{}",
                                              count, length, dim, file.get<std::string>(),
                                              texts_.size(), texts_.length, texts_.dim));
  }
  return Status::Ok();
}

// Opens the shard, checks its header against the index and appends its labels. Labels grow
// shard by shard, after each shard's size has vouched for its count, so a corrupt count in
// the index cannot ask for a huge allocation.
Status LatentFolderDataset::OpenShard(Shard& shard) {
  const std::string& path = shard.path;
  shard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (shard.fd < 0) return io::OsError("cannot open latent shard", path, errno);
  struct stat st;
  if (::fstat(shard.fd, &st) != 0) return io::OsError("cannot stat latent shard", path, errno);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  uint64_t header_bytes = 0;
  if (file_bytes < 8) return ShardError(path, fmt::format("truncated: {} bytes", file_bytes));
  DT_RETURN_IF_ERROR(ReadAt(shard.fd, path, &header_bytes, 8, 0));
  if (header_bytes > kMaxShardHeaderBytes || 8 + header_bytes > file_bytes) {
    return ShardError(path, fmt::format("header length {} does not fit the file of {} bytes",
                                        header_bytes, file_bytes));
  }
  std::string header_text(header_bytes, '\0');
  DT_RETURN_IF_ERROR(ReadAt(shard.fd, path, header_text.data(), header_bytes, 8));
  const Json header = Json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return ShardError(path, "header is not a JSON object");
  }

  const uint64_t data_start = 8 + header_bytes;
  const SampleSize size = buckets()[shard.bucket];
  const std::vector<int64_t> shape =
      frames_ > 1 ? std::vector<int64_t>{shard.count, frames_, channels_, size.height, size.width}
                  : std::vector<int64_t>{shard.count, channels_, size.height, size.width};
  DT_ASSIGN_OR_RETURN(
      shard.latents_offset,
      TensorOffset(path, header, kLatentsTensor, io::DType::kF32, shape, data_start, file_bytes));
  if (mirrored_) {
    DT_ASSIGN_OR_RETURN(shard.mirrored_offset,
                        TensorOffset(path, header, kMirroredTensor, io::DType::kF32, shape,
                                     data_start, file_bytes));
  }
  DT_ASSIGN_OR_RETURN(uint64_t labels_offset,
                      TensorOffset(path, header, kLabelsTensor, io::DType::kI64, {shard.count},
                                   data_start, file_bytes));
  std::vector<int64_t> labels(static_cast<size_t>(shard.count));
  DT_RETURN_IF_ERROR(
      ReadAt(shard.fd, path, labels.data(), labels.size() * sizeof(int64_t), labels_offset));
  for (int64_t i = 0; i < shard.count; ++i) {
    if (labels[i] < 0 || labels[i] >= std::max(num_classes_, 1)) {
      return ShardError(path, num_classes_ == 0
                                  ? fmt::format("label {} of sample {} is not 0 in a folder "
                                                "without classes",
                                                labels[i], i)
                                  : fmt::format("label {} of sample {} is outside [0, {})",
                                                labels[i], i, num_classes_));
    }
    labels_.push_back(static_cast<int32_t>(labels[i]));
  }
  if (has_geometry_) {
    DT_ASSIGN_OR_RETURN(uint64_t geometry_offset,
                        TensorOffset(path, header, kGeometryTensor, io::DType::kI64,
                                     {shard.count, kGeometryFields}, data_start, file_bytes));
    std::vector<int64_t> rows(static_cast<size_t>(shard.count * kGeometryFields));
    DT_RETURN_IF_ERROR(
        ReadAt(shard.fd, path, rows.data(), rows.size() * sizeof(int64_t), geometry_offset));
    for (int64_t i = 0; i < shard.count; ++i) {
      const int64_t* g = rows.data() + i * kGeometryFields;
      if (std::any_of(g, g + kGeometryFields, [](int64_t v) { return v < 0 || v > INT32_MAX; }) ||
          g[0] < 1 || g[1] < 1 || g[4] < 1 || g[5] < 1) {
        return ShardError(path, fmt::format("geometry of sample {} is not sizes and offsets in "
                                            "pixels: {}",
                                            i, fmt::join(g, g + kGeometryFields, ", ")));
      }
      geometry_.push_back({.original_height = int32_t(g[0]),
                           .original_width = int32_t(g[1]),
                           .crop_top = int32_t(g[2]),
                           .crop_left = int32_t(g[3]),
                           .height = int32_t(g[4]),
                           .width = int32_t(g[5])});
    }
  }
  if (texts_.size() == 0) return Status::Ok();
  DT_ASSIGN_OR_RETURN(uint64_t ids_offset,
                      TensorOffset(path, header, kTextIdsTensor, io::DType::kI64, {shard.count},
                                   data_start, file_bytes));
  DT_RETURN_IF_ERROR(
      ReadAt(shard.fd, path, labels.data(), labels.size() * sizeof(int64_t), ids_offset));
  for (int64_t i = 0; i < shard.count; ++i) {
    if (labels[i] < 0 || labels[i] >= texts_.size()) {
      return ShardError(path, fmt::format("text id {} of sample {} is outside the text table's "
                                          "[0, {})",
                                          labels[i], i, texts_.size()));
    }
    text_ids_.push_back(labels[i]);
  }
  return Status::Ok();
}

const LatentFolderDataset::Shard& LatentFolderDataset::ShardOf(int64_t index) const {
  // The last shard whose first sample is at or before `index`.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), index,
                             [](int64_t i, const Shard& shard) { return i < shard.first; });
  return *std::prev(it);
}

std::vector<SampleSize> LatentFolderDataset::buckets() const {
  return buckets_.empty() ? Dataset::buckets() : buckets_;
}

Status LatentFolderDataset::Read(int64_t index, uint64_t Shard::*offset, float* image,
                                 int32_t* label) const {
  const Shard& shard = ShardOf(index);
  const size_t bytes = static_cast<size_t>(SampleFloats(index)) * sizeof(float);
  DT_RETURN_IF_ERROR(
      ReadAt(shard.fd, shard.path, image, bytes, shard.*offset + (index - shard.first) * bytes));
  *label = labels_[index];
  return Status::Ok();
}

Status LatentFolderDataset::Get(int64_t index, float* image, int32_t* label) const {
  return Read(index, &Shard::latents_offset, image, label);
}

Status LatentFolderDataset::GetMirrored(int64_t index, float* image, int32_t* label) const {
  if (!mirrored_) return Dataset::GetMirrored(index, image, label);
  return Read(index, &Shard::mirrored_offset, image, label);
}

Status LatentFolderDataset::GetGeometry(int64_t index, PictureGeometry* geometry) const {
  if (!has_geometry_) return Dataset::GetGeometry(index, geometry);
  *geometry = geometry_[index];
  return Status::Ok();
}

Status LatentFolderDataset::VerifyChecksums() const {
  for (const Shard& shard : shards_) {
    Result<io::FileDigest> digest = io::SafetensorsFile::Verify(shard.path);
    if (!digest.ok()) return digest.status();
  }
  return Status::Ok();
}

Status WriteLatentFolder(const Dataset& source, const std::string& dir, int64_t samples_per_shard,
                         const std::optional<LatentFolderVae>& vae) {
  if (source.unbounded()) {
    return Status::Error("cannot pack an unbounded dataset: give it a size (a sample limit)");
  }
  if (source.size() == 0) return Status::Error("cannot pack an empty dataset");
  if (samples_per_shard < 1) {
    return Errorf("samples per shard must be positive, got {}", samples_per_shard);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Errorf("cannot create directory '{}': {}", dir, ec.message());
  const std::string index_path = dir + "/" + std::string(kLatentFolderIndex);
  if (::unlink(index_path.c_str()) != 0 && errno != ENOENT) {
    return io::OsError("cannot remove the old index", index_path, errno);
  }

  const int64_t total = source.size();
  // The samples in the folder's order: a bucketed source's grouped by bucket (each shard holds
  // one bucket's samples), in the source's order within each.
  const std::vector<SampleSize> buckets = source.buckets();
  const bool bucketed = buckets.size() > 1;
  std::vector<std::vector<int64_t>> members(buckets.size());
  for (int64_t i = 0; i < total; ++i) {
    const int b = bucketed ? source.BucketOf(i) : 0;
    if (b < 0 || b >= static_cast<int>(buckets.size()))
      return Errorf("sample {} is in bucket {}, outside the source's {}", i, b, buckets.size());
    members[b].push_back(i);
  }
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  int64_t written = 0;
  std::vector<float> latents, mirrored;
  std::vector<int64_t> labels, text_ids, geometry;
  const TextTable* texts = source.texts();
  const bool has_geometry = source.has_geometry();
  const bool has_mirrored = source.has_mirrored();
  for (size_t bucket = 0; bucket < buckets.size(); ++bucket) {
    const std::vector<int64_t>& in_bucket = members[bucket];
    const SampleSize size = buckets[bucket];
    const int64_t floats = int64_t{source.frames()} * source.channels() * size.area();
    for (size_t start = 0; start < in_bucket.size(); start += samples_per_shard) {
      const int64_t count =
          std::min<int64_t>(samples_per_shard, static_cast<int64_t>(in_bucket.size() - start));
      latents.resize(static_cast<size_t>(count * floats));
      mirrored.resize(has_mirrored ? static_cast<size_t>(count * floats) : 0);
      labels.resize(static_cast<size_t>(count));
      text_ids.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t sample = in_bucket[start + i];
        int32_t label = 0;
        Status got = source.Get(sample, latents.data() + i * floats, &label);
        if (!got.ok()) return got.WithContext(fmt::format("reading sample {} to pack", sample));
        labels[i] = label;
        if (has_mirrored) {
          got = source.GetMirrored(sample, mirrored.data() + i * floats, &label);
          if (!got.ok()) {
            return got.WithContext(fmt::format("reading sample {}'s mirror image to pack", sample));
          }
        }
        if (texts != nullptr) text_ids[i] = source.TextId(sample);
        if (!has_geometry) continue;
        PictureGeometry g;
        got = source.GetGeometry(sample, &g);
        if (!got.ok()) return got.WithContext(fmt::format("sample {}'s picture", sample));
        geometry.insert(geometry.end(), {g.original_height, g.original_width, g.crop_top,
                                         g.crop_left, g.height, g.width});
      }
      const std::string file = fmt::format("shard-{:05d}.safetensors", shards.size());
      io::SafetensorsWriter writer;
      const std::vector<int64_t> shape =
          source.frames() > 1
              ? std::vector<int64_t>{count, source.frames(), source.channels(), size.height,
                                     size.width}
              : std::vector<int64_t>{count, source.channels(), size.height, size.width};
      writer.AddF32(kLatentsTensor, shape, latents.data());
      if (has_mirrored) writer.AddF32(kMirroredTensor, shape, mirrored.data());
      writer.Add(kLabelsTensor, io::DType::kI64, {count}, labels.data());
      if (texts != nullptr) writer.Add(kTextIdsTensor, io::DType::kI64, {count}, text_ids.data());
      if (has_geometry) {
        writer.Add(kGeometryTensor, io::DType::kI64, {count, kGeometryFields}, geometry.data());
      }
      writer.SetMetadata("format", std::string(kLatentFolderFormat));
      writer.SetMetadata("first_sample", std::to_string(written));
      DT_RETURN_IF_ERROR(writer.WriteAtomic(dir + "/" + file));
      nlohmann::ordered_json entry = {{"file", file}, {"count", count}};
      if (bucketed) entry["bucket"] = bucket;
      shards.push_back(std::move(entry));
      geometry.clear();
      written += count;
    }
  }

  if (texts != nullptr) DT_RETURN_IF_ERROR(WriteTextTable(*texts, dir + "/" + kTextFile));

  nlohmann::ordered_json index;
  index["format"] = kLatentFolderFormat;
  index["version"] = kLatentFolderVersion;
  index["channels"] = source.channels();
  index["height"] = source.height();
  index["width"] = source.width();
  if (source.frames() > 1) index["frames"] = source.frames();
  index["num_classes"] = source.num_classes();
  if (texts != nullptr) {
    index["text"] = {{"file", kTextFile},
                     {"length", texts->length},
                     {"dim", texts->dim},
                     {"count", texts->size()}};
  }
  if (has_geometry) index["geometry"] = true;
  if (has_mirrored) index["mirrored"] = true;
  if (bucketed) {
    index["buckets"] = nlohmann::ordered_json::array();
    for (const SampleSize& b : buckets)
      index["buckets"].push_back({{"height", b.height}, {"width", b.width}});
  }
  if (vae) {
    index["vae"] = {{"path", vae->path},
                    {"scaling_factor", vae->scaling_factor},
                    {"posterior", vae->posterior},
                    {"seed", vae->seed}};
  }
  index["shards"] = std::move(shards);
  index["total"] = total;
  const std::string text = index.dump(2) + "\n";
  DT_ASSIGN_OR_RETURN(io::AtomicFileWriter out, io::AtomicFileWriter::Open(index_path));
  DT_RETURN_IF_ERROR(out.Append(text.data(), text.size()));
  return out.Commit();
}

}  // namespace difftrain
