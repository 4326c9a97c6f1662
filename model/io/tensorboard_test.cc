#include "model/io/tensorboard.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

namespace difftrain::io {
namespace {

TEST(Crc32cTest, IsCastagnolisCheckValueAndMasksAsTfRecords) {
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);  // the CRC catalogue's check value of CRC-32C
  EXPECT_EQ(Crc32c(""), 0u);
  const uint32_t crc = Crc32c("abc");
  EXPECT_EQ(MaskedCrc32c("abc"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TensorBoardWriterTest, FramesEachEventAsATfRecord) {
  TempDir temp("tensorboard_test");
  const std::string dir = temp.path() + "/logs/run";  // created with its parents
  std::string path;
  {
    Result<TensorBoardWriter> w = TensorBoardWriter::Open(dir);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE(w->Scalars(3, {{"train/loss", 0.5}}).ok());
    path = w->path();
    // A second writer of the same second and process gets a file of its own.
    Result<TensorBoardWriter> other = TensorBoardWriter::Open(dir);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->path(), path);
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."),
            std::string::npos);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Two records: file_version, then the scalar; each length, its CRC, data, the data's CRC.
  size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, MaskedCrc32c(std::string_view(bytes.data() + at, 8)));
    ASSERT_LE(at + 16 + length, bytes.size());
    const std::string_view data(bytes.data() + at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, MaskedCrc32c(data));
    EXPECT_NE(data.find(records == 0 ? "brain.Event:2" : "train/loss"), std::string::npos);
    at += 16 + length;
    ++records;
  }
  EXPECT_EQ(records, 2);
}

TEST(TensorBoardWriterTest, AnUnwritableDirectoryIsAnErrorNamingIt) {
  TempDir temp("tensorboard_test");
  std::ofstream(temp.path() + "/file") << "x";
  Result<TensorBoardWriter> w = TensorBoardWriter::Open(temp.path() + "/file/logs");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(temp.path() + "/file/logs"), std::string::npos)
      << w.status().message();
}

}  // namespace
}  // namespace difftrain::io
