#include "model/data/image_folder.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "model/io/image.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// The image files under `dir`, recursively, sorted by path.
std::vector<std::string> ImagesUnder(const fs::path& dir, std::error_code& ec) {
  std::vector<std::string> files;
  for (fs::recursive_directory_iterator
           it(dir, fs::directory_options::follow_directory_symlink, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && io::HasImageExtension(it->path().string()))
      files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// PIL's BOX resampling from `in` pixels to `out`: output j is the mean of the input pixels
// [first, end) whose centres lie in its footprint, (j + 0.5)·in/out ± in/(2·out) (at least
// one pixel wide when enlarging): PIL's bounds and its box test, whose pixels are contiguous.
struct BoxSpan {
  int first = 0, end = 0;
  float weight = 0;  // 1 / (end − first)
};

std::vector<BoxSpan> BoxSpans(int in, int out) {
  const double scale = double(in) / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 0.5 * filter_scale;
  std::vector<BoxSpan> spans(out);
  for (int j = 0; j < out; ++j) {
    const double center = (j + 0.5) * scale;
    BoxSpan& span = spans[j];
    span.first = -1;
    for (int i = std::max(static_cast<int>(center - support + 0.5), 0),
             end = std::min(static_cast<int>(center + support + 0.5), in);
         i < end; ++i) {
      const double x = (i - center + 0.5) / filter_scale;
      if (x > -0.5 && x <= 0.5) {
        if (span.first < 0) span.first = i;
        span.end = i + 1;
      }
    }
    if (span.first < 0) span.first = span.end = std::min(static_cast<int>(center), in - 1);
    if (span.end == span.first) ++span.end;  // never empty: the pixel under the centre
    span.weight = 1.0f / static_cast<float>(span.end - span.first);
  }
  return spans;
}

}  // namespace

void PrepareImage(const io::PngImage& image, int size, int channels, float* out) {
  const int side = std::min(image.width, image.height);
  const int top = (image.height - side) / 2, left = (image.width - side) / 2;
  const bool colour = image.channels >= 3;
  // The square's pixel value of channel c as a float byte.
  const auto at = [&](int y, int x, int c) -> float {
    const uint8_t* p =
        image.pixels.data() + (size_t(top + y) * image.width + left + x) * size_t(image.channels);
    if (!colour) return p[0];
    if (channels == 3) return p[c];
    return static_cast<float>((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 0x8000u) >> 16);
  };
  const std::vector<BoxSpan> spans = BoxSpans(side, size);
  std::vector<float> rows(size_t(side) * size);  // horizontally resized: [side, size]
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < side; ++y) {
      for (int j = 0; j < size; ++j) {
        float sum = 0;
        for (int x = spans[j].first; x < spans[j].end; ++x)
          sum += at(y, x, c);
        rows[size_t(y) * size + j] = sum * spans[j].weight;
      }
    }
    float* plane = out + size_t(c) * size * size;
    for (int i = 0; i < size; ++i) {
      for (int j = 0; j < size; ++j) {
        float sum = 0;
        for (int y = spans[i].first; y < spans[i].end; ++y)
          sum += rows[size_t(y) * size + j];
        plane[size_t(i) * size + j] = sum * spans[i].weight / 127.5f - 1.0f;
      }
    }
  }
}

Result<std::unique_ptr<ImageFolderDataset>> ImageFolderDataset::Open(const std::string& dir,
                                                                     int size, int channels) {
  if (size < 1) return Errorf("image_folder: the image size must be positive, got {}", size);
  if (channels != 1 && channels != 3)
    return Errorf("image_folder: channels must be 1 (grey) or 3 (RGB), got {}", channels);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Errorf("image_folder '{}': not a directory", dir);
  std::unique_ptr<ImageFolderDataset> d(new ImageFolderDataset());
  d->size_ = size;
  d->channels_ = channels;
  std::vector<std::string> subfolders;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) subfolders.push_back(it->path().filename().string());
  }
  std::sort(subfolders.begin(), subfolders.end());
  if (subfolders.empty()) {
    d->files_ = ImagesUnder(dir, ec);
    d->labels_.assign(d->files_.size(), 0);
  }
  for (size_t label = 0; label < subfolders.size() && !ec; ++label) {
    const std::vector<std::string> files = ImagesUnder(fs::path(dir) / subfolders[label], ec);
    if (!ec && files.empty()) {
      return Errorf("image_folder '{}': class folder '{}' holds no .png, .jpg or .jpeg file", dir,
                    subfolders[label]);
    }
    d->files_.insert(d->files_.end(), files.begin(), files.end());
    d->labels_.insert(d->labels_.end(), files.size(), static_cast<int32_t>(label));
  }
  if (ec) return Errorf("image_folder '{}': cannot list it: {}", dir, ec.message());
  if (d->files_.empty()) return Errorf("image_folder '{}': no .png, .jpg or .jpeg file in it", dir);
  d->classes_ = std::move(subfolders);
  return d;
}

Status ImageFolderDataset::Get(int64_t index, float* image, int32_t* label) const {
  DT_ASSIGN_OR_RETURN(const io::PngImage decoded, io::ReadImage(files_[index]));
  if (decoded.width < 1 || decoded.height < 1) return Errorf("image '{}' is empty", files_[index]);
  PrepareImage(decoded, size_, channels_, image);
  *label = labels_[index];
  return Status::Ok();
}

}  // namespace difftrain
