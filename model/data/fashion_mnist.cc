#include "model/data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "model/io/posix_file.h"

namespace difftrain {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
// Data is read in pieces of this size, so a corrupt count in a header makes a "truncated"
// error rather than one huge allocation.
constexpr size_t kReadChunkBytes = size_t{16} << 20;

Status IdxError(const std::string& path, const std::string& what) {
  return Errorf("IDX file '{}': {}", path, what);
}

// An IDX file opened through zlib's gzFile, which reads gzip'ed and plain files alike.
class IdxReader {
 public:
  static Result<IdxReader> Open(const std::string& path) {
    errno = 0;
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) return io::OsError("cannot open IDX file", path, errno ? errno : ENOMEM);
    gzbuffer(file, 1 << 20);
    return IdxReader(path, file);
  }
  IdxReader(IdxReader&& other) noexcept
      : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}
  IdxReader& operator=(IdxReader&&) = delete;
  ~IdxReader() {
    if (file_ != nullptr) gzclose(file_);
  }

  // The magic number and `ndims` big-endian dimensions that follow it.
  Result<std::vector<uint32_t>> ReadHeader(uint32_t expected_magic, int ndims) {
    const size_t header_bytes = 4 * (1 + static_cast<size_t>(ndims));
    std::vector<uint8_t> header;
    DT_RETURN_IF_ERROR(Read(header_bytes, header));
    if (header.size() < header_bytes) {
      return IdxError(path_, fmt::format("truncated: the header needs {} bytes, the file has {}",
                                         header_bytes, header.size()));
    }
    std::vector<uint32_t> words(1 + ndims);
    for (size_t i = 0; i < words.size(); ++i) {
      const uint8_t* b = header.data() + 4 * i;
      words[i] = uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3];
    }
    if (words[0] != expected_magic) {
      return IdxError(
          path_, fmt::format("bad magic 0x{:08x}, expected 0x{:08x}", words[0], expected_magic));
    }
    return std::vector<uint32_t>(words.begin() + 1, words.end());
  }

  // Exactly `bytes` bytes of data that end the file.
  Result<std::vector<uint8_t>> ReadBody(uint64_t bytes, const std::string& what) {
    std::vector<uint8_t> body;
    DT_RETURN_IF_ERROR(Read(bytes, body));
    if (body.size() < bytes) {
      return IdxError(path_, fmt::format("truncated: {} needs {} bytes of data, the file has {}",
                                         what, bytes, body.size()));
    }
    std::vector<uint8_t> extra;
    DT_RETURN_IF_ERROR(Read(1, extra));
    if (!extra.empty()) {
      return IdxError(path_, fmt::format("trailing bytes after the {} bytes of {}", bytes, what));
    }
    return body;
  }

 private:
  IdxReader(std::string path, gzFile file) : path_(std::move(path)), file_(file) {}

  // Appends up to `bytes` bytes to `out`; fewer only at the end of the file. A damaged gzip
  // stream, or one cut off in the middle, is an error.
  Status Read(uint64_t bytes, std::vector<uint8_t>& out) {
    uint64_t done = 0;
    while (done < bytes) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes - done, kReadChunkBytes));
      const size_t old_size = out.size();
      out.resize(old_size + chunk);
      const int n = gzread(file_, out.data() + old_size, static_cast<unsigned>(chunk));
      if (n < 0) return IdxError(path_, fmt::format("cannot decompress: {}", ErrorText()));
      out.resize(old_size + static_cast<size_t>(n));
      done += static_cast<uint64_t>(n);
      if (static_cast<size_t>(n) < chunk) break;
    }
    int code = Z_OK;
    gzerror(file_, &code);
    if (code == Z_BUF_ERROR) return IdxError(path_, "truncated: the gzip stream ends early");
    if (code != Z_OK) return IdxError(path_, fmt::format("cannot decompress: {}", ErrorText()));
    return Status::Ok();
  }

  std::string ErrorText() {
    int code = Z_OK;
    const char* text = gzerror(file_, &code);
    if (code == Z_ERRNO) return std::strerror(errno);
    return text != nullptr ? text : "unknown zlib error";
  }

  std::string path_;
  gzFile file_ = nullptr;
};

