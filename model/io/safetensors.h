// safetensors files (https://github.com/huggingface/safetensors), the format of every
// difftrain checkpoint shard and debug dump, readable by PyTorch's `safetensors` package.
//
// Layout: an 8-byte little-endian u64 N, then N bytes of JSON header padded with spaces to a
// multiple of 8, then the data section. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section)
// and "__metadata__" to a string-to-string map. Tensors are little-endian, row-major and
// together cover the data section exactly. We add metadata key `difftrain.crc32`: the zlib
// CRC-32 of the whole data section, 8 lowercase hex digits. See docs/formats.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace difftrain::io {

// The element types of the safetensors spec (names as in the header: "F32", "BF16", ...).
enum class DType {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
std::optional<DType> ParseDType(std::string_view name);

// Bytes of a tensor of `dtype` and `shape`; nullopt for a negative dimension or a size
// that does not fit in 64 bits. A shape of [] is a scalar (one element).
std::optional<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape);

// The metadata key holding the CRC-32 of the data section, and its text form.
inline constexpr std::string_view kCrc32Key = "difftrain.crc32";
std::string Crc32Hex(uint32_t crc);
std::optional<uint32_t> ParseCrc32Hex(std::string_view text);

// Collects tensors by pointer and writes them as one safetensors file. Nothing is copied:
// every pointer given to Add must stay valid, and its data unchanged, until WriteAtomic
// returns. Tensors are written in the order they were added, each read once (its checksum
// computed as it is written).
class SafetensorsWriter {
 public:
  // A duplicate name, a negative dimension or a null `data` for a non-empty tensor is a
  // programming error. `data` holds TensorBytes(dtype, shape) bytes.
  void Add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  void AddF32(std::string name, std::vector<int64_t> shape, const float* data);
  // A point in the data: WriteAtomic runs `fill` once every tensor added before it is written
  // and before any tensor added after it is read, so those may point into a buffer that `fill`
  // fills (a checkpoint gathered one arena at a time into one buffer). A failed fill fails the
  // write. Their data need be valid only from their fill on; a writer with fills is written once.
  void AddFill(std::function<Status()> fill);
  // `kCrc32Key` is reserved: WriteAtomic sets it.
  void SetMetadata(std::string key, std::string value);

  // Writes the file to `path + ".tmp.<pid>"`, fsyncs it, renames it over `path` and fsyncs
  // the directory, so `path` is always either the old file or the complete new one.
  Status WriteAtomic(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    uint64_t bytes;
  };
  std::string Header(uint32_t data_crc) const;

  std::vector<Entry> tensors_;
  // Each fill with the number of tensors added before it, in the order they were added.
  std::vector<std::pair<size_t, std::function<Status()>>> fills_;
  std::unordered_set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// One tensor of a file that was read. `data` points into the file's buffer and may be
// unaligned for files written elsewhere (a U8 tensor before an F32 one): copy it out with
// memcpy rather than dereferencing it as a typed pointer.
struct TensorView {
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  uint64_t bytes;
};

// Size and CRC-32 of a whole file (header included), as checkpoint manifests record them.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// A safetensors file read whole into memory and validated: the header parses, every dtype
// is known, every tensor's offsets match its dtype and shape, tensors neither overlap nor
// leave gaps, and the data matches `difftrain.crc32` when that key is present. Every error
// names the file and what is wrong with it. Move-only: the views point into its buffer.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Read(const std::string& path);
  // The same over a read-only memory map of the file instead of a copy: weights of another
  // origin read once (pretrained weights, a VAE, a text encoder), which need no digest. The data
  // is checked against `difftrain.crc32` where the file has it; digest() is empty. The file must
  // not shrink while it is mapped (difftrain replaces files by renaming, which keeps it).
  // `check_data` false: the caller has just verified the file (CheckpointStore::LatestComplete),
  // and nothing is read until a tensor is.
  static Result<SafetensorsFile> Map(const std::string& path, bool check_data = true);
  // Validates `path` exactly as Read does while streaming it in pieces, so a checkpoint of
  // many gigabytes can be checked without holding it in memory.
  static Result<FileDigest> Verify(const std::string& path);
  // The header alone, validated as Read validates it (names, dtypes, shapes, offsets that
  // tile the data section; not the checksum): what a launcher checks a file of gigabytes
  // against a model with. Its views have no data (has_data() is false).
  static Result<SafetensorsFile> ReadHeader(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor names in the order of their data in the file.
  const std::vector<std::string>& Names() const { return names_; }
  // nullptr when there is no tensor of that name.
  const TensorView* Find(const std::string& name) const;
  // The tensor `name` if it is F32 of `expected_shape`, else an error naming the file and what
  // it holds instead.
  Result<const TensorView*> FindF32(const std::string& name,
                                    const std::vector<int64_t>& expected_shape) const;
  // Copies tensor `name` to `dst`; an error names the file and the tensor when it is
  // missing or is not F32 of exactly `expected_shape`.
  Status CopyF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                 float* dst) const;
  // The same for a floating-point tensor of any width (F16, BF16, F32, F64), converted to
  // fp32: F16 and BF16 exactly, F64 rounded to nearest. Other dtypes are an error naming it.
  Status CopyAsF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                   float* dst) const;
  bool has_data() const { return bytes_ != nullptr; }
  // A mapped file gives back the pages of [data, data + bytes) (of one of its views) that this
  // process has read: a later read maps them again from the page cache. So reading a file of
  // many gigabytes piece by piece keeps little of it resident. Nothing for a file in memory.
  void Forget(const void* data, uint64_t bytes) const;
  const FileDigest& digest() const { return digest_; }

 private:
  SafetensorsFile() = default;
  // The file of `size` bytes at `whole`: validated; its digest computed where asked.
  static Result<SafetensorsFile> FromBytes(const std::string& path,
                                           std::shared_ptr<const uint8_t> whole, uint64_t size,
                                           bool digest, bool check_data = true);

  std::string path_;
  // The whole file: a heap copy (Read) or a memory map (Map), released with it.
  std::shared_ptr<const uint8_t> bytes_;
  bool mapped_ = false;
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> names_;
  std::vector<TensorView> views_;  // parallel to names_
  std::unordered_map<std::string, size_t> index_;
  FileDigest digest_;
};

}  // namespace difftrain::io
