#include "model/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "model/io/half.h"
#include "model/io/posix_file.h"
#include "model/tensor/tensor_table.h"

namespace difftrain::io {

// safetensors data is little-endian and we read and write tensors straight from memory.
static_assert(std::endian::native == std::endian::little, "difftrain needs a little-endian host");

namespace {

using Json = nlohmann::json;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
    {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},        {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},        {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},        {DType::kU64, "U64", 8},        {DType::kF64, "F64", 8},
};

// kDTypes is indexed by DType.
constexpr bool TableFollowsEnum() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(TableFollowsEnum(), "kDTypes must list every DType in enum order");

const DTypeInfo& Info(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)];
}

// The reference implementation refuses larger headers; so do we, which also keeps a
// corrupt length from asking for a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kVerifyChunkBytes = uint64_t{8} << 20;
constexpr char kMetadataKey[] = "__metadata__";

Status FileError(const std::string& path, const std::string& what) {
  return Errorf("safetensors file '{}': {}", path, what);
}

// Extends `crc` (0 to start) over `bytes` bytes. zlib reads a null buffer as a request for
// the initial value, which would reset the running CRC at an empty tensor added without data.
uint32_t Crc32(uint32_t crc, const void* data, uint64_t bytes) {
  if (bytes == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

// The digest of a whole file from the CRC of its prefix and header and that of its data.
FileDigest CombineDigest(uint64_t file_bytes, uint32_t head_crc, uint32_t data_crc,
                         uint64_t data_bytes) {
  auto combined = crc32_combine(head_crc, data_crc, static_cast<z_off_t>(data_bytes));
  return FileDigest{file_bytes, static_cast<uint32_t>(combined)};
}

// The parsed header: each tensor's place in the data section, in data order, and the
// metadata.
struct Layout {
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;
    uint64_t end;
  };
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Checks the 8-byte header length at the start of a file of `file_bytes` bytes.
Result<uint64_t> HeaderLength(const std::string& path, const uint8_t* prefix, uint64_t file_bytes) {
  if (file_bytes < 8) {
    return FileError(
        path, fmt::format("file is {} bytes, shorter than the 8-byte header length", file_bytes));
  }
  uint64_t n;
  std::memcpy(&n, prefix, 8);
  if (n > kMaxHeaderBytes) {
    return FileError(
        path, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  }
  if (n > file_bytes - 8) {
    return FileError(path, fmt::format("header length {} is larger than the {} bytes after it", n,
                                       file_bytes - 8));
  }
  return n;
}

// Parses the header text; a name given twice is an error (a JSON object would silently
// keep only one of them).
Result<Json> ParseHeaderJson(const std::string& path, std::string_view text) {
  std::set<std::string> seen;
  std::optional<std::string> duplicate;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && !duplicate &&
        !seen.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), on_event);
  } catch (const Json::exception& e) {
    return FileError(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) return FileError(path, "header is not a JSON object");
  if (duplicate) return FileError(path, fmt::format("header names '{}' twice", *duplicate));
  return header;
}

Result<std::map<std::string, std::string>> ParseMetadata(const std::string& path,
                                                         const Json& json) {
  if (!json.is_object()) return FileError(path, "__metadata__ is not a JSON object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_string()) {
      return FileError(
          path, fmt::format("__metadata__ value of '{}' is {}, not a string", key, value.dump()));
    }
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

// A JSON array of non-negative integers, or nullopt.
std::optional<std::vector<uint64_t>> Naturals(const Json& json) {
  if (!json.is_array()) return std::nullopt;
  std::vector<uint64_t> values;
  for (const Json& v : json) {
    if (!v.is_number_unsigned()) return std::nullopt;
    values.push_back(v.get<uint64_t>());
  }
  return values;
}

Result<Layout::Tensor> ParseTensor(const std::string& path, const std::string& name,
                                   const Json& info, uint64_t data_bytes) {
  auto error = [&](const std::string& what) {
    return FileError(path, fmt::format("tensor '{}' {}", name, what));
  };
  if (!info.is_object()) return error("is described by " + info.dump() + ", not an object");
  if (!info.contains("dtype") || !info["dtype"].is_string()) return error("has no string dtype");
  std::string dtype_name = info["dtype"].get<std::string>();
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype) return error(fmt::format("has unknown dtype '{}'", dtype_name));

  std::optional<std::vector<uint64_t>> dims = Naturals(info.value("shape", Json()));
  constexpr uint64_t kMaxDim = static_cast<uint64_t>(INT64_MAX);
  if (!dims || std::any_of(dims->begin(), dims->end(), [](uint64_t d) { return d > kMaxDim; })) {
    return error(fmt::format("shape {} is not a list of non-negative integers",
                             info.value("shape", Json()).dump()));
  }
  std::vector<int64_t> shape(dims->begin(), dims->end());
  std::optional<uint64_t> bytes = TensorBytes(*dtype, shape);
  if (!bytes) return error(fmt::format("shape {} is too large", ShapeString(shape)));

  std::optional<std::vector<uint64_t>> offsets = Naturals(info.value("data_offsets", Json()));
  if (!offsets || offsets->size() != 2) {
    return error(fmt::format("data_offsets {} are not [begin, end]",
                             info.value("data_offsets", Json()).dump()));
  }
  uint64_t begin = (*offsets)[0], end = (*offsets)[1];
  if (begin > end || end > data_bytes) {
    return error(fmt::format("data_offsets [{}, {}] lie outside the data section [0, {}]", begin,
                             end, data_bytes));
  }
  if (end - begin != *bytes) {
    return error(fmt::format("data_offsets [{}, {}] do not match {} {} ({} bytes)", begin, end,
                             dtype_name, ShapeString(shape), *bytes));
  }
  return Layout::Tensor{name, *dtype, std::move(shape), begin, end};
}

// Tensors (sorted by offset) must tile the data section: no overlap, no gap.
Status CheckCoverage(const std::string& path, const std::vector<Layout::Tensor>& tensors,
                     uint64_t data_bytes) {
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Layout::Tensor& t = tensors[i];
    if (t.begin < covered) {
      const Layout::Tensor& prev = tensors[i - 1];
      return FileError(path, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap",
                                         prev.name, prev.begin, prev.end, t.name, t.begin, t.end));
    }
    if (t.begin > covered) {
      return FileError(
          path, fmt::format("data section bytes [{}, {}) belong to no tensor", covered, t.begin));
    }
    covered = t.end;
  }
  if (covered != data_bytes) {
    return FileError(
        path, fmt::format("data section bytes [{}, {}) belong to no tensor", covered, data_bytes));
  }
  return Status::Ok();
}

