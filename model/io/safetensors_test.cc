#include "model/io/safetensors.h"
#include "common/temp_dir.h"
#include "model/io/half.h"

#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain::io {
namespace {

namespace fs = std::filesystem;

constexpr DType kAllDTypes[] = {
    DType::kBool, DType::kU8,  DType::kI8,  DType::kF8E5M2, DType::kF8E4M3,
    DType::kI16,  DType::kU16, DType::kF16, DType::kBF16,   DType::kI32,
    DType::kU32,  DType::kF32, DType::kI64, DType::kU64,    DType::kF64,
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file as the spec lays it out: length prefix, header padded with spaces, data.
std::string BuildFile(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  std::string prefix(8, '\0');
  std::memcpy(prefix.data(), &n, 8);
  return prefix + header + data;
}

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes a small valid file with two F32 tensors and returns its path.
  std::string WriteSample() {
    SafetensorsWriter writer;
    writer.AddF32("a", {2, 3}, a_.data());
    writer.AddF32("b", {4}, b_.data());
    std::string path = Path("sample.safetensors");
    EXPECT_TRUE(writer.WriteAtomic(path).ok());
    return path;
  }

  // Both readers must refuse `path` with a message naming it and containing `reason`.
  void ExpectRejected(const std::string& path, const std::string& reason) {
    Result<SafetensorsFile> read = SafetensorsFile::Read(path);
    ASSERT_FALSE(read.ok());
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status().message();
    EXPECT_NE(read.status().message().find(reason), std::string::npos) << read.status().message();
    Result<FileDigest> verify = SafetensorsFile::Verify(path);
    ASSERT_FALSE(verify.ok());
    EXPECT_EQ(verify.status().message(), read.status().message());
    Result<SafetensorsFile> mapped = SafetensorsFile::Map(path);
    ASSERT_FALSE(mapped.ok());
    EXPECT_EQ(mapped.status().message(), read.status().message());
  }

  TempDir temp_{"safetensors_test"};
  std::string dir_ = temp_.path();
  std::vector<float> a_ = {1, 2, 3, 4, 5, 6};
  std::vector<float> b_ = {-1, -2, -3, -4};
};

// The integer conversion (what a compiler without _Float16 loads F16 tensors with: clang 14
// building the fuzz targets) gives the compiler's value for every one of the 65,536 bit patterns,
// bit for bit; NaNs stay NaNs of the same sign.
TEST(HalfTest, TheIntegerConversionEqualsTheCompilersForEveryBitPattern) {
  static_assert(HalfBitsToFloat(0x3c00) == 1.0f && HalfBitsToFloat(0x0001) == 0x1p-24f &&
                HalfBitsToFloat(0x7bff) == 65504.0f && HalfBitsToFloat(0x8400) == -0x1p-14f);
  int nans = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float expected = static_cast<float>(std::bit_cast<_Float16>(h));
    const float got = HalfBitsToFloat(h);
    if (std::isnan(expected)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
      EXPECT_EQ(std::signbit(got), std::signbit(expected)) << std::hex << bits;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected))
          << std::hex << bits;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);  // exponent 31, mantissa not zero, either sign
}

