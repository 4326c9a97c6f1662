#include "model/io/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/check.h"

namespace difftrain::io {
namespace {

constexpr int kFractionBits = 22;  // 32 bits less 8 for the value and 2 for overshoot

double BoxWeight(double x) {
  return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
}

double BilinearWeight(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double BicubicWeight(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

double Sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double LanczosWeight(double x) {
  return x >= -3.0 && x < 3.0 ? Sinc(x) * Sinc(x / 3) : 0.0;
}

double Support(ResampleFilter filter) {
  switch (filter) {
    case ResampleFilter::kBox:
      return 0.5;
    case ResampleFilter::kBilinear:
      return 1.0;
    case ResampleFilter::kBicubic:
      return 2.0;
    case ResampleFilter::kLanczos:
      return 3.0;
  }
  return 0.0;
}

double Weight(ResampleFilter filter, double x) {
  switch (filter) {
    case ResampleFilter::kBox:
      return BoxWeight(x);
    case ResampleFilter::kBilinear:
      return BilinearWeight(x);
    case ResampleFilter::kBicubic:
      return BicubicWeight(x);
    case ResampleFilter::kLanczos:
      return LanczosWeight(x);
  }
  return 0.0;
}

// The taps of one output pixel of a pass: input pixels [first, first + weights.size()).
struct Taps {
  int first = 0;
  std::vector<int32_t> weights;  // fixed point, kFractionBits
};

std::vector<Taps> PassTaps(int in, int out, ResampleFilter filter) {
  const double scale = static_cast<double>(static_cast<float>(in)) / out;
  const double widen = std::max(scale, 1.0);
  const double support = Support(filter) * widen;
  const double shrink = 1.0 / widen;  // Pillow multiplies by it rather than divide by widen
  std::vector<Taps> taps(out);
  for (int j = 0; j < out; ++j) {
    const double centre = (j + 0.5) * scale;
    const int first = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int end = std::min(static_cast<int>(centre + support + 0.5), in);
    std::vector<double> w;
    double total = 0;
    for (int i = first; i < end; ++i) {
      const double x = (i - centre + 0.5) * shrink;
      w.push_back(Weight(filter, x));
      total += w.back();
    }
    taps[j].first = first;
    for (double v : w) {
      if (total != 0.0) v /= total;
      const double fixed = v * (1 << kFractionBits);
      taps[j].weights.push_back(static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5));
    }
  }
  return taps;
}

uint8_t ToByte(int32_t sum) {
  return static_cast<uint8_t>(std::clamp(sum >> kFractionBits, 0, 255));
}

// One pass along rows (horizontal) or columns: `in` is h × w × c; the result has `out`
// pixels along that axis.
PngImage Pass(const PngImage& in, int out, bool horizontal, ResampleFilter filter) {
  const int c = in.channels;
  PngImage result;
  result.channels = c;
  result.width = horizontal ? out : in.width;
  result.height = horizontal ? in.height : out;
  result.pixels.resize(size_t(result.width) * result.height * c);
  const std::vector<Taps> taps = PassTaps(horizontal ? in.width : in.height, out, filter);
  const auto at = [&](int y, int x, int k) {
    return static_cast<int32_t>(in.pixels[(size_t(y) * in.width + x) * c + k]);
  };
  for (int y = 0; y < result.height; ++y) {
    for (int x = 0; x < result.width; ++x) {
      const Taps& t = taps[horizontal ? x : y];
      for (int k = 0; k < c; ++k) {
        int32_t sum = 1 << (kFractionBits - 1);
        for (size_t i = 0; i < t.weights.size(); ++i) {
          const int from = t.first + static_cast<int>(i);
          sum += (horizontal ? at(y, from, k) : at(from, x, k)) * t.weights[i];
        }
        result.pixels[(size_t(y) * result.width + x) * c + k] = ToByte(sum);
      }
    }
  }
  return result;
}

}  // namespace

PngImage Resize(const PngImage& image, int width, int height, ResampleFilter filter) {
  DT_CHECK(width > 0 && height > 0, "resize to {}x{}", width, height);
  PngImage result = image;
  if (width != image.width) result = Pass(result, width, /*horizontal=*/true, filter);
  if (height != image.height) result = Pass(result, height, /*horizontal=*/false, filter);
  return result;
}

PngImage Crop(const PngImage& image, int left, int top, int width, int height) {
  DT_CHECK(left >= 0 && top >= 0 && left + width <= image.width && top + height <= image.height,
           "crop {}x{} at ({}, {}) of a {}x{} image", width, height, left, top, image.width,
           image.height);
  PngImage result;
  result.width = width;
  result.height = height;
  result.channels = image.channels;
  const size_t row = size_t(width) * image.channels;
  result.pixels.resize(row * height);
  for (int y = 0; y < height; ++y) {
    std::copy_n(image.pixels.begin() + (size_t(top + y) * image.width + left) * image.channels, row,
                result.pixels.begin() + y * row);
  }
  return result;
}

}  // namespace difftrain::io