Result<Layout> ParseLayout(const std::string& path, std::string_view header_text,
                           uint64_t data_bytes) {
  DT_ASSIGN_OR_RETURN(Json header, ParseHeaderJson(path, header_text));
  Layout layout;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      DT_ASSIGN_OR_RETURN(layout.metadata, ParseMetadata(path, info));
      continue;
    }
    DT_ASSIGN_OR_RETURN(Layout::Tensor tensor, ParseTensor(path, name, info, data_bytes));
    layout.tensors.push_back(std::move(tensor));
  }
  std::sort(layout.tensors.begin(), layout.tensors.end(), [](const auto& a, const auto& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  DT_RETURN_IF_ERROR(CheckCoverage(path, layout.tensors, data_bytes));
  return layout;
}

Status CheckDataCrc(const std::string& path, const std::map<std::string, std::string>& metadata,
                    uint32_t actual) {
  auto it = metadata.find(std::string(kCrc32Key));
  if (it == metadata.end()) return Status::Ok();
  std::optional<uint32_t> expected = ParseCrc32Hex(it->second);
  if (!expected) {
    return FileError(path,
                     fmt::format("metadata {} = '{}' is not 8 hex digits", kCrc32Key, it->second));
  }
  if (*expected != actual) {
    return FileError(path, fmt::format("data checksum mismatch: the data section has crc32 {}, "
                                       "metadata {} says {}",
                                       Crc32Hex(actual), kCrc32Key, it->second));
  }
  return Status::Ok();
}

Result<uint32_t> StreamCrc32(InputFile& in, uint64_t bytes) {
  std::vector<uint8_t> chunk(std::min(bytes, kVerifyChunkBytes));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < bytes;) {
    uint64_t n = std::min<uint64_t>(chunk.size(), bytes - done);
    DT_RETURN_IF_ERROR(in.Read(chunk.data(), n));
    crc = Crc32(crc, chunk.data(), n);
    done += n;
  }
  return crc;
}