// `export --dtype`'s rounding, held to its definition rather than to another conversion: each
// float goes to the nearer of the two representable values around it (of 16-bit patterns
// decoded exactly: HalfBitsToFloat, bf16 bits << 16), a tie to the one with an even last bit;
// beyond the largest value, to infinity where IEEE's rounding goes; a NaN stays a NaN. Floats:
// every value of the 16-bit grids, the midpoints between neighbours and just either side of
// them, and random bit patterns.
TEST(HalfTest, RoundFloatsGoesToTheNearestValueTiesToEven) {
  auto bf16_value = [](uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); };
  // The positive, finite values of each format, ascending: F16 0x0000..0x7bff, BF16 ..0x7f7f.
  auto expected = [&](float x, bool bf16) -> uint16_t {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(double(x));
    const uint16_t last = bf16 ? 0x7f7f : 0x7bff;
    auto value = [&](uint16_t b) { return double(bf16 ? bf16_value(b) : HalfBitsToFloat(b)); };
    uint16_t lo = 0, hi = last;  // the largest value <= a, by bisection
    if (a >= value(last)) {
      lo = last;
    } else {
      while (hi - lo > 1) {
        const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
        (value(mid) <= a ? lo : hi) = mid;
      }
    }
    const double below = value(lo);
    // Past the largest value, the next step up is infinity (0x7c00, 0x7f80), one ulp on.
    const double above = lo == last ? below + (below - value(lo - 1)) : value(lo + 1);
    const uint16_t up = lo == last ? (bf16 ? 0x7f80 : 0x7c00) : static_cast<uint16_t>(lo + 1);
    if (a == below) return sign | lo;
    const double to_below = a - below, to_above = above - a;
    if (to_below < to_above || (to_below == to_above && (lo & 1) == 0)) return sign | lo;
    return sign | up;
  };
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1e-10f,
                           -1e-10f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           1e30f,
                           -1e30f,
                           3.3895314e38f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float v = HalfBitsToFloat(static_cast<uint16_t>(b));
    const float mid = float((double(v) + double(HalfBitsToFloat(uint16_t(b + 1)))) / 2);
    for (const float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (uint32_t b = 0; b < 0x7f80; b += 7) {
    const float v = bf16_value(static_cast<uint16_t>(b));
    const float mid = std::bit_cast<float>((b << 16) | 0x8000u);
    for (const float x : {v, mid, std::nextafter(mid, 0.0f),
                          std::nextafter(mid, std::numeric_limits<float>::infinity())})
      xs.push_back(x);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  for (const bool bf16 : {false, true}) {
    std::vector<uint16_t> got(xs.size());
    RoundFloats(xs.data(), xs.size(), bf16, got.data());
    int bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (got[i] != expected(xs[i], bf16) && ++bad <= 10) {
        ADD_FAILURE() << (bf16 ? "bf16 " : "fp16 ") << std::hexfloat << xs[i] << ": got 0x"
                      << std::hex << got[i] << ", expected 0x" << expected(xs[i], bf16);
      }
    }
    EXPECT_EQ(bad, 0) << (bf16 ? "bf16" : "fp16");
    const float nan[2] = {std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::signaling_NaN()};
    uint16_t nan_bits[2];
    RoundFloats(nan, 2, bf16, nan_bits);
    for (const uint16_t h : nan_bits)
      EXPECT_TRUE(std::isnan(bf16 ? bf16_value(h) : HalfBitsToFloat(h))) << std::hex << h;
  }
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeAndMetadata) {
  SafetensorsWriter writer;
  std::vector<std::vector<uint8_t>> payloads;
  for (DType dtype : kAllDTypes) {
    std::vector<uint8_t>& bytes = payloads.emplace_back(*TensorBytes(dtype, {2, 3}));
    std::iota(bytes.begin(), bytes.end(), static_cast<uint8_t>(dtype));
    writer.Add("t." + std::string(DTypeName(dtype)), dtype, {2, 3}, bytes.data());
  }
  float scalar = 7.5f;
  writer.AddF32("scalar", {}, &scalar);
  writer.AddF32("empty", {0, 4}, nullptr);
  writer.SetMetadata("format", "test");
  writer.SetMetadata("config", R"({"depth":2})");
  std::string path = Path("all.safetensors");
  ASSERT_TRUE(writer.WriteAtomic(path).ok());

  Result<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->Names().size(), std::size(kAllDTypes) + 2);
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    std::string name = "t." + std::string(DTypeName(kAllDTypes[i]));
    EXPECT_EQ(file->Names()[i], name);
    const TensorView* t = file->Find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, kAllDTypes[i]);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(t->bytes, payloads[i].size());
    EXPECT_EQ(std::memcmp(t->data, payloads[i].data(), t->bytes), 0) << name;
  }
  float scalar_back = 0;
  EXPECT_TRUE(file->CopyF32("scalar", {}, &scalar_back).ok());
  EXPECT_EQ(scalar_back, 7.5f);
  EXPECT_EQ(file->Find("empty")->bytes, 0u);
  EXPECT_EQ(file->Find("missing"), nullptr);
  EXPECT_EQ(file->metadata().at("format"), "test");
  EXPECT_EQ(file->metadata().at("config"), R"({"depth":2})");
  EXPECT_EQ(file->metadata().count(std::string(kCrc32Key)), 1u);

  Result<FileDigest> digest = SafetensorsFile::Verify(path);
  ASSERT_TRUE(digest.ok()) << digest.status().message();
  std::string raw = ReadBytes(path);
  EXPECT_EQ(digest->bytes, raw.size());
  EXPECT_EQ(digest->crc32, crc32(0, reinterpret_cast<const Bytef*>(raw.data()), raw.size()));
  EXPECT_EQ(file->digest().bytes, digest->bytes);
  EXPECT_EQ(file->digest().crc32, digest->crc32);
}

