#include "model/io/png.h"
#include "common/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain::io {
namespace {

namespace fs = std::filesystem;

class PngTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes then reads back an image of every byte value pattern.
  void ExpectRoundTrip(int width, int height, int channels) {
    std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * channels);
    for (size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<uint8_t>(i * 37 + i / 7);
    const std::string path = Path("image.png");
    ASSERT_TRUE(WritePng(path, pixels.data(), width, height, channels).ok());
    Result<PngImage> image = ReadPng(path);
    ASSERT_TRUE(image.ok()) << image.status().message();
    EXPECT_EQ(image->width, width);
    EXPECT_EQ(image->height, height);
    EXPECT_EQ(image->channels, channels);
    EXPECT_EQ(image->pixels, pixels);
  }

  TempDir temp_{"png_test"};
  std::string dir_ = temp_.path();
};

TEST_F(PngTest, GreyRoundTrip) {
  ExpectRoundTrip(17, 5, 1);
}

TEST_F(PngTest, RgbRoundTrip) {
  ExpectRoundTrip(33, 20, 3);
}

TEST_F(PngTest, OverwritesAtomically) {
  const std::string path = Path("image.png");
  const std::vector<uint8_t> black(4, 0), white(4, 255);
  ASSERT_TRUE(WritePng(path, black.data(), 2, 2, 1).ok());
  ASSERT_TRUE(WritePng(path, white.data(), 2, 2, 1).ok());
  Result<PngImage> image = ReadPng(path);
  ASSERT_TRUE(image.ok()) << image.status().message();
  EXPECT_EQ(image->pixels, white);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(PngTest, RefusesOtherChannelCounts) {
  const std::vector<uint8_t> pixels(16);
  Status status = WritePng(Path("x.png"), pixels.data(), 2, 2, 4);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("4 channels"), std::string::npos) << status.message();
}

TEST_F(PngTest, ReadErrorsNameTheFile) {
  Result<PngImage> missing = ReadPng(Path("missing.png"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(Path("missing.png")), std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);

  std::ofstream(Path("text.png")) << "not a png at all";
  Result<PngImage> text = ReadPng(Path("text.png"));
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find(Path("text.png")), std::string::npos);
  EXPECT_NE(text.status().message().find("cannot decode"), std::string::npos)
      << text.status().message();
}

TEST_F(PngTest, GridLayoutAndValues) {
  // 5 RGB images of 3×2 in 2 columns with padding 1: 3 rows of cells.
  const int N = 5, C = 3, H = 3, W = 2;
  std::vector<float> images(N * C * H * W);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      for (int i = 0; i < H * W; ++i)
        images[(n * C + c) * H * W + i] = c == 0 ? -1.0f + 0.5f * n : (c == 1 ? 2.0f : -3.0f);
    }
  }
  const std::string path = Path("grid.png");
  ASSERT_TRUE(WriteImageGrid(path, images.data(), N, C, H, W, 2, 1).ok());
  Result<PngImage> grid = ReadPng(path);
  ASSERT_TRUE(grid.ok()) << grid.status().message();
  EXPECT_EQ(grid->width, 2 * (W + 1) + 1);
  EXPECT_EQ(grid->height, 3 * (H + 1) + 1);
  EXPECT_EQ(grid->channels, 3);
  auto pixel = [&](int x, int y, int c) { return grid->pixels[(y * grid->width + x) * 3 + c]; };
  const int red[N] = {0, 64, 128, 191, 255};  // -1, -0.5, 0, 0.5, 1
  for (int n = 0; n < N; ++n) {
    const int x = 1 + (n % 2) * (W + 1), y = 1 + (n / 2) * (H + 1);
    EXPECT_EQ(pixel(x, y, 0), red[n]) << n;
    EXPECT_EQ(pixel(x + W - 1, y + H - 1, 1), 255) << n;  // clamped from 2
    EXPECT_EQ(pixel(x, y + 1, 2), 0) << n;                // clamped from -3
  }
  EXPECT_EQ(pixel(0, 0, 1), 0);                        // padding is black
  EXPECT_EQ(pixel(1 + W + 1, 1 + 2 * (H + 1), 1), 0);  // the empty sixth cell
}

TEST_F(PngTest, GridOfFewerImagesThanColumns) {
  std::vector<float> images(2 * 1 * 4 * 4, 0.0f);
  ASSERT_TRUE(WriteImageGrid(Path("g.png"), images.data(), 2, 1, 4, 4, 8, 2).ok());
  Result<PngImage> grid = ReadPng(Path("g.png"));
  ASSERT_TRUE(grid.ok()) << grid.status().message();
  EXPECT_EQ(grid->width, 2 * 6 + 2);
  EXPECT_EQ(grid->height, 6 + 2);
  EXPECT_EQ(grid->channels, 1);
  EXPECT_EQ(grid->pixels[2 * grid->width + 2], 128);
}

}  // namespace
}  // namespace difftrain::io