// Tensors at least this large are converted (or copied) by all of OpenMP's threads, which also
// spreads the kernel's zeroing of a fresh arena's pages over them as each first touches its
// part.
constexpr size_t kParallelElements = size_t(1) << 18;

// n elements of `dtype` (little-endian, possibly unaligned) to fp32.
template <class From, class Convert>
void ConvertElements(const void* src, size_t n, float* dst, Convert convert) {
  const auto* bytes = static_cast<const uint8_t*>(src);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    From value;
    std::memcpy(&value, bytes + i * sizeof(From), sizeof(From));
    dst[i] = convert(value);
  }
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  return Info(dtype).name;
}
size_t DTypeSize(DType dtype) {
  return Info(dtype).size;
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

std::string Crc32Hex(uint32_t crc) {
  return fmt::format("{:08x}", crc);
}

std::optional<uint32_t> ParseCrc32Hex(std::string_view text) {
  uint32_t crc = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), crc, 16);
  if (text.size() != 8 || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return crc;
}

// ---- SafetensorsWriter ----

void SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                            const void* data) {
  DT_CHECK(name != kMetadataKey, "'{}' is reserved for the metadata", name);
  DT_CHECK(!names_.contains(name), "tensor '{}' added twice", name);
  std::optional<uint64_t> bytes = TensorBytes(dtype, shape);
  DT_CHECK(bytes.has_value(), "tensor '{}' has an invalid shape {}", name, ShapeString(shape));
  DT_CHECK(data != nullptr || *bytes == 0, "tensor '{}' has no data", name);
  names_.insert(name);
  tensors_.push_back({std::move(name), dtype, std::move(shape), data, *bytes});
}

void SafetensorsWriter::AddF32(std::string name, std::vector<int64_t> shape, const float* data) {
  Add(std::move(name), DType::kF32, std::move(shape), data);
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  DT_CHECK(key != kCrc32Key, "metadata key '{}' is written by WriteAtomic", key);
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::AddFill(std::function<Status()> fill) {
  DT_CHECK(fill != nullptr, "an empty fill");
  fills_.emplace_back(tensors_.size(), std::move(fill));
}

std::string SafetensorsWriter::Header(uint32_t data_crc) const {
  // ordered_json keeps the order we insert: metadata first, then tensors in data order,
  // as the reference implementation writes them.
  nlohmann::ordered_json header;
  std::map<std::string, std::string> metadata = metadata_;
  metadata[std::string(kCrc32Key)] = Crc32Hex(data_crc);
  header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const Entry& t : tensors_) {
    nlohmann::ordered_json info;
    info["dtype"] = std::string(DTypeName(t.dtype));
    info["shape"] = t.shape;
    info["data_offsets"] = {offset, offset + t.bytes};
    header[t.name] = std::move(info);
    offset += t.bytes;
  }
  std::string text = header.dump();
  // Padding to a multiple of 8 puts the data section on an 8-byte boundary of the file.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Status SafetensorsWriter::WriteAtomic(const std::string& path) const {
  // The checksum goes into the header, which precedes the data. The header is written first
  // with a placeholder of the same width (8 hex digits), the data once after it while its
  // checksum is computed, piece by piece so each piece is still in cache when it is written,
  // and then the header again: one pass over data that may be gigabytes, never a copy of it.
  const std::string placeholder = Header(0);
  const uint64_t header_bytes = placeholder.size();
  DT_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  DT_RETURN_IF_ERROR(file.Append(&header_bytes, 8));
  DT_RETURN_IF_ERROR(file.Append(placeholder.data(), placeholder.size()));
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  uint32_t crc = 0;
  auto fill = fills_.begin();
  for (size_t i = 0; i <= tensors_.size(); ++i) {
    for (; fill != fills_.end() && fill->first == i; ++fill)
      DT_RETURN_IF_ERROR(fill->second());
    if (i == tensors_.size()) break;
    const Entry& t = tensors_[i];
    const auto* data = static_cast<const uint8_t*>(t.data);
    for (uint64_t at = 0; at < t.bytes; at += kPiece) {
      const uint64_t n = std::min(kPiece, t.bytes - at);
      crc = Crc32(crc, data + at, n);
      DT_RETURN_IF_ERROR(file.Append(data + at, n));
    }
  }
  const std::string header = Header(crc);
  DT_CHECK(header.size() == placeholder.size(), "a header's checksum changed its length");
  DT_RETURN_IF_ERROR(file.WriteAt(8, header.data(), header.size()));
  return file.Commit();
}