// Regression: zlib's crc32 returns its initial value for a null buffer, so an empty tensor
// added without a data pointer used to reset the checksum of everything before it.
// A memory map reads what Read reads (the checksum checked where the file has one), without a
// digest.
TEST_F(SafetensorsTest, MapReadsWhatReadReads) {
  const std::string path = WriteSample();
  Result<SafetensorsFile> read = SafetensorsFile::Read(path);
  Result<SafetensorsFile> mapped = SafetensorsFile::Map(path);
  ASSERT_TRUE(read.ok() && mapped.ok());
  EXPECT_EQ(mapped->Names(), read->Names());
  EXPECT_EQ(mapped->metadata(), read->metadata());
  for (const std::string& name : read->Names()) {
    const TensorView* a = read->Find(name);
    const TensorView* b = mapped->Find(name);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(a->shape, b->shape);
    ASSERT_EQ(a->bytes, b->bytes);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->bytes), 0) << name;
  }
  EXPECT_EQ(mapped->digest().bytes, 0u);
  EXPECT_EQ(read->digest().bytes, fs::file_size(path));
}

TEST_F(SafetensorsTest, EmptyTensorWithoutDataKeepsTheChecksum) {
  SafetensorsWriter writer;
  writer.AddF32("a", {6}, a_.data());
  writer.AddF32("empty", {0}, nullptr);
  ASSERT_TRUE(writer.WriteAtomic(Path("e.safetensors")).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Read(Path("e.safetensors"));
  EXPECT_TRUE(file.ok()) << file.status().message();
}

TEST_F(SafetensorsTest, WritesTheExactBytesOfTheSpec) {
  std::vector<float> w = {1.0f, -2.0f};
  SafetensorsWriter writer;
  writer.AddF32("w", {2}, w.data());
  writer.SetMetadata("a", "b");
  std::string path = Path("exact.safetensors");
  ASSERT_TRUE(writer.WriteAtomic(path).ok());

  std::string data = FloatBytes(w);
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08lx",
                crc32(0, reinterpret_cast<const Bytef*>(data.data()), 8));
  std::string json = std::string(R"({"__metadata__":{"a":"b","difftrain.crc32":")") + crc +
                     R"("},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string raw = ReadBytes(path);
  EXPECT_EQ(raw, BuildFile(json, data));
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + 8);
  EXPECT_EQ(raw[8 + json.size()], ' ');  // 108 bytes of JSON pad to 112
}

