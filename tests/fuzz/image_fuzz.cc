// libFuzzer target: the image readers (model/io/image.h: PNG through libpng, JPEG through
// libjpeg, and the header-only size reader) on arbitrary bytes. A dataset's pictures and
// `difftrain sample --image`/`--mask` are whatever a user's folder holds, so a file must decode
// or be an error, never crash or hang; and the two readers must agree: a picture ReadImage
// decodes has the width and height ReadImageSize reads from its header (the aspect-ratio buckets
// are chosen from the header before any picture is decoded), and as many pixels as its size
// says. A picture past the pixel bound must be refused before its pixels are allocated (the
// run's malloc limit, 2 GB, reports the allocation otherwise).
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/io/image.h"
#include "tests/fuzz/memory_file.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain;
  const fuzz::MemoryFile file(data, size);
  const std::string path = file.path();
  Result<io::ImageSize> header = io::ReadImageSize(path);
  Result<io::PngImage> image = io::ReadImage(path);
  if (!image.ok()) return 0;
  if (image->width <= 0 || image->height <= 0 || image->channels < 1 || image->channels > 4)
    std::abort();
  if (uint64_t(image->width) * image->height > io::kMaxImagePixels) std::abort();
  if (image->pixels.size() != size_t(image->width) * image->height * image->channels) std::abort();
  if (!header.ok() || header->width != image->width || header->height != image->height)
    std::abort();
  return 0;
}