// ---- SafetensorsFile ----

Result<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  DT_ASSIGN_OR_RETURN(InputFile in, InputFile::Open(path));
  uint64_t size = in.size();
  std::shared_ptr<uint8_t[]> buffer = std::make_unique_for_overwrite<uint8_t[]>(size);
  DT_RETURN_IF_ERROR(in.Read(buffer.get(), size));
  return FromBytes(path, std::shared_ptr<const uint8_t>(buffer, buffer.get()), size,
                   /*digest=*/true);
}

Result<SafetensorsFile> SafetensorsFile::Map(const std::string& path, bool check_data) {
  // Where it cannot be opened or mapped, Read says why as it always does.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Read(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Read(path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Read(path);  // too short to map; Read says what is wrong
  }
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (mapped == MAP_FAILED)
    return FileError(path, fmt::format("cannot map: {}", std::strerror(err)));
  std::shared_ptr<const uint8_t> bytes(
      static_cast<const uint8_t*>(mapped),
      [size](const uint8_t* p) { ::munmap(const_cast<uint8_t*>(p), size); });
  Result<SafetensorsFile> file =
      FromBytes(path, std::move(bytes), size, /*digest=*/false, check_data);
  if (file.ok()) file->mapped_ = true;
  return file;
}

void SafetensorsFile::Forget(const void* data, uint64_t bytes) const {
  if (!mapped_ || bytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // The pages that hold any of it: the file's own (a private read-only map), never written.
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Result<SafetensorsFile> SafetensorsFile::FromBytes(const std::string& path,
                                                   std::shared_ptr<const uint8_t> whole,
                                                   uint64_t size, bool digest, bool check_data) {
  SafetensorsFile file;
  file.path_ = path;
  file.bytes_ = std::move(whole);
  const uint8_t* bytes = file.bytes_.get();
  DT_ASSIGN_OR_RETURN(uint64_t header_bytes, HeaderLength(path, bytes, size));
  std::string_view header(reinterpret_cast<const char*>(bytes) + 8, header_bytes);
  const uint8_t* data = bytes + 8 + header_bytes;
  uint64_t data_bytes = size - 8 - header_bytes;
  DT_ASSIGN_OR_RETURN(Layout layout, ParseLayout(path, header, data_bytes));
  if (digest || (check_data && layout.metadata.contains(std::string(kCrc32Key)))) {
    uint32_t data_crc = Crc32(0, data, data_bytes);
    DT_RETURN_IF_ERROR(CheckDataCrc(path, layout.metadata, data_crc));
    if (digest)
      file.digest_ = CombineDigest(size, Crc32(0, bytes, 8 + header_bytes), data_crc, data_bytes);
  }

  file.metadata_ = std::move(layout.metadata);
  for (Layout::Tensor& t : layout.tensors) {
    file.index_[t.name] = file.names_.size();
    file.names_.push_back(std::move(t.name));
    file.views_.push_back({t.dtype, std::move(t.shape), data + t.begin, t.end - t.begin});
  }
  return file;
}

Result<FileDigest> SafetensorsFile::Verify(const std::string& path) {
  DT_ASSIGN_OR_RETURN(InputFile in, InputFile::Open(path));
  uint64_t size = in.size();
  uint8_t prefix[8] = {};
  if (size >= 8) DT_RETURN_IF_ERROR(in.Read(prefix, 8));
  DT_ASSIGN_OR_RETURN(uint64_t header_bytes, HeaderLength(path, prefix, size));
  std::string header(header_bytes, '\0');
  DT_RETURN_IF_ERROR(in.Read(header.data(), header.size()));
  uint64_t data_bytes = size - 8 - header_bytes;
  DT_ASSIGN_OR_RETURN(Layout layout, ParseLayout(path, header, data_bytes));
  DT_ASSIGN_OR_RETURN(uint32_t data_crc, StreamCrc32(in, data_bytes));
  DT_RETURN_IF_ERROR(CheckDataCrc(path, layout.metadata, data_crc));
  uint32_t head_crc = Crc32(Crc32(0, prefix, 8), header.data(), header.size());
  return CombineDigest(size, head_crc, data_crc, data_bytes);
}

Result<SafetensorsFile> SafetensorsFile::ReadHeader(const std::string& path) {
  DT_ASSIGN_OR_RETURN(InputFile in, InputFile::Open(path));
  const uint64_t size = in.size();
  uint8_t prefix[8] = {};
  if (size >= 8) DT_RETURN_IF_ERROR(in.Read(prefix, 8));
  DT_ASSIGN_OR_RETURN(uint64_t header_bytes, HeaderLength(path, prefix, size));
  std::string header(header_bytes, '\0');
  DT_RETURN_IF_ERROR(in.Read(header.data(), header.size()));
  DT_ASSIGN_OR_RETURN(Layout layout, ParseLayout(path, header, size - 8 - header_bytes));
  SafetensorsFile file;
  file.path_ = path;
  file.metadata_ = std::move(layout.metadata);
  for (Layout::Tensor& t : layout.tensors) {
    file.index_[t.name] = file.names_.size();
    file.names_.push_back(std::move(t.name));
    file.views_.push_back({t.dtype, std::move(t.shape), nullptr, t.end - t.begin});
  }
  return file;
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &views_[it->second];
}

Result<const TensorView*> SafetensorsFile::FindF32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorView* t = Find(name);
  if (t == nullptr) {
    return FileError(path_, fmt::format("tensor '{}' not found (expected F32 {})", name,
                                        ShapeString(expected_shape)));
  }
  if (t->dtype != DType::kF32 || t->shape != expected_shape) {
    return FileError(path_,
                     fmt::format("tensor '{}' is {} {}, expected F32 {}", name, DTypeName(t->dtype),
                                 ShapeString(t->shape), ShapeString(expected_shape)));
  }
  return t;
}

Status SafetensorsFile::CopyF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                                float* dst) const {
  DT_CHECK(has_data(), "CopyF32 of '{}' from a header read alone ('{}')", name, path_);
  DT_ASSIGN_OR_RETURN(const TensorView* t, FindF32(name, expected_shape));
  if (t->bytes > 0) std::memcpy(dst, t->data, t->bytes);
  return Status::Ok();
}

