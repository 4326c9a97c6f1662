#include "model/data/fashion_mnist.h"
#include "common/temp_dir.h"

#include <zlib.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using F = FashionMnistDataset;

// The raw pixel byte behind a scaled value.
int Byte(float v) {
  return static_cast<int>(std::lround((v + 1.0f) * 127.5f));
}

// Debian's dataset-fashion-mnist (scripts/install-deps.sh installs it).
class FashionMnistRealTest : public ::testing::Test {
 protected:
  static std::unique_ptr<F> Load(const std::string& split) {
    Result<std::unique_ptr<F>> data = F::Load(std::string(kFashionMnistDefaultDir), split);
    EXPECT_TRUE(data.ok()) << data.status().message();
    return data.ok() ? std::move(data).value() : nullptr;
  }
  static std::array<int, 10> Histogram(const F& data) {
    std::array<int, 10> counts{};
    std::vector<float> image(data.sample_floats());
    for (int64_t i = 0; i < data.size(); ++i) {
      int32_t label = -1;
      EXPECT_TRUE(data.Get(i, image.data(), &label).ok());
      EXPECT_TRUE(label >= 0 && label < 10) << label;
      if (label >= 0 && label < 10) ++counts[label];
    }
    return counts;
  }
};

TEST_F(FashionMnistRealTest, TrainSplitHas6000OfEachClass) {
  std::unique_ptr<F> data = Load("train");
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(data->size(), 60000);
  EXPECT_EQ(data->channels(), 1);
  EXPECT_EQ(data->height(), 32);
  EXPECT_EQ(data->width(), 32);
  EXPECT_EQ(data->num_classes(), 10);
  std::array<int, 10> expected;
  expected.fill(6000);
  EXPECT_EQ(Histogram(*data), expected);
}

TEST_F(FashionMnistRealTest, TestSplitHas1000OfEachClass) {
  std::unique_ptr<F> data = Load("test");
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(data->size(), 10000);
  std::array<int, 10> expected;
  expected.fill(1000);
  EXPECT_EQ(Histogram(*data), expected);
}

// Values a separate reader (Python's gzip + struct) gave for the first training image.
TEST_F(FashionMnistRealTest, FirstTrainingImageMatchesAnIndependentReader) {
  std::unique_ptr<F> data = Load("train");
  ASSERT_NE(data, nullptr);
  std::vector<int32_t> labels(12);
  std::vector<float> image(32 * 32);
  for (int i = 11; i >= 0; --i)
    ASSERT_TRUE(data->Get(i, image.data(), &labels[i]).ok());
  EXPECT_EQ(labels, (std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9}));

  int sum = 0;
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 32; ++x) {
      const float v = image[y * 32 + x];
      ASSERT_GE(v, -1.0f);
      ASSERT_LE(v, 1.0f);
      const bool border = y < 2 || y >= 30 || x < 2 || x >= 30;
      if (border) {
        ASSERT_EQ(v, -1.0f) << y << "," << x;
      }
      sum += Byte(v);
    }
  }
  EXPECT_EQ(sum, 76247);
  const int row14[28] = {0,   0,   1,   4,   6,   7,   2,   0,   0,   0,   0,   0,   237, 226,
                         217, 223, 222, 219, 222, 221, 216, 223, 229, 215, 218, 255, 77,  0};
  for (int x = 0; x < 28; ++x)
    EXPECT_EQ(Byte(image[(14 + 2) * 32 + 2 + x]), row14[x]) << x;
  EXPECT_EQ(image[16 * 32 + 2 + 25], 1.0f);  // byte 255
}

// Crafted IDX files in a temporary directory.
class FashionMnistFileTest : public ::testing::Test {
 protected:
  std::string ImagesPath() const { return dir_ + "/train-images-idx3-ubyte.gz"; }
  std::string LabelsPath() const { return dir_ + "/train-labels-idx1-ubyte.gz"; }

  static std::string Idx(uint32_t magic, const std::vector<uint32_t>& dims,
                         const std::string& data) {
    std::string out;
    auto append_big_endian = [&out](uint32_t word) {
      for (int shift = 24; shift >= 0; shift -= 8)
        out.push_back(static_cast<char>(word >> shift));
    };
    append_big_endian(magic);
    for (uint32_t word : dims)
      append_big_endian(word);
    return out + data;
  }
  static void WriteGzip(const std::string& path, const std::string& bytes) {
    gzFile file = gzopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
  }
  // `n` images whose pixel (y, x) is (i + y + x) mod 256, and labels i mod 10.
  void WriteValid(uint32_t n) {
    WriteGzip(ImagesPath(), Idx(0x803, {n, 28, 28}, Pixels(n)));
    WriteGzip(LabelsPath(), Idx(0x801, {n}, Labels(n)));
  }
  static std::string Pixels(uint32_t n) {
    std::string pixels;
    for (uint32_t i = 0; i < n; ++i) {
      for (int y = 0; y < 28; ++y) {
        for (int x = 0; x < 28; ++x)
          pixels.push_back(static_cast<char>((i + y + x) % 256));
      }
    }
    return pixels;
  }
  static std::string Labels(uint32_t n) {
    std::string labels;
    for (uint32_t i = 0; i < n; ++i)
      labels.push_back(static_cast<char>(i % 10));
    return labels;
  }

