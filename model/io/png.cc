#include "model/io/png.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/io/posix_file.h"

namespace difftrain::io {
namespace {

Status PngError(const std::string& path, const std::string& what) {
  return Errorf("PNG file '{}': {}", path, what);
}

png_image NewImage() {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  return image;
}

// torchvision's save_image mapping: [−1, 1] → [0, 1] → x·255 + 0.5, clamped, truncated.
uint8_t ToByte(float v) {
  if (std::isnan(v)) return 0;
  const float clamped = std::clamp(v, -1.0f, 1.0f);
  return static_cast<uint8_t>(std::floor((clamped + 1.0f) * 127.5f + 0.5f));
}

}  // namespace

Status WritePng(const std::string& path, const uint8_t* pixels, int width, int height,
                int channels) {
  if (channels != 1 && channels != 3) {
    return PngError(path,
                    fmt::format("{} channels, only 1 (grey) or 3 (RGB) are written", channels));
  }
  if (width < 1 || height < 1) {
    return PngError(path, fmt::format("cannot write an image of {}×{} pixels", width, height));
  }
  png_image image = NewImage();
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  // Encode in memory first, so the file is written by the one atomic writer of model/io.
  png_alloc_size_t bytes = PNG_IMAGE_PNG_SIZE_MAX(image);
  std::vector<uint8_t> encoded(bytes);
  if (!png_image_write_to_memory(&image, encoded.data(), &bytes, /*convert_to_8_bit=*/0, pixels,
                                 /*row_stride=*/0, /*colormap=*/nullptr)) {
    Status error = PngError(path, fmt::format("cannot encode: {}", image.message));
    png_image_free(&image);
    return error;
  }
  DT_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  DT_RETURN_IF_ERROR(file.Append(encoded.data(), bytes));
  return file.Commit();
}

Result<PngImage> MakeImageGrid(const float* images, int N, int C, int H, int W, int columns,
                               int padding) {
  if (N < 1 || H < 1 || W < 1 || columns < 1 || padding < 0) {
    return Errorf("cannot lay out {} images of {}×{} in {} columns with padding {}", N, H, W,
                  columns, padding);
  }
  const int cols = std::min(columns, N);
  const int rows = (N + cols - 1) / cols;
  PngImage grid;
  grid.width = cols * (W + padding) + padding;
  grid.height = rows * (H + padding) + padding;
  grid.channels = C;
  grid.pixels.assign(static_cast<size_t>(grid.width) * grid.height * C, 0);
  for (int n = 0; n < N; ++n) {
    const int x0 = padding + (n % cols) * (W + padding);
    const int y0 = padding + (n / cols) * (H + padding);
    for (int c = 0; c < C; ++c) {
      const float* plane = images + (static_cast<size_t>(n) * C + c) * H * W;
      for (int y = 0; y < H; ++y) {
        uint8_t* out = grid.pixels.data() + (static_cast<size_t>(y0 + y) * grid.width + x0) * C + c;
        for (int x = 0; x < W; ++x)
          out[static_cast<size_t>(x) * C] = ToByte(plane[y * W + x]);
      }
    }
  }
  return grid;
}

Status WriteImageGrid(const std::string& path, const float* images, int N, int C, int H, int W,
                      int columns, int padding) {
  Result<PngImage> grid = MakeImageGrid(images, N, C, H, W, columns, padding);
  if (!grid.ok()) return PngError(path, grid.status().message());
  return WritePng(path, grid->pixels.data(), grid->width, grid->height, C);
}

Status CheckImagePixels(const std::string& kind, const std::string& path, uint64_t width,
                        uint64_t height) {
  if (width > 0 && height > 0 && width * height <= kMaxImagePixels) return Status::Ok();
  return Errorf("{} file '{}': {} × {} pixels, {} (the readers take up to {} pixels, as Pillow)",
                kind, path, width, height, width == 0 || height == 0 ? "none" : "too many",
                kMaxImagePixels);
}

Result<PngImage> ReadPng(const std::string& path) {
  DT_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  return DecodePng(bytes, path);
}

Result<PngImage> DecodePng(const std::string& bytes, const std::string& path) {
  png_image image = NewImage();
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return PngError(path, fmt::format("cannot decode: {}", image.message));
  }
  if (Status pixels = CheckImagePixels("PNG", path, image.width, image.height); !pixels.ok()) {
    png_image_free(&image);
    return pixels;
  }
  // 8-bit samples, keeping the file's colour and alpha; palettes are expanded.
  image.format &= PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA;
  PngImage result;
  result.width = static_cast<int>(image.width);
  result.height = static_cast<int>(image.height);
  result.channels = static_cast<int>(PNG_IMAGE_SAMPLE_CHANNELS(image.format));
  result.pixels.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, /*background=*/nullptr, result.pixels.data(),
                             /*row_stride=*/0, /*colormap=*/nullptr)) {
    return PngError(path, fmt::format("cannot decode: {}", image.message));
  }
  return result;
}

}  // namespace difftrain::io
