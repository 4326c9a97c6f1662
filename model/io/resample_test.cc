// Pillow's resampling worked by hand on a few pixels (model/io/resample.h gives the rule); the
// comparisons with Pillow itself over whole images are in model/data/image_folder_test.cc
// (tests/reference/images.py).
#include "model/io/resample.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace difftrain::io {
namespace {

PngImage Grey(int width, int height, std::vector<uint8_t> pixels) {
  PngImage image;
  image.width = width;
  image.height = height;
  image.channels = 1;
  image.pixels = std::move(pixels);
  return image;
}

// BILINEAR, the triangle 1 − |x| of support 1 (widened by in/out when shrinking), each output
// pixel's weights normalised to sum 1, in 22-bit fixed point, the sum rounded to the nearest
// byte (the same bytes as Pillow 9.4's Image.resize(..., BILINEAR)).
TEST(ResampleTest, BilinearWeighsByTheTriangle) {
  // Enlarging 2 → 4: centres 0.25, 0.75, 1.25, 1.75; the end pixels see one tap, the middle
  // ones weigh (0.75, 0.25) and (0.25, 0.75): 25.5 and 75.5 rounded down from the half added.
  EXPECT_EQ(Resize(Grey(2, 1, {0, 100}), 4, 1, ResampleFilter::kBilinear).pixels,
            (std::vector<uint8_t>{0, 25, 75, 100}));
  // Shrinking 4 → 2: support 2, taps x = (i − c + 0.5)/2: pixel 0 weighs (0.75, 0.75, 0.25)/1.75,
  // 28.57 → 29; pixel 1 (0.25, 0.75, 0.75)/1.75 of 40, 80, 120, 91.43 → 91.
  EXPECT_EQ(Resize(Grey(4, 1, {0, 40, 80, 120}), 2, 1, ResampleFilter::kBilinear).pixels,
            (std::vector<uint8_t>{29, 91}));
  // A column 2 → 3: the middle pixel halves 0 and 255, 127.5 + 0.5 → 128.
  const PngImage column = Resize(Grey(1, 2, {0, 255}), 1, 3, ResampleFilter::kBilinear);
  EXPECT_EQ(column.width, 1);
  EXPECT_EQ(column.height, 3);
  EXPECT_EQ(column.pixels, (std::vector<uint8_t>{0, 128, 255}));
  // 7 → 3, a widening of 7/3 (Pillow's 34, 120, 206).
  EXPECT_EQ(
      Resize(Grey(7, 1, {0, 40, 80, 120, 160, 200, 240}), 3, 1, ResampleFilter::kBilinear).pixels,
      (std::vector<uint8_t>{34, 120, 206}));
}

// A side that keeps its size is not resampled, with any filter (Pillow skips that pass).
TEST(ResampleTest, KeepsASideOfTheSameSize) {
  const PngImage image = Grey(3, 2, {1, 2, 3, 4, 5, 6});
  for (ResampleFilter filter : {ResampleFilter::kBox, ResampleFilter::kBilinear,
                                ResampleFilter::kBicubic, ResampleFilter::kLanczos}) {
    EXPECT_EQ(Resize(image, 3, 2, filter).pixels, image.pixels);
  }
}

}  // namespace
}  // namespace difftrain::io