TEST_F(SafetensorsTest, ReadsAHandBuiltFileInAnyHeaderOrder) {
  // As another writer might produce it: keys in another order, no checksum, a U8 tensor
  // that leaves the F32 one unaligned.
  std::string header = R"({"b":{"data_offsets":[3,11],"dtype":"F32","shape":[2]},)"
                       R"("__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[3],)"
                       R"("data_offsets":[0,3]}})";
  std::string path = Path("hand.safetensors");
  WriteBytes(path, BuildFile(header, std::string("\x01\x02\x03", 3) + FloatBytes({0.5f, 8.0f})));

  Result<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  std::vector<float> b(2);
  ASSERT_TRUE(file->CopyF32("b", {2}, b.data()).ok());
  EXPECT_EQ(b, (std::vector<float>{0.5f, 8.0f}));
  EXPECT_EQ(static_cast<const uint8_t*>(file->Find("a")->data)[2], 3);
}

TEST_F(SafetensorsTest, ReplacesAnExistingFileAndLeavesNoTemporary) {
  WriteSample();
  a_[0] = 42;
  std::string path = WriteSample();
  std::vector<float> a(6);
  Result<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(file->CopyF32("a", {2, 3}, a.data()).ok());
  EXPECT_EQ(a[0], 42);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsTest, WriteIntoAMissingDirectoryNamesThePath) {
  SafetensorsWriter writer;
  writer.AddF32("a", {6}, a_.data());
  std::string path = Path("no/such/dir/x.safetensors");
  Status status = writer.WriteAtomic(path);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path), std::string::npos) << status.message();
}

TEST_F(SafetensorsTest, FillsRefillOneBufferBetweenTheTensorsThatPointIntoIt) {
  // Three tensors of 1.2 MB (more than one piece of the write) over one buffer, each filled
  // just before it is written, as a checkpoint gathers one arena at a time.
  constexpr int64_t kN = 300000;
  std::vector<float> buffer(kN);
  std::vector<std::string> log;
  SafetensorsWriter writer;
  for (int i = 0; i < 3; ++i) {
    writer.AddFill([&, i] {
      log.push_back("fill " + std::to_string(i));
      for (int64_t k = 0; k < kN; ++k)
        buffer[k] = float(i * kN + k);
      return Status::Ok();
    });
    writer.AddF32("x" + std::to_string(i), {kN}, buffer.data());
  }
  writer.AddF32("a", {6}, a_.data());
  writer.AddFill([&] {
    log.push_back("end");
    return Status::Ok();
  });
  const std::string path = Path("fills.safetensors");
  ASSERT_TRUE(writer.WriteAtomic(path).ok());
  EXPECT_EQ(log, (std::vector<std::string>{"fill 0", "fill 1", "fill 2", "end"}));

  Result<SafetensorsFile> file = SafetensorsFile::Read(path);  // checks difftrain.crc32
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::vector<float> x(kN);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(file->CopyF32("x" + std::to_string(i), {kN}, x.data()).ok());
    for (int64_t k : {int64_t{0}, kN / 2, kN - 1})
      EXPECT_EQ(x[k], float(i * kN + k)) << i << " " << k;
  }
}

