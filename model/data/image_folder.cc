#include "model/data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "model/io/image.h"
#include "model/io/resample.h"

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

// `image` as `channels` 8-bit channels, as PIL's convert does: alpha dropped, grey repeated
// into RGB, colour to ITU-R 601-2 luma in fixed point.
io::PngImage WithChannels(const io::PngImage& image, int channels) {
  io::PngImage out;
  out.width = image.width;
  out.height = image.height;
  out.channels = channels;
  const size_t n = size_t(image.width) * image.height;
  out.pixels.resize(n * channels);
  const bool colour = image.channels >= 3;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = image.pixels.data() + i * image.channels;
    uint8_t* q = out.pixels.data() + i * channels;
    if (channels == 3) {
      for (int k = 0; k < 3; ++k)
        q[k] = colour ? p[k] : p[0];
    } else {
      q[0] =
          colour
              ? static_cast<uint8_t>((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 0x8000u) >> 16)
              : p[0];
    }
  }
  return out;
}

// DiT's center_crop_arr for a picture of width × height: halve with BOX while the shorter side
// is at least 2·size, resize with BICUBIC so that it is `size` (each side × size/shorter,
// rounded half to even as Python's round), take the centred size × size at (left, top).
struct DitCrop {
  int halvings = 0;
  int width = 0, height = 0;  // after BICUBIC
  int left = 0, top = 0;
};
DitCrop PlanDitCrop(int width, int height, int size) {
  DitCrop plan;
  for (; std::min(width, height) >= 2 * size; ++plan.halvings) {
    width /= 2;
    height /= 2;
  }
  const double scale = static_cast<double>(size) / std::min(width, height);
  plan.width = static_cast<int>(std::nearbyint(width * scale));
  plan.height = static_cast<int>(std::nearbyint(height * scale));
  plan.left = (plan.width - size) / 2;
  plan.top = (plan.height - size) / 2;
  return plan;
}

io::PngImage DitCentreCrop(io::PngImage image, int size) {
  const DitCrop plan = PlanDitCrop(image.width, image.height, size);
  for (int i = 0; i < plan.halvings; ++i)
    image = io::Resize(image, image.width / 2, image.height / 2, io::ResampleFilter::kBox);
  image = io::Resize(image, plan.width, plan.height, io::ResampleFilter::kBicubic);
  return io::Crop(image, plan.left, plan.top, size, size);
}

// The centred square of the shorter side, resized to size × size with BOX.
io::PngImage SquareCrop(const io::PngImage& image, int size) {
  const int side = std::min(image.width, image.height);
  const io::PngImage square =
      io::Crop(image, (image.width - side) / 2, (image.height - side) / 2, side, side);
  return io::Resize(square, size, size, io::ResampleFilter::kBox);
}

// The bucketed crop of a picture of width × height into `bucket` (MosaicML diffusion's, centred):
// scaled by s = max(w/W, h/H) to round(W·s) × round(H·s) (half to even, as Python's round, and
// at least the bucket's sides), the centred w × h at (left, top).
struct BucketCrop {
  int width = 0, height = 0;  // after BILINEAR
  int left = 0, top = 0;
};
BucketCrop PlanBucketCrop(int width, int height, SampleSize bucket) {
  const double scale = std::max(static_cast<double>(bucket.width) / width,
                                static_cast<double>(bucket.height) / height);
  BucketCrop plan;
  plan.width = std::max(static_cast<int>(std::nearbyint(width * scale)), bucket.width);
  plan.height = std::max(static_cast<int>(std::nearbyint(height * scale)), bucket.height);
  // The centre as torchvision's CenterCrop takes it: int(round(d / 2.0)), half to even.
  plan.left = static_cast<int>(std::nearbyint((plan.width - bucket.width) / 2.0));
  plan.top = static_cast<int>(std::nearbyint((plan.height - bucket.height) / 2.0));
  return plan;
}

io::PngImage BucketedCrop(const io::PngImage& image, SampleSize bucket) {
  const BucketCrop plan = PlanBucketCrop(image.width, image.height, bucket);
  const io::PngImage resized =
      io::Resize(image, plan.width, plan.height, io::ResampleFilter::kBilinear);
  return io::Crop(resized, plan.left, plan.top, bucket.width, bucket.height);
}

// Step 3: `image` (h × w × channels bytes) as channels × h × w floats x/127.5 − 1.
void Normalise(const io::PngImage& image, float* out) {
  const int channels = image.channels;
  const size_t plane = size_t(image.width) * image.height;
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < channels; ++c)
      out[c * plane + i] = image.pixels[i * channels + c] / 127.5f - 1.0f;
  }
}

}  // namespace

std::vector<SampleSize> AspectRatioBuckets(int size, int step) {
  if (size < 1 || step < 1 || size % step != 0) return {};
  const int64_t area = int64_t{size} * size;
  std::vector<SampleSize> buckets;
  for (int64_t h = size; h <= 2 * int64_t{size}; h += step) {
    const int64_t w = area / h / step * step;  // the widest multiple of step with h·w ≤ size²
    if (2 * w < size) continue;
    buckets.push_back({static_cast<int>(h), static_cast<int>(w)});
    if (h != w) buckets.push_back({static_cast<int>(w), static_cast<int>(h)});
  }
  std::sort(buckets.begin(), buckets.end(), [](SampleSize a, SampleSize b) {
    const int64_t left = int64_t{a.height} * b.width, right = int64_t{b.height} * a.width;
    return left != right ? left < right : a.height < b.height;
  });
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  return buckets;
}