std::string SplitPrefix(const std::string& split) {
  if (split == "train") return "train";
  if (split == "test") return "t10k";
  return "";
}

}  // namespace

Result<IdxImages> ReadIdxImages(const std::string& path) {
  DT_ASSIGN_OR_RETURN(IdxReader reader, IdxReader::Open(path));
  DT_ASSIGN_OR_RETURN(std::vector<uint32_t> dims, reader.ReadHeader(kIdxImagesMagic, 3));
  // Each dimension fits in 32 bits, their product perhaps not in 64 (it would wrap to the size
  // of a short body); a row or column count past an int is no image either.
  uint64_t bytes = 0;
  if (dims[1] > INT32_MAX || dims[2] > INT32_MAX ||
      __builtin_mul_overflow(uint64_t{dims[0]} * dims[1], uint64_t{dims[2]}, &bytes)) {
    return IdxError(path, fmt::format("{}×{}×{} images are more bytes than a file holds", dims[0],
                                      dims[1], dims[2]));
  }
  IdxImages images;
  images.count = dims[0];
  images.rows = static_cast<int>(dims[1]);
  images.cols = static_cast<int>(dims[2]);
  DT_ASSIGN_OR_RETURN(images.pixels, reader.ReadBody(bytes, fmt::format("{}×{}×{} images", dims[0],
                                                                        dims[1], dims[2])));
  return images;
}

Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path) {
  DT_ASSIGN_OR_RETURN(IdxReader reader, IdxReader::Open(path));
  DT_ASSIGN_OR_RETURN(std::vector<uint32_t> dims, reader.ReadHeader(kIdxLabelsMagic, 1));
  return reader.ReadBody(dims[0], fmt::format("{} labels", dims[0]));
}

Result<std::unique_ptr<FashionMnistDataset>> FashionMnistDataset::Load(const std::string& dir,
                                                                       const std::string& split) {
  const std::string prefix = SplitPrefix(split);
  if (prefix.empty()) {
    return Errorf("Fashion-MNIST split '{}' does not exist (expected train or test)", split);
  }
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  DT_ASSIGN_OR_RETURN(IdxImages images, ReadIdxImages(images_path));
  DT_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadIdxLabels(labels_path));

  if (images.rows != kRawSize || images.cols != kRawSize) {
    return IdxError(images_path, fmt::format("images are {}×{}, Fashion-MNIST's are {}×{}",
                                             images.rows, images.cols, kRawSize, kRawSize));
  }
  if (images.count == 0) return IdxError(images_path, "holds no images");
  if (static_cast<int64_t>(labels.size()) != images.count) {
    return IdxError(labels_path, fmt::format("count mismatch: {} labels for the {} images of '{}'",
                                             labels.size(), images.count, images_path));
  }
  auto bad = std::find_if(labels.begin(), labels.end(), [](uint8_t y) { return y >= kNumClasses; });
  if (bad != labels.end()) {
    return IdxError(labels_path, fmt::format("label {} of sample {} is not below {}", *bad,
                                             bad - labels.begin(), kNumClasses));
  }
  return std::unique_ptr<FashionMnistDataset>(
      new FashionMnistDataset(std::move(images.pixels), std::move(labels)));
}

Status FashionMnistDataset::Get(int64_t index, float* image, int32_t* label) const {
  const uint8_t* src = pixels_.data() + index * kRawSize * kRawSize;
  std::fill(image, image + kSize * kSize, -1.0f);
  for (int y = 0; y < kRawSize; ++y) {
    float* row = image + (y + kPadding) * kSize + kPadding;
    for (int x = 0; x < kRawSize; ++x)
      row[x] = static_cast<float>(src[y * kRawSize + x]) / 127.5f - 1.0f;
  }
  *label = labels_[index];
  return Status::Ok();
}

}  // namespace difftrain