TEST_F(SafetensorsTest, AFailedFillFailsTheWriteAndLeavesNoFile) {
  SafetensorsWriter writer;
  writer.AddF32("a", {6}, a_.data());
  bool later = false;
  writer.AddFill([] { return Errorf("rank 3 sent nothing"); });
  writer.AddFill([&] {
    later = true;
    return Status::Ok();
  });
  writer.AddF32("b", {4}, b_.data());
  const std::string path = Path("failed.safetensors");
  const Status status = writer.WriteAtomic(path);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rank 3 sent nothing"), std::string::npos) << status.message();
  EXPECT_FALSE(later);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

TEST_F(SafetensorsTest, CopyF32NamesTheTensorAndTheMismatch) {
  Result<SafetensorsFile> file = SafetensorsFile::Read(WriteSample());
  ASSERT_TRUE(file.ok());
  std::vector<float> dst(6);
  Status missing = file->CopyF32("c", {2, 3}, dst.data());
  EXPECT_NE(missing.message().find("tensor 'c' not found"), std::string::npos);
  EXPECT_NE(missing.message().find(file->path()), std::string::npos);
  Status shape = file->CopyF32("a", {3, 2}, dst.data());
  EXPECT_NE(shape.message().find("tensor 'a' is F32 [2, 3], expected F32 [3, 2]"),
            std::string::npos)
      << shape.message();

  int32_t ints[2] = {1, 2};
  SafetensorsWriter writer;
  writer.Add("i", DType::kI32, {2}, ints);
  ASSERT_TRUE(writer.WriteAtomic(Path("i.safetensors")).ok());
  Result<SafetensorsFile> int_file = SafetensorsFile::Read(Path("i.safetensors"));
  ASSERT_TRUE(int_file.ok());
  Status dtype = int_file->CopyF32("i", {2}, dst.data());
  EXPECT_NE(dtype.message().find("tensor 'i' is I32 [2], expected F32 [2]"), std::string::npos)
      << dtype.message();
}

TEST_F(SafetensorsTest, CopyAsF32ConvertsEveryFloatingPointWidthExactly) {
  // F16: 1, -2, the smallest subnormal 2^-24, the largest finite 65504, -infinity; after a U8
  // tensor of 3 bytes, so its elements are not 2-byte aligned in the buffer.
  const uint16_t halves[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0xfc00};
  // BF16: 1, -0.5, 2^100.
  const uint16_t bf16[3] = {0x3f80, 0xbf00, 0x7180};
  const double doubles[2] = {0.1, -3.0};
  const float floats[2] = {1.5f, -7.25f};
  const uint8_t bytes[3] = {1, 2, 3};
  const int32_t ints[1] = {4};
  SafetensorsWriter writer;
  writer.Add("u8", DType::kU8, {3}, bytes);
  writer.Add("f16", DType::kF16, {5}, halves);
  writer.Add("bf16", DType::kBF16, {3}, bf16);
  writer.Add("f64", DType::kF64, {2}, doubles);
  writer.Add("f32", DType::kF32, {2}, floats);
  writer.Add("i32", DType::kI32, {1}, ints);
  ASSERT_TRUE(writer.WriteAtomic(Path("widths.safetensors")).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Read(Path("widths.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().message();

  std::vector<float> out(5);
  ASSERT_TRUE(file->CopyAsF32("f16", {5}, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f,
                                     -std::numeric_limits<float>::infinity()}));
  out.assign(3, 0);
  ASSERT_TRUE(file->CopyAsF32("bf16", {3}, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -0.5f, std::ldexp(1.0f, 100)}));
  out.assign(2, 0);
  ASSERT_TRUE(file->CopyAsF32("f64", {2}, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.1f, -3.0f}));
  ASSERT_TRUE(file->CopyAsF32("f32", {2}, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -7.25f}));

  const Status integer = file->CopyAsF32("i32", {1}, out.data());
  EXPECT_NE(integer.message().find("tensor 'i32' is I32, not a floating-point type"),
            std::string::npos)
      << integer.message();
  const Status shape = file->CopyAsF32("f16", {1, 5}, out.data());
  EXPECT_NE(shape.message().find("tensor 'f16' is F16 [5], expected shape [1, 5]"),
            std::string::npos)
      << shape.message();
}

TEST_F(SafetensorsTest, ReadHeaderChecksTheLayoutButNotTheData) {
  const std::string path = WriteSample();
  Result<SafetensorsFile> header = SafetensorsFile::ReadHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_FALSE(header->has_data());
  ASSERT_NE(header->Find("a"), nullptr);
  EXPECT_EQ(header->Find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header->Find("a")->bytes, 24u);
  EXPECT_EQ(header->Names().size(), 2u);

  // A flipped data byte fails Read's checksum, not ReadHeader.
  std::string raw;
  {
    std::ifstream in(path, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  raw.back() ^= 0x40;
  WriteBytes(Path("flipped"), raw);
  EXPECT_FALSE(SafetensorsFile::Read(Path("flipped")).ok());
  EXPECT_TRUE(SafetensorsFile::ReadHeader(Path("flipped")).ok());
  // A header that does not tile the data section fails both.
  WriteBytes(Path("gap"), BuildFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                    FloatBytes({1, 2})));
  const Result<SafetensorsFile> gap = SafetensorsFile::ReadHeader(Path("gap"));
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("data section bytes [0, 4) belong to no tensor"),
            std::string::npos)
      << gap.status().message();
}

