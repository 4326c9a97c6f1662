#include "model/io/gif.h"

#include <algorithm>

#include "model/io/posix_file.h"

namespace difftrain::io {
namespace {

constexpr int kMinCodeSize = 8;  // palette indices are bytes
constexpr int kClear = 1 << kMinCodeSize, kEnd = kClear + 1, kFirstFree = kClear + 2;
constexpr int kMaxCodes = 4096;  // codes are at most 12 bits

// Codes packed least significant bit first.
class BitWriter {
 public:
  void Put(int code, int bits) {
    buffer_ |= static_cast<uint32_t>(code) << count_;
    count_ += bits;
    while (count_ >= 8) {
      out_.push_back(static_cast<uint8_t>(buffer_ & 0xff));
      buffer_ >>= 8;
      count_ -= 8;
    }
  }
  std::vector<uint8_t> Finish() {
    if (count_ > 0) out_.push_back(static_cast<uint8_t>(buffer_ & 0xff));
    buffer_ = 0;
    count_ = 0;
    return std::move(out_);
  }

 private:
  std::vector<uint8_t> out_;
  uint32_t buffer_ = 0;
  int count_ = 0;
};

void Put16(std::string& out, int v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
}

}  // namespace

std::vector<uint8_t> GifLzw(const uint8_t* indices, size_t n) {
  BitWriter bits;
  // next_[code · 256 + byte]: the code of string(code) + byte, or 0 when not in the table.
  std::vector<uint16_t> next(size_t{kMaxCodes} * 256, 0);
  int size = kMinCodeSize + 1, free_code = kFirstFree;
  auto reset = [&] {
    std::fill(next.begin(), next.end(), 0);
    size = kMinCodeSize + 1;
    free_code = kFirstFree;
  };
  bits.Put(kClear, size);
  if (n > 0) {
    int current = indices[0];
    for (size_t i = 1; i < n; ++i) {
      const uint8_t byte = indices[i];
      uint16_t& entry = next[size_t(current) * 256 + byte];
      if (entry != 0) {
        current = entry;
        continue;
      }
      bits.Put(current, size);
      entry = static_cast<uint16_t>(free_code++);
      // The decoder adds this entry one code later; it widens its codes once its next free
      // code reaches 1 << size, which for the encoder is one code more.
      if (free_code > (1 << size) && size < 12) ++size;
      if (free_code == kMaxCodes) {  // table full: start over
        bits.Put(kClear, size);
        reset();
      }
      current = byte;
    }
    bits.Put(current, size);
    // Reading that last code the decoder adds its last entry, and may widen: so must we.
    if (free_code == (1 << size) && size < 12) ++size;
  }
  bits.Put(kEnd, size);
  return bits.Finish();
}

Status WriteGif(const std::string& path, const std::vector<const uint8_t*>& frames, int width,
                int height, int channels, int delay_cs) {
  if (width < 1 || height < 1 || width > 65535 || height > 65535)
    return Errorf("'{}': a GIF of {}x{} pixels cannot be written", path, width, height);
  if (channels != 1 && channels != 3)
    return Errorf("'{}': a GIF needs 1 or 3 channels, got {}", path, channels);
  if (frames.empty()) return Errorf("'{}': a GIF needs at least one frame", path);

  std::string out = "GIF89a";
  Put16(out, width);
  Put16(out, height);
  out.push_back(static_cast<char>(0xf7));  // a global colour table of 2^(7+1) entries
  out.push_back(0);                        // background colour
  out.push_back(0);                        // pixel aspect ratio: unspecified
  for (int i = 0; i < 256; ++i) {
    // Grey: level i. RGB: 3 bits red, 3 green, 2 blue.
    const int r = channels == 1 ? i : (i >> 5) * 255 / 7;
    const int g = channels == 1 ? i : ((i >> 2) & 7) * 255 / 7;
    const int b = channels == 1 ? i : (i & 3) * 255 / 3;
    out.push_back(static_cast<char>(r));
    out.push_back(static_cast<char>(g));
    out.push_back(static_cast<char>(b));
  }
  // Loop forever.
  out += std::string("\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00", 19);
  const size_t pixels = size_t(width) * height;
  std::vector<uint8_t> indices(pixels);
  for (const uint8_t* frame : frames) {
    for (size_t p = 0; p < pixels; ++p) {
      const uint8_t* px = frame + p * channels;
      indices[p] = channels == 1 ? px[0]
                                 : static_cast<uint8_t>(((px[0] * 7 + 127) / 255) << 5 |
                                                        ((px[1] * 7 + 127) / 255) << 2 |
                                                        ((px[2] * 3 + 127) / 255));
    }
    // Graphic control: no transparency, the frame's delay.
    out += std::string("\x21\xf9\x04\x00", 4);
    Put16(out, delay_cs);
    out += std::string("\x00\x00", 2);
    // Image descriptor: the whole canvas, no local colour table.
    out.push_back(0x2c);
    Put16(out, 0);
    Put16(out, 0);
    Put16(out, width);
    Put16(out, height);
    out.push_back(0);
    out.push_back(static_cast<char>(kMinCodeSize));
    const std::vector<uint8_t> code = GifLzw(indices.data(), pixels);
    for (size_t at = 0; at < code.size(); at += 255) {
      const size_t block = std::min<size_t>(255, code.size() - at);
      out.push_back(static_cast<char>(block));
      out.append(reinterpret_cast<const char*>(code.data() + at), block);
    }
    out.push_back(0);  // end of the image's sub-blocks
  }
  out.push_back(0x3b);  // trailer
  DT_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  DT_RETURN_IF_ERROR(file.Append(out.data(), out.size()));
  return file.Commit();
}

}  // namespace difftrain::io
