// Reading the images a dataset is made of: PNG (through libpng) and JPEG (through libjpeg,
// as Pillow decodes it: islow IDCT, fancy upsampling, so the same pixels), told apart by
// their first bytes, not their names.
#pragma once

#include <string>

#include "common/status.h"
#include "model/io/png.h"

namespace difftrain::io {

// 8-bit pixels, H × W × channels as the file has them: 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA
// (a CMYK JPEG is refused). An error names the file and says what is wrong with it.
Result<PngImage> ReadImage(const std::string& path);

// The width and height ReadImage would give, from the file's header alone (PNG's IHDR, JPEG's
// frame header): no pixels decoded.
struct ImageSize {
  int width = 0, height = 0;
};
Result<ImageSize> ReadImageSize(const std::string& path);

// Whether the file name ends in an image extension ReadImage takes (.png, .jpg, .jpeg; any
// case): how a folder of images is listed.
bool HasImageExtension(const std::string& path);

}  // namespace difftrain::io