// ---- Corrupt and malformed files: every one is refused with the path and the reason ----

TEST_F(SafetensorsTest, RejectsAMissingFile) {
  ExpectRejected(Path("absent.safetensors"), "No such file or directory");
}

TEST_F(SafetensorsTest, RejectsAFileShorterThanTheLengthPrefix) {
  WriteBytes(Path("short"), "12345");
  ExpectRejected(Path("short"), "file is 5 bytes, shorter than the 8-byte header length");
}

TEST_F(SafetensorsTest, RejectsAHeaderLengthBeyondTheFile) {
  std::string raw = BuildFile("{}", "");
  uint64_t n = 1000;
  std::memcpy(raw.data(), &n, 8);
  WriteBytes(Path("long"), raw);
  ExpectRejected(Path("long"), "header length 1000 is larger than the 8 bytes after it");
}

TEST_F(SafetensorsTest, RejectsAHeaderThatIsNotJson) {
  WriteBytes(Path("f"), BuildFile(R"({"a": not json)", ""));
  ExpectRejected(Path("f"), "header is not valid JSON");
  WriteBytes(Path("g"), BuildFile("[1, 2]", ""));
  ExpectRejected(Path("g"), "header is not a JSON object");
}

TEST_F(SafetensorsTest, RejectsAnUnknownDType) {
  WriteBytes(Path("f"), BuildFile(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
                                  FloatBytes({1})));
  ExpectRejected(Path("f"), "tensor 'a' has unknown dtype 'F33'");
}

TEST_F(SafetensorsTest, RejectsOffsetsThatDoNotMatchDTypeAndShape) {
  std::string header = R"({"blocks.0.attn.qkv.weight":{"dtype":"F32","shape":[3,4],)"
                       R"("data_offsets":[0,100]}})";
  WriteBytes(Path("f"), BuildFile(header, std::string(100, '\0')));
  ExpectRejected(Path("f"),
                 "tensor 'blocks.0.attn.qkv.weight' data_offsets [0, 100] do not match "
                 "F32 [3, 4] (48 bytes)");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutsideTheDataSection) {
  WriteBytes(Path("f"), BuildFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                  FloatBytes({1})));
  ExpectRejected(Path("f"), "tensor 'a' data_offsets [0, 8] lie outside the data section [0, 4]");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  WriteBytes(Path("f"), BuildFile(header, FloatBytes({1, 2, 3})));
  ExpectRejected(Path("f"), "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
}

TEST_F(SafetensorsTest, RejectsDataNotCoveredByTensors) {
  WriteBytes(Path("f"), BuildFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                  FloatBytes({1, 2, 3})));
  ExpectRejected(Path("f"), "data section bytes [8, 12) belong to no tensor");
}

TEST_F(SafetensorsTest, RejectsATensorNamedTwice) {
  std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  WriteBytes(Path("f"), BuildFile(header, FloatBytes({1, 2})));
  ExpectRejected(Path("f"), "header names 'a' twice");
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotStrings) {
  WriteBytes(Path("f"), BuildFile(R"({"__metadata__":{"step":10}})", ""));
  ExpectRejected(Path("f"), "__metadata__ value of 'step' is 10, not a string");
}

TEST_F(SafetensorsTest, RejectsATruncatedFile) {
  std::string path = WriteSample();
  fs::resize_file(path, fs::file_size(path) - 1);
  ExpectRejected(path, "tensor 'b' data_offsets [24, 40] lie outside the data section [0, 39]");
}

TEST_F(SafetensorsTest, RejectsAFlippedDataByteByChecksum) {
  std::string path = WriteSample();
  std::string raw = ReadBytes(path);
  raw[raw.size() - 3] ^= 0x10;
  WriteBytes(path, raw);
  ExpectRejected(path, "data checksum mismatch");
}