Status SafetensorsFile::CopyAsF32(const std::string& name,
                                  const std::vector<int64_t>& expected_shape, float* dst) const {
  DT_CHECK(has_data(), "CopyAsF32 of '{}' from a header read alone ('{}')", name, path_);
  const TensorView* t = Find(name);
  if (t == nullptr) {
    return FileError(path_, fmt::format("tensor '{}' not found (expected {})", name,
                                        ShapeString(expected_shape)));
  }
  if (t->shape != expected_shape) {
    return FileError(
        path_, fmt::format("tensor '{}' is {} {}, expected shape {}", name, DTypeName(t->dtype),
                           ShapeString(t->shape), ShapeString(expected_shape)));
  }
  const size_t n = t->bytes / DTypeSize(t->dtype);
  switch (t->dtype) {
    case DType::kF32:
      ConvertElements<float>(t->data, n, dst, [](float f) { return f; });
      return Status::Ok();
    case DType::kF16:
      ConvertElements<uint16_t>(t->data, n, dst, HalfToFloat);
      return Status::Ok();
    case DType::kBF16:
      ConvertElements<uint16_t>(t->data, n, dst,
                                [](uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); });
      return Status::Ok();
    case DType::kF64:
      ConvertElements<double>(t->data, n, dst, [](double d) { return static_cast<float>(d); });
      return Status::Ok();
    default:
      return FileError(path_, fmt::format("tensor '{}' is {}, not a floating-point type (F16, "
                                          "BF16, F32 or F64)",
                                          name, DTypeName(t->dtype)));
  }
}

}  // namespace difftrain::io
