#include "model/io/image.h"

// jpeglib.h needs size_t and FILE declared first.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <filesystem>
#include <string_view>
#include <utility>

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

// Decodes into `image` (sized before any libjpeg call can longjmp), or with !pixels reads its
// header's width and height alone; false with `errors`' message on failure.
bool DecodeJpeg(const std::string& bytes, PngImage& image, JpegErrors& errors, bool pixels) {
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
  if (!pixels) {
    image.width = static_cast<int>(info.image_width);
    image.height = static_cast<int>(info.image_height);
    jpeg_destroy_decompress(&info);
    return true;
  }
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

constexpr std::string_view kPngMagic = "\x89PNG\r\n\x1a\n";
constexpr std::string_view kJpegMagic = "\xff\xd8\xff";

enum class ImageKind { kPng, kJpeg };

// The file's bytes and which kind of image they are; an error for neither.
Result<std::pair<ImageKind, std::string>> ReadImageBytes(const std::string& path) {
  Result<std::string> read = ReadWholeFile(path);
  if (!read.ok()) return read.status();
  const std::string_view bytes(read->data(), read->size());
  if (bytes.starts_with(kPngMagic)) return std::pair(ImageKind::kPng, std::move(read).value());
  if (bytes.starts_with(kJpegMagic)) return std::pair(ImageKind::kJpeg, std::move(read).value());
  return Errorf("image '{}': neither a PNG nor a JPEG file", path);
}

}  // namespace

bool HasImageExtension(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return extension == ".png" || extension == ".jpg" || extension == ".jpeg";
}

namespace {

// The width and height in the header of `bytes`, a picture of `kind` read from `path`.
Result<ImageSize> SizeOf(ImageKind kind, const std::string& bytes, const std::string& path) {
  ImageSize size;
  if (kind == ImageKind::kPng) {
    // The signature, then IHDR's length and type, then its width and height, big-endian.
    if (bytes.size() < 24 || bytes.compare(12, 4, "IHDR") != 0)
      return Errorf("PNG file '{}': no IHDR chunk first", path);
    const auto be32 = [&bytes](size_t at) {
      uint32_t v = 0;
      for (size_t i = 0; i < 4; ++i)
        v = (v << 8) | static_cast<uint8_t>(bytes[at + i]);
      return v;
    };
    DT_RETURN_IF_ERROR(CheckImagePixels("PNG", path, be32(16), be32(20)));
    size.width = static_cast<int>(be32(16));
    size.height = static_cast<int>(be32(20));
    return size;
  }
  PngImage header;
  JpegErrors errors;
  if (!DecodeJpeg(bytes, header, errors, /*pixels=*/false))
    return Errorf("JPEG file '{}': cannot read its header: {}", path, errors.message);
  DT_RETURN_IF_ERROR(CheckImagePixels("JPEG", path, header.width, header.height));
  size.width = header.width;
  size.height = header.height;
  return size;
}

}  // namespace

Result<PngImage> ReadImage(const std::string& path) {
  DT_ASSIGN_OR_RETURN(const auto file, ReadImageBytes(path));
  const auto& [kind, bytes] = file;
  if (kind == ImageKind::kPng) return DecodePng(bytes, path);
  // Too many pixels are refused from the header, before any is allocated.
  DT_RETURN_IF_ERROR(SizeOf(kind, bytes, path).status());
  PngImage image;
  JpegErrors errors;
  if (!DecodeJpeg(bytes, image, errors, /*pixels=*/true))
    return Errorf("JPEG file '{}': cannot decode: {}", path, errors.message);
  return image;
}

Result<ImageSize> ReadImageSize(const std::string& path) {
  DT_ASSIGN_OR_RETURN(const auto file, ReadImageBytes(path));
  return SizeOf(file.first, file.second, path);
}

}  // namespace difftrain::io
