#include "model/data/moving_fashion_mnist.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace difftrain {
namespace {

std::unique_ptr<MovingFashionMnistDataset> Open(int frames, int size, int garment = 14) {
  auto garments = FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  EXPECT_TRUE(garments.ok()) << garments.status().message();
  auto moving = MovingFashionMnistDataset::Create(std::move(*garments), frames, size, garment);
  EXPECT_TRUE(moving.ok()) << moving.status().message();
  return std::move(*moving);
}

TEST(Bounce, FoldsAStraightPathIntoTheCanvas) {
  EXPECT_DOUBLE_EQ(Bounce(3.5, 10), 3.5);
  EXPECT_DOUBLE_EQ(Bounce(12, 10), 8);   // 2 past the far wall
  EXPECT_DOUBLE_EQ(Bounce(-3, 10), 3);   // 3 past the near wall
  EXPECT_DOUBLE_EQ(Bounce(23, 10), 3);   // there and back, 3 more
  EXPECT_DOUBLE_EQ(Bounce(-17, 10), 3);  // back, then forth
  EXPECT_DOUBLE_EQ(Bounce(7, 0), 0);     // a garment as large as the canvas stays put
}

// Every frame is the canvas of −1 with the garment (the Fashion-MNIST image averaged over 2×2
// blocks) pasted at the rounded point of a straight path folded by reflection; the path is
// the same on every read and moves 1 to 2.5 pixels a frame.
TEST(MovingFashionMnist, FramesShowTheGarmentAlongABouncingPath) {
  constexpr int kFrames = 12, kSize = 32, kGarment = 14;
  auto data = Open(kFrames, kSize);
  auto garments = FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  ASSERT_TRUE(garments.ok());
  EXPECT_EQ(data->size(), 10000);
  EXPECT_EQ(data->frames(), kFrames);
  EXPECT_EQ(data->sample_floats(), int64_t{kFrames} * kSize * kSize);
  for (int64_t i : {0, 1, 777, 9999}) {
    std::vector<float> video(data->sample_floats()), again(data->sample_floats());
    int32_t label = -1, label2 = -1, raw_label = -1;
    ASSERT_TRUE(data->Get(i, video.data(), &label).ok());
    ASSERT_TRUE(data->Get(i, again.data(), &label2).ok());
    EXPECT_EQ(video, again);
    std::vector<float> raw(32 * 32);
    ASSERT_TRUE((*garments)->Get(i, raw.data(), &raw_label).ok());
    EXPECT_EQ(label, raw_label);
    EXPECT_EQ(label, label2);

    const GarmentPath path = data->PathOf(i);
    const double speed = std::hypot(path.vx, path.vy);
    EXPECT_GE(speed, 1.0);
    EXPECT_LE(speed, 2.5);
    EXPECT_EQ(path.travel, kSize - kGarment);
    for (int f = 0; f < kFrames; ++f) {
      const auto [x, y] = path.At(f);
      ASSERT_GE(x, 0);
      ASSERT_LE(x, path.travel);
      const int left = static_cast<int>(std::lround(x)), top = static_cast<int>(std::lround(y));
      for (int r = 0; r < kSize; ++r) {
        for (int c = 0; c < kSize; ++c) {
          const float pixel = video[(size_t(f) * kSize + r) * kSize + c];
          const int gr = r - top, gc = c - left;
          if (gr < 0 || gr >= kGarment || gc < 0 || gc >= kGarment) {
            ASSERT_EQ(pixel, -1.0f) << "video " << i << " frame " << f;
            continue;
          }
          // The 2×2 block of the 28×28 image (at offset 2 in the padded 32×32 sample).
          double sum = 0;
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx)
              sum += raw[(2 + 2 * gr + dy) * 32 + 2 + 2 * gc + dx];
          ASSERT_NEAR(pixel, sum / 4, 1e-6) << "video " << i << " frame " << f;
        }
      }
    }
  }
}

TEST(MovingFashionMnist, RefusesShapesItCannotDraw) {
  auto garments = [] {
    return std::move(FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test"))
        .value();
  };
  auto bad_garment = MovingFashionMnistDataset::Create(garments(), 8, 32, 10);
  ASSERT_FALSE(bad_garment.ok());
  EXPECT_NE(bad_garment.status().message().find("garment size 10 must divide 28"),
            std::string::npos);
  auto small_canvas = MovingFashionMnistDataset::Create(garments(), 8, 12, 14);
  ASSERT_FALSE(small_canvas.ok());
  EXPECT_NE(small_canvas.status().message().find("smaller than the garment"), std::string::npos);
  EXPECT_FALSE(MovingFashionMnistDataset::Create(garments(), 0, 32, 14).ok());
}

}  // namespace
}  // namespace difftrain