int NearestBucket(const std::vector<SampleSize>& buckets, int width, int height) {
  DT_CHECK(!buckets.empty() && width > 0 && height > 0, "nearest of {} buckets to {}x{}",
           buckets.size(), width, height);
  // |log(height/width) − log(h/w)| = log(M/m) for M, m the larger and smaller of height·w and
  // width·h: bucket a is nearer than b when M_a·m_b < M_b·m_a (128 bits hold the products).
  using Wide = unsigned __int128;
  int best = -1;
  uint64_t best_large = 0, best_small = 0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const SampleSize& b = buckets[k];
    DT_CHECK(b.height > 0 && b.width > 0, "bucket {}x{}", b.height, b.width);
    const uint64_t p = uint64_t(height) * uint64_t(b.width);
    const uint64_t q = uint64_t(width) * uint64_t(b.height);
    const uint64_t large = std::max(p, q), small = std::min(p, q);
    if (best < 0 || Wide{large} * best_small < Wide{best_large} * small) {
      best = static_cast<int>(k);
      best_large = large;
      best_small = small;
    }
  }
  return best;
}

void PrepareImage(const io::PngImage& image, int size, int channels, ImageCrop crop, float* out) {
  if (crop == ImageCrop::kBuckets) return PrepareBucketed(image, {size, size}, channels, out);
  const io::PngImage converted = WithChannels(image, channels);
  Normalise(crop == ImageCrop::kDit ? DitCentreCrop(converted, size) : SquareCrop(converted, size),
            out);
}

void PrepareBucketed(const io::PngImage& image, SampleSize bucket, int channels, float* out) {
  Normalise(BucketedCrop(WithChannels(image, channels), bucket), out);
}

PictureGeometry BucketGeometry(int width, int height, SampleSize bucket) {
  const BucketCrop plan = PlanBucketCrop(width, height, bucket);
  return {.original_height = height,
          .original_width = width,
          .crop_top = plan.top,
          .crop_left = plan.left,
          .height = bucket.height,
          .width = bucket.width};
}

PictureGeometry CropGeometry(int width, int height, int size, ImageCrop crop) {
  if (crop == ImageCrop::kBuckets) return BucketGeometry(width, height, {size, size});
  PictureGeometry g{
      .original_height = height, .original_width = width, .height = size, .width = size};
  if (crop == ImageCrop::kDit) {
    const DitCrop plan = PlanDitCrop(width, height, size);
    g.crop_top = plan.top;
    g.crop_left = plan.left;
    return g;
  }
  // The square's corner in the picture scaled as the square is.
  const int side = std::min(width, height);
  const double scale = static_cast<double>(size) / side;
  g.crop_top = static_cast<int32_t>(std::nearbyint((height - side) / 2 * scale));
  g.crop_left = static_cast<int32_t>(std::nearbyint((width - side) / 2 * scale));
  return g;
}

void PrepareStretched(const io::PngImage& image, int width, int height, int channels, float* out) {
  const io::PngImage resized =
      io::Resize(WithChannels(image, channels), width, height, io::ResampleFilter::kLanczos);
  const size_t plane = size_t(width) * height;
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < channels; ++c)
      out[c * plane + i] = 2.0f * (resized.pixels[i * channels + c] / 255.0f) - 1.0f;
  }
}

Result<std::vector<std::string>> ReadImageCaptions(const ImageFolderDataset& folder,
                                                   const std::string& dir,
                                                   const std::string& column) {
  const auto key = [](const fs::path& p) { return fs::weakly_canonical(p).string(); };
  const auto trimmed = [](std::string text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
      text.pop_back();
    return text;
  };
  std::error_code ec;
  const fs::path metadata = fs::path(dir) / "metadata.jsonl";
  std::map<std::string, std::string> listed;  // by the image's canonical path
  const bool jsonl = fs::is_regular_file(metadata, ec);
  if (jsonl) {
    std::ifstream in(metadata);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (!row.is_object() || !row.contains("file_name") || !row["file_name"].is_string() ||
          !row.contains(column) || !row[column].is_string()) {
        return Errorf(
            "'{}' line {}: expected a JSON object with the strings \"file_name\" and \"{}\"",
            metadata.string(), number, column);
      }
      listed[key(fs::path(dir) / row["file_name"].get<std::string>())] = row[column];
    }
  }
  std::vector<std::string> captions;
  for (int64_t i = 0; i < folder.size(); ++i) {
    const fs::path image = folder.file(i);
    if (jsonl) {
      const auto found = listed.find(key(image));
      if (found == listed.end())
        return Errorf("'{}' has no line for the image '{}'", metadata.string(), image.string());
      captions.push_back(found->second);
      continue;
    }
    std::optional<std::string> caption;
    for (const char* extension : {".txt", ".caption"}) {
      fs::path sidecar = image;
      sidecar.replace_extension(extension);
      if (!fs::is_regular_file(sidecar, ec)) continue;
      std::ifstream in(sidecar);
      caption = trimmed(std::string(std::istreambuf_iterator<char>(in), {}));
      break;
    }
    if (!caption) {
      return Errorf("the image '{}' has no caption: no {} and no {} or .caption file beside it",
                    image.string(), metadata.string(), image.stem().string() + ".txt");
    }
    captions.push_back(*caption);
  }
  return captions;
}

