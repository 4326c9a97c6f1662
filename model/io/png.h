// PNG images through libpng's simplified API: sample grids written by `difftrain sample`
// and training previews, and a reader for tests.
//
// Pixels are 8-bit, row-major and interleaved (H × W × channels), as PNG stores them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace difftrain::io {

// Writes a grey (channels 1) or RGB (channels 3) image atomically: to a temporary name,
// fsynced, renamed over `path` (see AtomicFileWriter).
Status WritePng(const std::string& path, const uint8_t* pixels, int width, int height,
                int channels);

struct PngImage {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA: as the file has them
  std::vector<uint8_t> pixels;  // height × width × channels, 16-bit files reduced to 8
};

// The grid WriteImageGrid writes, as 8-bit pixels (also a frame of an animated GIF).
Result<PngImage> MakeImageGrid(const float* images, int N, int C, int H, int W, int columns,
                               int padding);

// Writes N images [N, C, H, W] (C 1 or 3) with values in [−1, 1] as one PNG grid of
// `columns` images a row (fewer when N is smaller), `padding` black pixels between images and
// around the grid (torchvision's make_grid layout). A value v becomes the byte
// round((clamp(v, −1, 1) + 1) · 127.5); NaN becomes 0. The grid is
// (columns · (W + padding) + padding) wide and (rows · (H + padding) + padding) high.
Status WriteImageGrid(const std::string& path, const float* images, int N, int C, int H, int W,
                      int columns, int padding);

// The most pixels (width × height) a picture read here may have: Pillow's bound, past which
// it refuses a file as a decompression bomb (2 × Image.MAX_IMAGE_PIXELS), so that a dataset
// diffusers' scripts read is read here too. A few hundred bytes of PNG or JPEG can declare
// 65,535² pixels, 12 GB decoded; the readers refuse such a file from its header.
inline constexpr uint64_t kMaxImagePixels = 178'956'970;
// The error for a picture of width × height pixels past kMaxImagePixels (or of none), naming
// `kind` ("PNG", "JPEG") and `path`; Ok otherwise.
Status CheckImagePixels(const std::string& kind, const std::string& path, uint64_t width,
                        uint64_t height);

// Reads a PNG file; an error names the file and says what is wrong with it.
Result<PngImage> ReadPng(const std::string& path);
// The PNG file `bytes`, read from `path` (which errors name).
Result<PngImage> DecodePng(const std::string& bytes, const std::string& path);

}  // namespace difftrain::io
