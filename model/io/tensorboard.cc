#include "model/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "model/io/posix_file.h"

namespace difftrain::io {
namespace {

// The protocol buffer wire format, as far as Event needs it: varints, 64-bit and 32-bit
// little-endian fields and length-delimited ones.
void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void Tag(std::string& out, int field, int wire_type) {
  Varint(out, (uint64_t(field) << 3) | wire_type);
}

template <typename T>
void Fixed(std::string& out, int field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  Tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian, as the wire format is (x86, Arm)
  out.append(bytes, sizeof(T));
}

void VarintField(std::string& out, int field, uint64_t value) {
  Tag(out, field, 0);
  Varint(out, value);
}

void BytesField(std::string& out, int field, std::string_view bytes) {
  Tag(out, field, 2);
  Varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields (event.proto) and those of the messages it holds.
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
              kEventSessionLog = 7;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2, kValueImage = 4;
constexpr int kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;
constexpr int kSessionLogStatus = 1, kSessionLogStart = 1;

std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // the reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrc32cTable();
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data)
    crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

Result<TensorBoardWriter> TensorBoardWriter::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return OsError("cannot create the TensorBoard directory", dir, ec.value());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  // torch's SummaryWriter's name; a second writer of the same second and process gets .1, ….
  std::string path;
  std::FILE* file = nullptr;
  for (int n = 0; file == nullptr; ++n) {
    path = (std::filesystem::path(dir) /
            fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", seconds, host, ::getpid(), n))
               .string();
    file = std::fopen(path.c_str(), "wbx");  // x: never an existing file
    if (file == nullptr && errno != EEXIST) return OsError("cannot create", path, errno);
  }
  TensorBoardWriter writer(path, file);
  std::string body;
  BytesField(body, kEventFileVersion, "brain.Event:2");
  DT_RETURN_IF_ERROR(writer.Write(0, body));
  return writer;
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = std::exchange(other.file_, nullptr);
  }
  return *this;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TensorBoardWriter::Write(int64_t step, const std::string& body) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  Fixed(event, kEventWallTime, wall_time);
  VarintField(event, kEventStep, static_cast<uint64_t>(step));
  event += body;
  std::string record;
  const uint64_t length = event.size();
  char length_bytes[8];
  std::memcpy(length_bytes, &length, 8);
  const std::string_view length_view(length_bytes, 8);
  const uint32_t length_crc = MaskedCrc32c(length_view), data_crc = MaskedCrc32c(event);
  record.append(length_view);
  record.append(reinterpret_cast<const char*>(&length_crc), 4);
  record += event;
  record.append(reinterpret_cast<const char*>(&data_crc), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return OsError("cannot write", path_, errno);
  }
  return Status::Ok();
}

Status TensorBoardWriter::Restart(int64_t step) {
  std::string log, body;
  VarintField(log, kSessionLogStatus, kSessionLogStart);
  BytesField(body, kEventSessionLog, log);
  return Write(step, body);
}

Status TensorBoardWriter::Scalars(int64_t step,
                                  const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    BytesField(v, kValueTag, tag);
    Fixed(v, kValueSimpleValue, static_cast<float>(value));
    BytesField(summary, kSummaryValue, v);
  }
  std::string body;
  BytesField(body, kEventSummary, summary);
  return Write(step, body);
}

Status TensorBoardWriter::Image(int64_t step, const std::string& tag, const std::string& png,
                                int height, int width, int channels) {
  std::string image, v, summary, body;
  VarintField(image, kImageHeight, static_cast<uint64_t>(height));
  VarintField(image, kImageWidth, static_cast<uint64_t>(width));
  VarintField(image, kImageColorspace, static_cast<uint64_t>(channels));
  BytesField(image, kImageEncoded, png);
  BytesField(v, kValueTag, tag);
  BytesField(v, kValueImage, image);
  BytesField(summary, kSummaryValue, v);
  BytesField(body, kEventSummary, summary);
  return Write(step, body);
}

}  // namespace difftrain::io