void PrepareMask(const io::PngImage& image, int width, int height, float* out) {
  const io::PngImage resized = io::Resize(WithChannels(image, image.channels >= 3 ? 3 : 1), width,
                                          height, io::ResampleFilter::kLanczos);
  const io::PngImage grey = WithChannels(resized, 1);
  for (size_t i = 0; i < grey.pixels.size(); ++i)
    out[i] = grey.pixels[i] / 255.0f >= 0.5f ? 1.0f : 0.0f;
}

Result<std::unique_ptr<ImageFolderDataset>> ImageFolderDataset::Open(
    const std::string& dir, int size, int channels, ImageCrop crop,
    std::vector<SampleSize> buckets) {
  if (size < 1) return Errorf("image_folder: the image size must be positive, got {}", size);
  if (channels != 1 && channels != 3)
    return Errorf("image_folder: channels must be 1 (grey) or 3 (RGB), got {}", channels);
  if (crop != ImageCrop::kBuckets && !buckets.empty())
    return Status::Error("image_folder: buckets are for the buckets crop");
  if (crop == ImageCrop::kBuckets) {
    if (buckets.empty()) {
      buckets = AspectRatioBuckets(size);
      if (buckets.empty()) {
        return Errorf(
            "image_folder: the automatic aspect-ratio buckets need an image size that is a "
            "multiple of 64, got {}; give the buckets",
            size);
      }
    }
    for (size_t k = 0; k < buckets.size(); ++k) {
      const SampleSize& b = buckets[k];
      if (b.height < 1 || b.width < 1)
        return Errorf("image_folder: bucket {}x{} (height x width) has a side below 1", b.height,
                      b.width);
      if (std::find(buckets.begin(), buckets.begin() + k, b) != buckets.begin() + k)
        return Errorf("image_folder: bucket {}x{} is given twice", b.height, b.width);
    }
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Errorf("image_folder '{}': not a directory", dir);
  std::unique_ptr<ImageFolderDataset> d(new ImageFolderDataset());
  d->size_ = size;
  d->channels_ = channels;
  d->crop_ = crop;
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
  if (crop == ImageCrop::kBuckets) {
    // Each picture's size from its header alone, and so its bucket.
    d->buckets_ = std::move(buckets);
    d->bucket_of_.reserve(d->files_.size());
    d->picture_sizes_.reserve(d->files_.size());
    for (const std::string& file : d->files_) {
      Result<io::ImageSize> picture = io::ReadImageSize(file);
      if (!picture.ok()) return picture.status().WithContext("image_folder '" + dir + "'");
      if (picture->width < 1 || picture->height < 1)
        return Errorf("image_folder '{}': image '{}' is empty", dir, file);
      d->bucket_of_.push_back(NearestBucket(d->buckets_, picture->width, picture->height));
      d->picture_sizes_.push_back({picture->height, picture->width});
    }
  }
  return d;
}

std::vector<SampleSize> ImageFolderDataset::buckets() const {
  return crop_ == ImageCrop::kBuckets ? buckets_ : Dataset::buckets();
}

int ImageFolderDataset::BucketOf(int64_t index) const {
  return crop_ == ImageCrop::kBuckets ? bucket_of_[index] : 0;
}

Status ImageFolderDataset::Get(int64_t index, float* image, int32_t* label) const {
  DT_ASSIGN_OR_RETURN(const io::PngImage decoded, io::ReadImage(files_[index]));
  if (decoded.width < 1 || decoded.height < 1) return Errorf("image '{}' is empty", files_[index]);
  if (crop_ == ImageCrop::kBuckets)
    PrepareBucketed(decoded, buckets_[bucket_of_[index]], channels_, image);
  else
    PrepareImage(decoded, size_, channels_, crop_, image);
  *label = labels_[index];
  return Status::Ok();
}

Status ImageFolderDataset::GetGeometry(int64_t index, PictureGeometry* geometry) const {
  if (crop_ == ImageCrop::kBuckets) {
    const SampleSize& picture = picture_sizes_[index];
    *geometry = BucketGeometry(picture.width, picture.height, buckets_[bucket_of_[index]]);
    return Status::Ok();
  }
  DT_ASSIGN_OR_RETURN(const io::ImageSize size, io::ReadImageSize(files_[index]));
  if (size.width < 1 || size.height < 1) return Errorf("image '{}' is empty", files_[index]);
  *geometry = CropGeometry(size.width, size.height, size_, crop_);
  return Status::Ok();
}

}  // namespace difftrain
