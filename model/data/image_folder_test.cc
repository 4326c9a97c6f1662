// The image folder against Pillow (tests/reference/images.py writes PNG and JPEG files in
// every colour mode and what Pillow decodes and resizes them into), and its layout and errors.
#include "model/data/image_folder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <zlib.h>

#include "common/temp_dir.h"
#include "model/io/image.h"
#include "model/io/resample.h"
#include "model/io/safetensors.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ShellQuote;

constexpr int kSize = 16;

// Aspect-ratio buckets around kSize² (height × width): a landscape, the square, a portrait; the
// test's pictures fall into each (images.py: 1 landscape, 4 square, 3 portrait).
const std::vector<SampleSize> kBuckets = {
    {kSize * 3 / 4, kSize * 5 / 4}, {kSize, kSize}, {kSize * 5 / 4, kSize * 3 / 4}};

std::string BucketsArgument() {
  std::string text;
  for (const SampleSize& b : kBuckets)
    text += (text.empty() ? "" : ",") + std::to_string(b.height) + "x" + std::to_string(b.width);
  return text;
}

class ImageFolderPillowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::CommandResult r = RunCommand(
        "/usr/bin/python3 " + ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/images.py") +
        " make " + ShellQuote(dir()) + " " + std::to_string(kSize) + " " + BucketsArgument() +
        " 2>&1");
    if (r.output.find("No module named") != std::string::npos)
      GTEST_SKIP() << "Pillow or numpy is not installed (scripts/install-deps.sh): " << r.output;
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Result<io::SafetensorsFile> expected =
        io::SafetensorsFile::Read(dir() + "/expected.safetensors");
    ASSERT_TRUE(expected.ok()) << expected.status().message();
    expected_.emplace(std::move(expected).value());
  }
  std::string dir() const { return temp_.path(); }
  std::vector<float> Expected(const std::string& name, size_t n) const {
    std::vector<float> v(n);
    EXPECT_TRUE(expected_->CopyF32(name, expected_->Find(name)->shape, v.data()).ok()) << name;
    return v;
  }

  TempDir temp_{"image_folder"};
  std::optional<io::SafetensorsFile> expected_;
};