// A caller that has just verified a file (a checkpoint's shards, CheckpointStore::LatestComplete)
// maps it without reading its data again; everyone else gets the check.
TEST_F(SafetensorsTest, MapWithoutTheCheckReadsNoDataUntilATensorIs) {
  std::string path = WriteSample();
  std::string raw = ReadBytes(path);
  raw[raw.size() - 3] ^= 0x10;
  WriteBytes(path, raw);
  EXPECT_FALSE(SafetensorsFile::Map(path).ok());
  Result<SafetensorsFile> unchecked = SafetensorsFile::Map(path, /*check_data=*/false);
  ASSERT_TRUE(unchecked.ok()) << unchecked.status().message();
  EXPECT_NE(unchecked->Find("b"), nullptr);
}

// The process's resident bytes (/proc/self/statm), mapped file pages included.
int64_t Resident() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, pages = 0;
  statm >> size >> pages;
  return pages * ::sysconf(_SC_PAGESIZE);
}

// Reading a mapped tensor makes its pages resident; Forget gives them back, and the tensor reads
// the same again (from the page cache).
TEST_F(SafetensorsTest, ForgetGivesBackTheMappedPagesOfWhatWasRead) {
  std::vector<float> big(16 << 20);  // 64 MiB
  std::iota(big.begin(), big.end(), 0.0f);
  SafetensorsWriter writer;
  writer.AddF32("big", {static_cast<int64_t>(big.size())}, big.data());
  const std::string path = Path("forget.safetensors");
  ASSERT_TRUE(writer.WriteAtomic(path).ok());
  Result<SafetensorsFile> mapped = SafetensorsFile::Map(path, /*check_data=*/false);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  const TensorView* t = mapped->Find("big");
  ASSERT_NE(t, nullptr);
  const int64_t before = Resident();
  std::vector<float> copy(big.size());
  std::memcpy(copy.data(), t->data, t->bytes);  // `copy` itself was resident already
  const int64_t read = Resident();
  EXPECT_GT(read - before, int64_t(60) << 20);
  mapped->Forget(t->data, t->bytes);
  EXPECT_LT(Resident(), read - (int64_t(60) << 20));
  EXPECT_EQ(std::memcmp(t->data, big.data(), t->bytes), 0);
  // A file read into memory keeps its bytes.
  Result<SafetensorsFile> in_memory = SafetensorsFile::Read(path);
  ASSERT_TRUE(in_memory.ok());
  const TensorView* u = in_memory->Find("big");
  in_memory->Forget(u->data, u->bytes);
  EXPECT_EQ(std::memcmp(u->data, big.data(), u->bytes), 0);
}

TEST_F(SafetensorsTest, RejectsAnEditedHeader) {
  std::string path = WriteSample();
  std::string raw = ReadBytes(path);
  size_t at = raw.find(R"("shape":[4])");
  ASSERT_NE(at, std::string::npos);
  raw.replace(at, 11, R"("shape":[5])");
  WriteBytes(path, raw);
  ExpectRejected(path, "tensor 'b' data_offsets [24, 40] do not match F32 [5] (20 bytes)");
}

TEST_F(SafetensorsTest, VerifyChecksumsAFileLargerThanOneReadChunk) {
  std::vector<float> big(3 << 20, 1.0f);  // 12 MiB: more than one 8 MiB chunk
  SafetensorsWriter writer;
  writer.AddF32("big", {static_cast<int64_t>(big.size())}, big.data());
  std::string path = Path("big.safetensors");
  ASSERT_TRUE(writer.WriteAtomic(path).ok());
  Result<FileDigest> good = SafetensorsFile::Verify(path);
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(good->bytes, fs::file_size(path));

  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekp(-2, std::ios::end);
  file.put('\x7f');
  file.close();
  ExpectRejected(path, "data checksum mismatch");
}

}  // namespace
}  // namespace difftrain::io