  // Loading must fail with a message naming `path` and containing `reason`.
  void ExpectError(const std::string& path, const std::string& reason) {
    Result<std::unique_ptr<F>> data = F::Load(dir_, "train");
    ASSERT_FALSE(data.ok());
    const std::string message = data.status().message();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }

  TempDir temp_{"fashion_mnist_test"};
  std::string dir_ = temp_.path();
};

TEST_F(FashionMnistFileTest, ScalesAndPadsAValidFile) {
  WriteValid(3);
  Result<std::unique_ptr<F>> data = F::Load(dir_, "train");
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ((*data)->size(), 3);
  std::vector<float> image(32 * 32);
  int32_t label = -1;
  ASSERT_TRUE((*data)->Get(2, image.data(), &label).ok());
  EXPECT_EQ(label, 2);
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 32; ++x) {
      const bool border = y < 2 || y >= 30 || x < 2 || x >= 30;
      const float expected = border ? -1.0f : ((2 + (y - 2) + (x - 2)) % 256) / 127.5f - 1.0f;
      ASSERT_EQ(image[y * 32 + x], expected) << y << "," << x;
    }
  }
}

TEST_F(FashionMnistFileTest, ReadsUncompressedFilesToo) {
  std::ofstream(ImagesPath(), std::ios::binary) << Idx(0x803, {2, 28, 28}, Pixels(2));
  std::ofstream(LabelsPath(), std::ios::binary) << Idx(0x801, {2}, Labels(2));
  Result<std::unique_ptr<F>> data = F::Load(dir_, "train");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->size(), 2);
}

TEST_F(FashionMnistFileTest, MissingFileNamesIt) {
  WriteValid(2);
  fs::remove(LabelsPath());
  ExpectError(LabelsPath(), "No such file");
}

TEST_F(FashionMnistFileTest, BadMagic) {
  WriteValid(2);
  WriteGzip(ImagesPath(), Idx(0x801, {2, 28, 28}, Pixels(2)));
  ExpectError(ImagesPath(), "bad magic 0x00000801, expected 0x00000803");
}

TEST_F(FashionMnistFileTest, TruncatedData) {
  WriteValid(2);
  WriteGzip(ImagesPath(), Idx(0x803, {3, 28, 28}, Pixels(2)));
  ExpectError(ImagesPath(), "truncated");
}

TEST_F(FashionMnistFileTest, TruncatedHeader) {
  WriteValid(2);
  WriteGzip(LabelsPath(), Idx(0x801, {}, ""));
  ExpectError(LabelsPath(), "truncated: the header needs 8 bytes, the file has 4");
}

TEST_F(FashionMnistFileTest, TruncatedGzipStream) {
  WriteValid(50);
  std::string compressed;
  {
    std::ifstream in(ImagesPath(), std::ios::binary);
    compressed.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(ImagesPath(), std::ios::binary | std::ios::trunc)
      << compressed.substr(0, compressed.size() / 2);
  ExpectError(ImagesPath(), "truncated");
}

TEST_F(FashionMnistFileTest, TrailingBytes) {
  WriteValid(2);
  WriteGzip(LabelsPath(), Idx(0x801, {2}, Labels(3)));
  ExpectError(LabelsPath(), "trailing bytes");
}

TEST_F(FashionMnistFileTest, CountMismatch) {
  WriteValid(3);
  WriteGzip(LabelsPath(), Idx(0x801, {2}, Labels(2)));
  ExpectError(LabelsPath(), "count mismatch: 2 labels for the 3 images");
}

TEST_F(FashionMnistFileTest, LabelOutOfRange) {
  WriteValid(3);
  WriteGzip(LabelsPath(), Idx(0x801, {3}, std::string("\x01\x0a\x02", 3)));
  ExpectError(LabelsPath(), "label 10 of sample 1 is not below 10");
}

TEST_F(FashionMnistFileTest, WrongImageSize) {
  WriteValid(2);
  WriteGzip(ImagesPath(), Idx(0x803, {2, 27, 27}, std::string(2 * 27 * 27, '\0')));
  ExpectError(ImagesPath(), "images are 27×27");
}

// Dimensions whose product wraps around 64 bits (2^28 · 2^28 · 2^8 = 2^64, a body of 0 bytes)
// are an error, not images the body does not hold; so is a row count past an int.
TEST_F(FashionMnistFileTest, DimensionsWhoseBytesDoNotFitAreAnError) {
  WriteGzip(ImagesPath(), Idx(0x803, {1u << 28, 1u << 28, 1u << 8}, ""));
  Result<IdxImages> read = ReadIdxImages(ImagesPath());
  ASSERT_FALSE(read.ok()) << read->count << " images of " << read->pixels.size() << " bytes";
  EXPECT_NE(read.status().message().find("268435456×268435456×256 images are more bytes"),
            std::string::npos)
      << read.status().message();
  WriteGzip(ImagesPath(), Idx(0x803, {0, 0x80000000u, 1}, ""));
  read = ReadIdxImages(ImagesPath());
  ASSERT_FALSE(read.ok()) << read->rows << " rows";
  EXPECT_NE(read.status().message().find(ImagesPath()), std::string::npos);
}

TEST_F(FashionMnistFileTest, UnknownSplit) {
  Result<std::unique_ptr<F>> data = F::Load(dir_, "validation");
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("split 'validation'"), std::string::npos);
}

}  // namespace
}  // namespace difftrain