// Decoding gives Pillow's bytes exactly (libpng; libjpeg with Pillow's settings).
TEST_F(ImageFolderPillowTest, DecodesAsPillow) {
  Result<std::unique_ptr<ImageFolderDataset>> d =
      ImageFolderDataset::Open(dir() + "/images", kSize, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ((*d)->size(), 8);
  for (int64_t k = 0; k < (*d)->size(); ++k) {
    SCOPED_TRACE((*d)->file(k));
    Result<io::PngImage> image = io::ReadImage((*d)->file(k));
    ASSERT_TRUE(image.ok()) << image.status().message();
    const io::TensorView* want = expected_->Find("pixels." + std::to_string(k));
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(want->shape, (std::vector<int64_t>{image->height, image->width, image->channels}));
    ASSERT_EQ(want->bytes, image->pixels.size());
    EXPECT_EQ(std::memcmp(want->data, image->pixels.data(), want->bytes), 0);
  }
}

// Every crop and resize gives Pillow's bytes: DiT's center_crop_arr (BOX halvings — twice for
// the 90×70 JPEG — then BICUBIC, shrinking and enlarging) and the square crop with BOX, RGB and
// grey, so the floats differ from DiT's transform only by fp32's rounding of x/127.5 − 1
// against (x/255 − 0.5)/0.5. (A float BOX resize without Pillow's byte rounding measured one
// byte off; a crop one pixel off, 0.67.)
TEST_F(ImageFolderPillowTest, PreparesImagesAsPillowDoes) {
  for (const auto& [crop, name] :
       {std::pair{ImageCrop::kDit, "dit"}, std::pair{ImageCrop::kSquare, "square"}}) {
    for (int channels : {3, 1}) {
      SCOPED_TRACE(std::string(name) + (channels == 3 ? " rgb" : " grey"));
      Result<std::unique_ptr<ImageFolderDataset>> d =
          ImageFolderDataset::Open(dir() + "/images", kSize, channels, crop);
      ASSERT_TRUE(d.ok()) << d.status().message();
      EXPECT_EQ((*d)->classes(), (std::vector<std::string>{"bags", "shoes"}));
      const size_t n = size_t(channels) * kSize * kSize;
      for (int64_t k = 0; k < (*d)->size(); ++k) {
        SCOPED_TRACE((*d)->file(k));
        std::vector<float> got(n);
        int32_t label = -1;
        ASSERT_TRUE((*d)->Get(k, got.data(), &label).ok());
        EXPECT_EQ(label, k < 3 ? 0 : 1);
        const std::vector<float> want = Expected(
            std::string(name) + (channels == 3 ? ".rgb." : ".grey.") + std::to_string(k), n);
        double worst = 0;
        for (size_t i = 0; i < n; ++i)
          worst = std::max(worst, std::abs(double(got[i]) - want[i]));
        EXPECT_LE(worst, 1e-6);
      }
    }
  }
}

// Each picture's size from its header alone (PNG and JPEG, every colour mode) is the size
// decoding gives, and the folder's geometry of each is CropGeometry of it.
TEST_F(ImageFolderPillowTest, ReadsEachPicturesSizeFromItsHeader) {
  Result<std::unique_ptr<ImageFolderDataset>> d =
      ImageFolderDataset::Open(dir() + "/images", kSize, 3, ImageCrop::kSquare);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_TRUE((*d)->has_geometry());
  for (int64_t k = 0; k < (*d)->size(); ++k) {
    SCOPED_TRACE((*d)->file(k));
    Result<io::PngImage> image = io::ReadImage((*d)->file(k));
    Result<io::ImageSize> size = io::ReadImageSize((*d)->file(k));
    ASSERT_TRUE(image.ok() && size.ok());
    EXPECT_EQ(size->width, image->width);
    EXPECT_EQ(size->height, image->height);
    PictureGeometry geometry;
    ASSERT_TRUE((*d)->GetGeometry(k, &geometry).ok());
    EXPECT_EQ(geometry, CropGeometry(image->width, image->height, kSize, ImageCrop::kSquare));
  }
}

// diffusers' image to image input (VaeImageProcessor.preprocess to a size): Pillow's LANCZOS
// bytes, shrinking one side and enlarging the other (or both), RGB and grey, and its
// 2·(x/255) − 1.
TEST_F(ImageFolderPillowTest, StretchesAsDiffusersImageProcessor) {
  Result<std::unique_ptr<ImageFolderDataset>> d =
      ImageFolderDataset::Open(dir() + "/images", kSize, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const int width = kSize + 3, height = kSize - 2;
  for (int channels : {3, 1}) {
    const size_t n = size_t(channels) * width * height;
    for (int64_t k = 0; k < (*d)->size(); ++k) {
      SCOPED_TRACE((*d)->file(k) + (channels == 3 ? " rgb" : " grey"));
      Result<io::PngImage> image = io::ReadImage((*d)->file(k));
      ASSERT_TRUE(image.ok()) << image.status().message();
      std::vector<float> got(n);
      PrepareStretched(*image, width, height, channels, got.data());
      const std::vector<float> want =
          Expected((channels == 3 ? "stretch.rgb." : "stretch.grey.") + std::to_string(k), n);
      EXPECT_EQ(got, want);
    }
  }
}

TEST_F(ImageFolderPillowTest, PreparesMasksAsDiffusersMaskProcessor) {
  Result<std::unique_ptr<ImageFolderDataset>> d =
      ImageFolderDataset::Open(dir() + "/images", kSize, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const int width = kSize + 3, height = kSize - 2;
  const size_t n = size_t(width) * height;
  size_t painted = 0;
  for (int64_t k = 0; k < (*d)->size(); ++k) {
    SCOPED_TRACE((*d)->file(k));
    Result<io::PngImage> image = io::ReadImage((*d)->file(k));
    ASSERT_TRUE(image.ok()) << image.status().message();
    std::vector<float> got(n);
    PrepareMask(*image, width, height, got.data());
    EXPECT_EQ(got, Expected("mask." + std::to_string(k), n));
    painted += std::count(got.begin(), got.end(), 1.0f);
  }
  // Both halves of a binary mask occur.
  EXPECT_GT(painted, 0u);
  EXPECT_LT(painted, n * (*d)->size());
}

// Pillow's BILINEAR (torchvision's Resize of a PIL image) byte for byte: RGB and grey, every
// test picture to a size that shrinks one side and enlarges the other (or both), to one that
// enlarges both, and to 5 × 7, which shrinks both several times.
TEST_F(ImageFolderPillowTest, ResizesWithBilinearAsPillow) {
  int compared = 0;
  for (int64_t k = 0; k < 8; ++k) {
    for (const char* key : {"rgb", "grey"}) {
      const std::string suffix = std::string(".") + key + "." + std::to_string(k);
      const io::TensorView* src = expected_->Find("bilinear.src" + suffix);
      ASSERT_NE(src, nullptr) << suffix;
      io::PngImage image;
      image.height = static_cast<int>(src->shape[0]);
      image.width = static_cast<int>(src->shape[1]);
      image.channels = static_cast<int>(src->shape[2]);
      const auto* bytes = static_cast<const uint8_t*>(src->data);
      image.pixels.assign(bytes, bytes + src->bytes);
      for (int j = 0; j < 3; ++j) {
        const io::TensorView* want = expected_->Find("bilinear." + std::to_string(j) + suffix);
        ASSERT_NE(want, nullptr) << j << suffix;
        SCOPED_TRACE(::testing::Message() << image.width << "x" << image.height << " to "
                                          << want->shape[1] << "x" << want->shape[0] << suffix);
        const io::PngImage got =
            io::Resize(image, static_cast<int>(want->shape[1]), static_cast<int>(want->shape[0]),
                       io::ResampleFilter::kBilinear);
        ASSERT_EQ(got.pixels.size(), want->bytes);
        EXPECT_EQ(std::memcmp(got.pixels.data(), want->data, want->bytes), 0);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 8 * 2 * 3);
}

// The bucketed crop against MosaicML diffusion's (centred) with torchvision's Resize, in Pillow:
// each picture in the bucket nearest its aspect ratio (the landscape, the square and the
// portrait all taken, enlarging the 9 × 12 PNG and shrinking the others), scaled to cover it
// with BILINEAR in one pass (25 × 40 to 12.5 → 12 × 20: half to even, as Python's round), the
// centred crop; RGB and grey. The bytes equal Pillow's exactly (the
// floats differ from (x/255 − 0.5)/0.5 only by fp32's rounding), and so does the geometry:
// original size, the crop's corner in the resized picture, the bucket's size.
TEST_F(ImageFolderPillowTest, CropsIntoAspectRatioBucketsAsPillow) {
  std::vector<int> taken(kBuckets.size());
  for (int channels : {3, 1}) {
    SCOPED_TRACE(channels == 3 ? "rgb" : "grey");
    Result<std::unique_ptr<ImageFolderDataset>> d =
        ImageFolderDataset::Open(dir() + "/images", kSize, channels, ImageCrop::kBuckets, kBuckets);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ((*d)->buckets(), kBuckets);
    EXPECT_TRUE((*d)->bucketed());
    EXPECT_EQ((*d)->height(), kSize);  // the nominal size
    EXPECT_EQ((*d)->width(), kSize);
    for (int64_t k = 0; k < (*d)->size(); ++k) {
      SCOPED_TRACE((*d)->file(k));
      const io::TensorView* bucket = expected_->Find("bucket." + std::to_string(k));
      ASSERT_NE(bucket, nullptr);
      const int want_bucket = *static_cast<const int32_t*>(bucket->data);
      ASSERT_EQ((*d)->BucketOf(k), want_bucket);
      if (channels == 3) ++taken[want_bucket];
      const SampleSize size = kBuckets[want_bucket];
      const size_t n = size_t(channels) * size.area();
      ASSERT_EQ((*d)->SampleFloats(k), static_cast<int64_t>(n));
      std::vector<float> got(n + 1, 7.0f);  // one more: nothing is written past the sample
      int32_t label = -1;
      ASSERT_TRUE((*d)->Get(k, got.data(), &label).ok());
      EXPECT_EQ(label, k < 3 ? 0 : 1);
      EXPECT_EQ(got[n], 7.0f);
      const std::vector<float> want = Expected(
          std::string(channels == 3 ? "buckets.rgb." : "buckets.grey.") + std::to_string(k), n);
      double worst = 0;
      size_t bytes_differ = 0;
      for (size_t i = 0; i < n; ++i) {
        worst = std::max(worst, std::abs(double(got[i]) - want[i]));
        bytes_differ += std::lround((got[i] + 1.0) * 127.5) != std::lround((want[i] + 1.0) * 127.5);
      }
      EXPECT_LE(worst, 1e-6);
      EXPECT_EQ(bytes_differ, 0u);

      PictureGeometry geometry;
      ASSERT_TRUE((*d)->GetGeometry(k, &geometry).ok());
      const io::TensorView* g = expected_->Find("bucket_geometry." + std::to_string(k));
      ASSERT_NE(g, nullptr);
      const auto* w = static_cast<const int32_t*>(g->data);
      EXPECT_EQ(geometry, (PictureGeometry{w[0], w[1], w[2], w[3], w[4], w[5]}));
      EXPECT_EQ(geometry, BucketGeometry(w[1], w[0], size));
    }
  }
  EXPECT_EQ(taken, (std::vector<int>{1, 4, 3}));
}

TEST(ImageFolderTest, AFolderWithoutSubfoldersIsUnlabelled) {
  TempDir temp("image_folder_flat");
  const std::vector<uint8_t> pixels(4 * 6 * 3, 200);
  ASSERT_TRUE(io::WritePng(temp.path() + "/b.png", pixels.data(), 6, 4, 3).ok());
  ASSERT_TRUE(io::WritePng(temp.path() + "/a.png", pixels.data(), 6, 4, 3).ok());
  std::ofstream(temp.path() + "/notes.txt") << "not an image";
  Result<std::unique_ptr<ImageFolderDataset>> d = ImageFolderDataset::Open(temp.path(), 2, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->size(), 2);
  EXPECT_EQ((*d)->num_classes(), 0);
  EXPECT_EQ((*d)->file(0), temp.path() + "/a.png");
  std::vector<float> image(3 * 2 * 2);
  int32_t label = -1;
  ASSERT_TRUE((*d)->Get(1, image.data(), &label).ok());
  EXPECT_EQ(label, 0);
  for (float v : image)
    EXPECT_FLOAT_EQ(v, 200 / 127.5f - 1);
}

// Where step 2 crops, as SDXL's time ids take it: the original size, the crop's corner in the
// picture scaled as the crop is, the crop's size. Worked by hand from DiT's center_crop_arr (BOX
// halvings while the shorter side is ≥ 2·S, sides × S/shorter rounded half to even, the
// centred crop at ⌊(side − S)/2⌋) and the square crop (the square's corner × S/side, rounded).
TEST(ImageFolderTest, CropGeometryIsWhereStep2Crops) {
  struct Case {
    int width, height, size;
    ImageCrop crop;
    PictureGeometry want;
  };
  const Case cases[] = {
      // 40×24 → 26.67 → 27×16, crop at (5, 0).
      {40, 24, 16, ImageCrop::kDit, {24, 40, 0, 5, 16, 16}},
      // 24×60 → 16×40, crop at (0, 12).
      {24, 60, 16, ImageCrop::kDit, {60, 24, 12, 0, 16, 16}},
      // 90×70 halved twice → 22×17 → 20.7 → 21×16, crop at (2, 0).
      {90, 70, 16, ImageCrop::kDit, {70, 90, 0, 2, 16, 16}},
      // 50×12 → 33.3 → 33×8, crop at (12, 0).
      {50, 12, 8, ImageCrop::kDit, {12, 50, 0, 12, 8, 8}},
      {16, 16, 16, ImageCrop::kDit, {16, 16, 0, 0, 16, 16}},
      // The 24² square at (8, 0) of 40×24, × 16/24: (5.33, 0) → (5, 0).
      {40, 24, 16, ImageCrop::kSquare, {24, 40, 0, 5, 16, 16}},
      // The 24² square at (0, 18) of 24×60: (0, 12).
      {24, 60, 16, ImageCrop::kSquare, {60, 24, 12, 0, 16, 16}},
      // The 70² square at (10, 0) of 90×70, × 16/70: (2.29, 0) → (2, 0).
      {90, 70, 16, ImageCrop::kSquare, {70, 90, 0, 2, 16, 16}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.width << "x" << c.height << " to " << c.size
                                      << (c.crop == ImageCrop::kDit ? " dit" : " square"));
    const PictureGeometry got = CropGeometry(c.width, c.height, c.size, c.crop);
    EXPECT_EQ(std::vector<int>({got.original_height, got.original_width, got.crop_top,
                                got.crop_left, got.height, got.width}),
              std::vector<int>({c.want.original_height, c.want.original_width, c.want.crop_top,
                                c.want.crop_left, c.want.height, c.want.width}));
  }
}

// kBuckets' crop worked by hand: s = max(w/W, h/H), sides round(W·s), round(H·s) (half to
// even, at least the bucket's), the centred crop at ⌊(rw − w)/2⌋, ⌊(rh − h)/2⌋.
TEST(ImageFolderTest, BucketGeometryIsWhereTheBucketedCropCrops) {
  struct Case {
    int width, height;
    SampleSize bucket;
    PictureGeometry want;
  };
  const Case cases[] = {
      // 53×37 into 12 × 20: s = 20/53, 20 × 13.96 → 20 × 14, crop at (0, 1).
      {53, 37, {12, 20}, {37, 53, 1, 0, 12, 20}},
      // 9×12 into 20 × 12 (enlarging): s = 20/12, 15 × 20, crop at (2, 0): CenterCrop's
      // round(3/2) = 2 (half to even; rounding down would crop at 1).
      {9, 12, {20, 12}, {12, 9, 0, 2, 20, 12}},
      // 100² into 64 × 128: s = 1.28, 128 × 128, crop at (0, 32).
      {100, 100, {64, 128}, {100, 100, 32, 0, 64, 128}},
      // 11×2 into 3 × 3: s = 1.5, 16.5 → 16 (half to even; half up would crop at 7), at (6, 0).
      {11, 2, {3, 3}, {2, 11, 0, 6, 3, 3}},
      // The bucket's own size: no resize, no offset.
      {832, 1216, {1216, 832}, {1216, 832, 0, 0, 1216, 832}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.width << "x" << c.height << " into " << c.bucket.height
                                      << "x" << c.bucket.width);
    EXPECT_EQ(BucketGeometry(c.width, c.height, c.bucket), c.want);
  }
  // CropGeometry of kBuckets is the bucket size × size.
  EXPECT_EQ(CropGeometry(53, 37, 16, ImageCrop::kBuckets), BucketGeometry(53, 37, {16, 16}));
}

// SDXL's buckets for 1024: its nine best known sizes among them, symmetric, sides multiples of
// 64, no more than 1024² pixels each, the shorter side the longest that fits, sorted by h/w.
TEST(ImageFolderTest, AspectRatioBucketsAreSdxls) {
  const std::vector<SampleSize> buckets = AspectRatioBuckets(1024);
  const std::vector<SampleSize> want = {
      {512, 2048}, {512, 1984}, {512, 1920},  {512, 1856}, {576, 1792}, {576, 1728}, {576, 1664},
      {640, 1600}, {640, 1536}, {704, 1472},  {704, 1408}, {768, 1344}, {768, 1280}, {832, 1216},
      {896, 1152}, {960, 1088}, {1024, 1024}, {1088, 960}, {1152, 896}, {1216, 832}, {1280, 768},
      {1344, 768}, {1408, 704}, {1472, 704},  {1536, 640}, {1600, 640}, {1664, 576}, {1728, 576},
      {1792, 576}, {1856, 512}, {1920, 512},  {1984, 512}, {2048, 512}};
  EXPECT_EQ(buckets, want);
  const auto has = [&](int h, int w) {
    return std::find(buckets.begin(), buckets.end(), SampleSize{h, w}) != buckets.end();
  };
  for (const auto& [h, w] : std::vector<std::pair<int, int>>{{1024, 1024},
                                                             {1152, 896},
                                                             {896, 1152},
                                                             {1216, 832},
                                                             {832, 1216},
                                                             {1344, 768},
                                                             {768, 1344},
                                                             {1536, 640},
                                                             {640, 1536}}) {
    EXPECT_TRUE(has(h, w)) << h << "x" << w;
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    const SampleSize& b = buckets[k];
    SCOPED_TRACE(::testing::Message() << b.height << "x" << b.width);
    EXPECT_TRUE(has(b.width, b.height));
    EXPECT_EQ(b.height % 64, 0);
    EXPECT_EQ(b.width % 64, 0);
    EXPECT_LE(b.area(), 1024 * 1024);
    // The shorter side as long as it goes for the longer (the rule's w for h ≥ w, transposed).
    EXPECT_GT(int64_t{std::max(b.height, b.width)} * (std::min(b.height, b.width) + 64),
              1024 * 1024);
    if (k > 0) {  // strictly ascending h/w: no duplicates
      const SampleSize& a = buckets[k - 1];
      EXPECT_LT(int64_t{a.height} * b.width, int64_t{b.height} * a.width);
    }
  }
  // Small sizes and other steps; a size that is not a multiple of the step has none.
  EXPECT_EQ(AspectRatioBuckets(64), (std::vector<SampleSize>{{64, 64}}));
  EXPECT_EQ(AspectRatioBuckets(128),
            (std::vector<SampleSize>{{64, 256}, {64, 192}, {128, 128}, {192, 64}, {256, 64}}));
  EXPECT_EQ(AspectRatioBuckets(32, 16),
            (std::vector<SampleSize>{{16, 64}, {16, 48}, {32, 32}, {48, 16}, {64, 16}}));
  EXPECT_TRUE(AspectRatioBuckets(1000).empty());
  EXPECT_TRUE(AspectRatioBuckets(0).empty());
  EXPECT_TRUE(AspectRatioBuckets(64, 0).empty());
}

// The nearest aspect ratio in log space, exactly: a picture of a bucket's own ratio (at any
// scale) takes it; equal distances (a square between a ratio and its inverse, or two buckets
// of one ratio) go to the earlier bucket.
TEST(ImageFolderTest, NearestBucketTakesTheNearestRatio) {
  const std::vector<SampleSize> sdxl = AspectRatioBuckets(1024);
  for (size_t k = 0; k < sdxl.size(); ++k) {
    EXPECT_EQ(NearestBucket(sdxl, sdxl[k].width, sdxl[k].height), static_cast<int>(k));
    EXPECT_EQ(NearestBucket(sdxl, 3 * sdxl[k].width / 64, 3 * sdxl[k].height / 64),
              static_cast<int>(k));
  }
  // 4000 × 3000 (h/w 0.75): 896 × 1152 (0.778) is nearer than 832 × 1216 (0.684).
  EXPECT_EQ(sdxl[NearestBucket(sdxl, 4000, 3000)], (SampleSize{896, 1152}));
  // Beyond the widest ratio, the widest.
  EXPECT_EQ(NearestBucket(sdxl, 100000, 10), 0);
  EXPECT_EQ(NearestBucket(sdxl, 10, 100000), static_cast<int>(sdxl.size()) - 1);
  // Ties: log distances equal (|log(16/16) − log(20/12)| = |log(16/16) − log(12/20)|).
  EXPECT_EQ(NearestBucket({{20, 12}, {12, 20}}, 16, 16), 0);
  EXPECT_EQ(NearestBucket({{12, 20}, {20, 12}}, 16, 16), 0);
  EXPECT_EQ(NearestBucket({{16, 16}, {32, 32}}, 5, 5), 0);
  EXPECT_EQ(NearestBucket({{12, 20}, {16, 16}, {20, 12}}, 53, 37), 0);
  // Sides whose products need more than 64 bits when compared.
  EXPECT_EQ(
      NearestBucket({{1 << 30, (1 << 30) - 1}, {(1 << 30) - 1, 1 << 30}}, (1 << 30) - 1, 1 << 30),
      0);
  EXPECT_EQ(
      NearestBucket({{(1 << 30) - 1, 1 << 30}, {1 << 30, (1 << 30) - 1}}, (1 << 30) - 1, 1 << 30),
      1);
}

// Without kBuckets a folder has its one bucket S × S; with one bucket given, its size is the
// dataset's (not bucketed); the buckets' refusals name what is wrong.
TEST(ImageFolderTest, BucketsOfAFolderAndTheirRefusals) {
  TempDir temp("image_folder_buckets");
  const std::string root = temp.path();
  const std::vector<uint8_t> pixels(30 * 20 * 3, 90);
  ASSERT_TRUE(io::WritePng(root + "/wide.png", pixels.data(), 30, 20, 3).ok());
  ASSERT_TRUE(io::WritePng(root + "/tall.png", pixels.data(), 20, 30, 3).ok());
  Result<std::unique_ptr<ImageFolderDataset>> d = ImageFolderDataset::Open(root, 8, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->buckets(), (std::vector<SampleSize>{{8, 8}}));
  EXPECT_FALSE((*d)->bucketed());
  EXPECT_EQ((*d)->BucketOf(1), 0);

  d = ImageFolderDataset::Open(root, 8, 3, ImageCrop::kBuckets, {{6, 10}});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE((*d)->bucketed());
  EXPECT_EQ((*d)->height(), 6);
  EXPECT_EQ((*d)->width(), 10);
  EXPECT_EQ((*d)->sample_floats(), 3 * 6 * 10);
  std::vector<float> image(3 * 6 * 10);
  int32_t label;
  ASSERT_TRUE((*d)->Get(0, image.data(), &label).ok());
  for (float v : image)
    EXPECT_FLOAT_EQ(v, 90 / 127.5f - 1);

  // The automatic list of 128 (h/w 1/4, 1/3, 1, 3, 4): both pictures (h/w 3/2 and 2/3) are
  // nearest the square.
  d = ImageFolderDataset::Open(root, 128, 3, ImageCrop::kBuckets);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->buckets(), AspectRatioBuckets(128));
  EXPECT_EQ((*d)->BucketOf(0), 2);
  EXPECT_EQ((*d)->BucketOf(1), 2);
  d = ImageFolderDataset::Open(root, 8, 3, ImageCrop::kBuckets, {{4, 12}, {12, 4}});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->file(0), root + "/tall.png");
  EXPECT_EQ((*d)->BucketOf(0), 1);
  EXPECT_EQ((*d)->BucketOf(1), 0);
  PictureGeometry geometry;
  ASSERT_TRUE((*d)->GetGeometry(1, &geometry).ok());
  EXPECT_EQ(geometry, BucketGeometry(30, 20, {4, 12}));

  const auto refusal = [&](int size, ImageCrop crop, std::vector<SampleSize> buckets) {
    return ImageFolderDataset::Open(root, size, 3, crop, std::move(buckets)).status().message();
  };
  EXPECT_THAT(refusal(8, ImageCrop::kDit, {{8, 8}}), HasSubstr("buckets are for the buckets crop"));
  EXPECT_THAT(refusal(100, ImageCrop::kBuckets, {}),
              HasSubstr("the automatic aspect-ratio buckets need an image size that is a "
                        "multiple of 64, got 100"));
  EXPECT_THAT(refusal(8, ImageCrop::kBuckets, {{8, 8}, {0, 8}}),
              HasSubstr("bucket 0x8 (height x width) has a side below 1"));
  EXPECT_THAT(refusal(8, ImageCrop::kBuckets, {{8, -4}}),
              HasSubstr("bucket 8x-4 (height x width) has a side below 1"));
  EXPECT_THAT(refusal(8, ImageCrop::kBuckets, {{8, 12}, {12, 8}, {8, 12}}),
              HasSubstr("bucket 8x12 is given twice"));
  // Every header is read at Open: one that cannot be is named there.
  std::ofstream(root + "/broken.png") << "\x89PNG\r\n\x1a\n but nothing after";
  EXPECT_THAT(refusal(64, ImageCrop::kBuckets, {}),
              HasSubstr("image_folder '" + root + "': PNG file '" + root +
                        "/broken.png': no IHDR chunk first"));
  EXPECT_TRUE(ImageFolderDataset::Open(root, 64, 3, ImageCrop::kSquare).ok());
}

TEST(ImageFolderTest, ErrorsNameTheFolderOrFile) {
  TempDir temp("image_folder_errors");
  const std::string root = temp.path();
  EXPECT_THAT(ImageFolderDataset::Open(root + "/missing", 8, 3).status().message(),
              HasSubstr("not a directory"));
  EXPECT_THAT(ImageFolderDataset::Open(root, 8, 3).status().message(),
              HasSubstr("no .png, .jpg or .jpeg file"));
  EXPECT_THAT(ImageFolderDataset::Open(root, 8, 4).status().message(),
              HasSubstr("channels must be 1 (grey) or 3 (RGB), got 4"));
  fs::create_directories(root + "/cats");
  fs::create_directories(root + "/dogs");
  std::ofstream(root + "/cats/broken.png") << "\x89PNG\r\n\x1a\n but nothing after";
  EXPECT_THAT(ImageFolderDataset::Open(root, 8, 3).status().message(),
              HasSubstr("class folder 'dogs' holds no .png, .jpg or .jpeg file"));
  std::ofstream(root + "/dogs/text.jpg") << "plain text";
  Result<std::unique_ptr<ImageFolderDataset>> d = ImageFolderDataset::Open(root, 8, 3);
  ASSERT_TRUE(d.ok()) << d.status().message();
  std::vector<float> image(3 * 8 * 8);
  int32_t label;
  EXPECT_THAT((*d)->Get(0, image.data(), &label).message(), HasSubstr(root + "/cats/broken.png"));
  EXPECT_THAT((*d)->Get(1, image.data(), &label).message(),
              HasSubstr("neither a PNG nor a JPEG file"));
  std::ofstream(root + "/dogs/truncated.jpg") << "\xff\xd8\xff\xe0 truncated";
  EXPECT_THAT(io::ReadImage(root + "/dogs/truncated.jpg").status().message(),
              HasSubstr("JPEG file '" + root + "/dogs/truncated.jpg': cannot read its header"));
  EXPECT_THAT(io::ReadImageSize(root + "/dogs/truncated.jpg").status().message(),
              HasSubstr("JPEG file '" + root + "/dogs/truncated.jpg': cannot read its header"));
  PictureGeometry geometry;
  EXPECT_THAT((*d)->GetGeometry(0, &geometry).message(), HasSubstr("no IHDR chunk first"));
}

// A picture's header can declare far more pixels than its bytes hold (a PNG of 20,000² grey
// pixels is ~400 KB of zlib; this one's IDAT is 8×8's): both readers refuse it from the header,
// past Pillow's bound, before anything is allocated for its pixels.
TEST(ImageFolderTest, RefusesPicturesOfTooManyPixelsFromTheHeader) {
  TempDir temp("image_bombs");
  const std::string seeds = std::string(DIFFTRAIN_SOURCE_DIR) + "/tests/fuzz/image_fuzz/";
  const auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto put16 = [](std::string& b, size_t at, uint32_t v) {
    b[at] = char(v >> 8);
    b[at + 1] = char(v);
  };
  const auto put32 = [&put16](std::string& b, size_t at, uint32_t v) {
    put16(b, at, v >> 16);
    put16(b, at + 2, v & 0xffff);
  };
  // PNG: IHDR's width and height, then its CRC over the type and the data.
  std::string png = read(seeds + "grey.png");
  ASSERT_EQ(png.compare(12, 4, "IHDR"), 0);
  const auto write_png = [&](uint32_t width, uint32_t height) {
    put32(png, 16, width);
    put32(png, 20, height);
    put32(png, 29, crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17));
    const std::string path = temp.path() + fmt::format("/{}x{}.png", width, height);
    std::ofstream(path, std::ios::binary) << png;
    return path;
  };
  ASSERT_TRUE(io::ReadImage(write_png(4, 4)).ok());  // the patching itself is right
  for (const std::string& path : {write_png(20000, 20000), write_png(13378, 13377)}) {
    EXPECT_THAT(io::ReadImage(path).status().message(), HasSubstr("PNG file '" + path + "': "));
    EXPECT_THAT(io::ReadImageSize(path).status().message(),
                HasSubstr("pixels, too many (the readers take up to 178956970 pixels"));
  }
  EXPECT_THAT(io::ReadImage(write_png(20000, 20000)).status().message(),
              HasSubstr("20000 × 20000 pixels, too many"));
  EXPECT_THAT(io::ReadImageSize(write_png(0, 8)).status().message(),
              HasSubstr("0 × 8 pixels, none"));
  // JPEG: the frame header's height and width (after FF C0, its length and precision).
  std::string jpeg = read(seeds + "grey.jpg");
  const size_t sof = jpeg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  put16(jpeg, sof + 5, 60000);
  put16(jpeg, sof + 7, 50000);
  const std::string path = temp.path() + "/bomb.jpg";
  std::ofstream(path, std::ios::binary) << jpeg;
  EXPECT_THAT(io::ReadImage(path).status().message(),
              HasSubstr("JPEG file '" + path + "': 50000 × 60000 pixels, too many"));
  EXPECT_THAT(io::ReadImageSize(path).status().message(), HasSubstr("50000 × 60000 pixels"));
}

}  // namespace
}  // namespace difftrain
