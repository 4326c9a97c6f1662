#include "model/io/image.h"

// jpeglib.h needs size_t and FILE declared first.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <filesystem>

#include <fmt/format.h>

#include "model/io/posix_file.h"

namespace difftrain::io {
namespace {

// libjpeg reports errors through a callback that must not return: it longjmps back to the
// decoder with the message (nothing with a destructor lives between setjmp and the calls).
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf escape;
  char message[JMSG_LENGTH_MAX];
};

void JpegFailed(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->escape, 1);
}

void JpegWarning(j_common_ptr, int) {}  // corrupt-data warnings: decode what is there

// Decodes into `image` (sized before any libjpeg call can longjmp); false with `errors`'
// message on failure.
bool DecodeJpeg(const std::string& bytes, PngImage& image, JpegErrors& errors) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = JpegFailed;
  errors.manager.emit_message = JpegWarning;
  if (setjmp(errors.escape)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    std::snprintf(errors.message, sizeof(errors.message), "CMYK JPEGs are not supported");
    jpeg_destroy_decompress(&info);
    return false;
  }
  info.out_color_space = info.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&info);
  image.width = static_cast<int>(info.output_width);
  image.height = static_cast<int>(info.output_height);
  image.channels = info.output_components;
  image.pixels.resize(size_t(image.width) * image.height * image.channels);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row =
        image.pixels.data() + size_t(info.output_scanline) * image.width * image.channels;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}

}  // namespace

bool HasImageExtension(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return extension == ".png" || extension == ".jpg" || extension == ".jpeg";
}

Result<PngImage> ReadImage(const std::string& path) {
  DT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  const auto starts = [&bytes](std::string_view magic) {
    return bytes.size() >= magic.size() && std::equal(magic.begin(), magic.end(), bytes.begin());
  };
  if (starts("\x89PNG\r\n\x1a\n")) return ReadPng(path);
  if (!starts("\xff\xd8\xff")) return Errorf("image '{}': neither a PNG nor a JPEG file", path);
  PngImage image;
  JpegErrors errors;
  if (!DecodeJpeg(bytes, image, errors))
    return Errorf("JPEG file '{}': cannot decode: {}", path, errors.message);
  return image;
}

}  // namespace difftrain::io
