#include "model/data/moving_fashion_mnist.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/tensor/rng.h"

namespace difftrain {
namespace {

// A video's path is drawn from this seed's data stream at the video's index: the dataset
// is the same whatever the job's seed.
constexpr uint64_t kPathSeed = 0x6d6f76696e67;  // "moving"
constexpr double kPi = 3.14159265358979323846;
constexpr double kMinSpeed = 1.0, kMaxSpeed = 2.5;

}  // namespace

double Bounce(double p, int travel) {
  if (travel == 0) return 0;
  const double period = 2.0 * travel;
  double u = std::fmod(p, period);
  if (u < 0) u += period;
  return u <= travel ? u : period - u;
}

std::array<double, 2> GarmentPath::At(int f) const {
  return {Bounce(x0 + vx * f, travel), Bounce(y0 + vy * f, travel)};
}

Result<std::unique_ptr<MovingFashionMnistDataset>> MovingFashionMnistDataset::Create(
    std::unique_ptr<FashionMnistDataset> garments, int frames, int size, int garment) {
  constexpr int kRaw = FashionMnistDataset::kRawSize;
  if (frames < 1) return Errorf("moving_fashion_mnist: frames must be positive, got {}", frames);
  if (garment < 1 || kRaw % garment != 0) {
    return Errorf("moving_fashion_mnist: garment size {} must divide {} (28, 14, 7 or 4)", garment,
                  kRaw);
  }
  if (size < garment) {
    return Errorf("moving_fashion_mnist: the canvas ({}) is smaller than the garment ({})", size,
                  garment);
  }
  return std::unique_ptr<MovingFashionMnistDataset>(
      new MovingFashionMnistDataset(std::move(garments), frames, size, garment));
}

GarmentPath MovingFashionMnistDataset::PathOf(int64_t index) const {
  Rng rng(kPathSeed, RngStream::kData, static_cast<uint64_t>(index));
  GarmentPath p;
  p.travel = size_ - garment_;
  p.x0 = rng.Uniform() * p.travel;
  p.y0 = rng.Uniform() * p.travel;
  const double speed = kMinSpeed + (kMaxSpeed - kMinSpeed) * rng.Uniform();
  const double angle = 2 * kPi * rng.Uniform();
  p.vx = speed * std::cos(angle);
  p.vy = speed * std::sin(angle);
  return p;
}

Status MovingFashionMnistDataset::Garment(int64_t index, float* out, int32_t* label) const {
  constexpr int kSize = FashionMnistDataset::kSize, kPad = FashionMnistDataset::kPadding;
  std::vector<float> image(kSize * kSize);
  DT_RETURN_IF_ERROR(garments_->Get(index, image.data(), label));
  const int k = FashionMnistDataset::kRawSize / garment_;
  for (int y = 0; y < garment_; ++y) {
    for (int x = 0; x < garment_; ++x) {
      double sum = 0;
      for (int dy = 0; dy < k; ++dy)
        for (int dx = 0; dx < k; ++dx)
          sum += image[(kPad + y * k + dy) * kSize + kPad + x * k + dx];
      out[y * garment_ + x] = static_cast<float>(sum / (k * k));
    }
  }
  return Status::Ok();
}

Status MovingFashionMnistDataset::Get(int64_t index, float* video, int32_t* label) const {
  std::vector<float> garment(size_t(garment_) * garment_);
  DT_RETURN_IF_ERROR(Garment(index, garment.data(), label));
  const GarmentPath path = PathOf(index);
  const size_t frame = size_t(size_) * size_;
  std::fill(video, video + frame * frames_, -1.0f);
  for (int f = 0; f < frames_; ++f) {
    const auto [x, y] = path.At(f);
    const int left = static_cast<int>(std::lround(x)), top = static_cast<int>(std::lround(y));
    float* canvas = video + f * frame;
    for (int r = 0; r < garment_; ++r) {
      std::copy(garment.begin() + r * garment_, garment.begin() + (r + 1) * garment_,
                canvas + size_t(top + r) * size_ + left);
    }
  }
  return Status::Ok();
}

}  // namespace difftrain
