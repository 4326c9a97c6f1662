// The video measures on real moving_fashion_mnist videos (the floor a model is compared
// with) and on videos that break what they measure.
#include "model/eval/video_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/data/moving_fashion_mnist.h"

namespace difftrain::eval {
namespace {

constexpr int kFrames = 8, kSize = 32, kGarment = 14;

Videos RealVideos(int64_t count) {
  auto garments = FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  EXPECT_TRUE(garments.ok());
  auto moving = MovingFashionMnistDataset::Create(std::move(*garments), kFrames, kSize, kGarment);
  EXPECT_TRUE(moving.ok());
  Result<Videos> v = ReadVideos(**moving, count);
  EXPECT_TRUE(v.ok()) << v.status().message();
  return *v;
}

std::unique_ptr<Classifier<float>> ProjectClassifier() {
  Result<LoadedClassifier> loaded =
      LoadClassifier(DIFFTRAIN_SOURCE_DIR "/model/eval/fashion_mnist_classifier.safetensors");
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  return std::move(loaded->classifier);
}

TEST(BouncingPathResidualTest, FitsBouncingPathsAndNotOthers) {
  // Exact paths (any offset, start and velocity, bouncing off both walls) fit to a few
  // hundredths of a pixel; rounding them to whole pixels costs about 0.3.
  for (auto [q, v, lo] : {std::array<double, 3>{3.2, 2.1, 6.5}, {17.5, -1.3, 4}, {0, 0.7, 0}}) {
    std::vector<double> exact, rounded;
    for (int f = 0; f < 12; ++f) {
      exact.push_back(lo + Bounce(q + v * f, 18));
      rounded.push_back(lo + std::round(Bounce(q + v * f, 18)));
    }
    EXPECT_LT(BouncingPathResidual(exact, 18), 0.05);
    EXPECT_LT(BouncingPathResidual(rounded, 18), 0.5);
  }
  // A garment jumping about does not fit.
  EXPECT_GT(BouncingPathResidual({2, 15, 4, 12, 1, 17, 3, 9}, 18), 2.0);
}

// The floor: real videos cropped and classified as generated ones are. The classifier sees
// the garments through the 14-pixel canvas and back, so its accuracy is below its 0.90 on
// Fashion-MNIST itself; paths fit to rounding; the frames of a video agree.
TEST(EvaluateVideosTest, RealVideosAreTheFloor) {
  const Videos real = RealVideos(300);
  auto net = ProjectClassifier();
  const VideoReport r = EvaluateVideos(*net, real, kGarment);
  std::printf("real: %s\n", r.ToJson().dump().c_str());
  EXPECT_EQ(r.videos, 300);
  EXPECT_EQ(r.missing_frames, 0);
  EXPECT_GT(r.frame_accuracy, 0.6);
  EXPECT_LT(r.track_residual, 0.6);
  EXPECT_GT(r.agreement, 0.85);
  // Per label: the videos of each of the 10 classes, whose measures make up the totals.
  ASSERT_EQ(r.per_label.size(), 10u);
  int64_t videos = 0;
  double correct = 0, residual_sq = 0;
  for (const VideoMeasures& m : r.per_label) {
    videos += m.videos;
    correct += m.frame_accuracy * m.videos;
    residual_sq += m.track_residual * m.track_residual * m.videos;
  }
  EXPECT_EQ(videos, 300);
  EXPECT_NEAR(correct / videos, r.frame_accuracy, 1e-12);
  EXPECT_NEAR(std::sqrt(residual_sq / videos), r.track_residual, 1e-12);
}

// Frames shuffled in time break the path; frames of other videos break agreement and
// accuracy; black frames are missing.
TEST(EvaluateVideosTest, BrokenVideosScoreBadly) {
  const Videos real = RealVideos(100);
  auto net = ProjectClassifier();
  const size_t frame = size_t(kSize) * kSize, video = kFrames * frame;
  Videos shuffled = real, mixed = real, dark = real;
  std::mt19937 rng(3);
  for (int64_t i = 0; i < real.count; ++i) {
    std::vector<int> order(kFrames);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int f = 0; f < kFrames; ++f) {
      std::copy_n(real.pixels.begin() + i * video + order[f] * frame, frame,
                  shuffled.pixels.begin() + i * video + f * frame);
      // Frame f of video i comes from video (i + f) % count.
      std::copy_n(real.pixels.begin() + ((i + f) % real.count) * video + f * frame, frame,
                  mixed.pixels.begin() + i * video + f * frame);
    }
    std::fill_n(dark.pixels.begin() + i * video, frame, -1.0f);  // frame 0 black
  }
  const VideoReport floor = EvaluateVideos(*net, real, kGarment);
  const VideoReport s = EvaluateVideos(*net, shuffled, kGarment);
  EXPECT_GT(s.track_residual, 3 * floor.track_residual);
  EXPECT_NEAR(s.frame_accuracy, floor.frame_accuracy, 1e-12);
  const VideoReport m = EvaluateVideos(*net, mixed, kGarment);
  EXPECT_LT(m.agreement, 0.6);
  EXPECT_LT(m.frame_accuracy, floor.frame_accuracy);
  const VideoReport d = EvaluateVideos(*net, dark, kGarment);
  EXPECT_NEAR(d.missing_frames, 1.0 / kFrames, 1e-12);
  EXPECT_TRUE(std::isinf(d.track_residual));
}

}  // namespace
}  // namespace difftrain::eval
