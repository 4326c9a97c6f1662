// The image folder against Pillow (tests/reference/images.py writes PNG and JPEG files in
// every colour mode and what Pillow decodes and resizes them into), and its layout and errors.
#include "model/data/image_folder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "model/io/image.h"
#include "model/io/safetensors.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ShellQuote;

constexpr int kSize = 16;

class ImageFolderPillowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::CommandResult r = RunCommand(
        "/usr/bin/python3 " + ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/images.py") +
        " make " + ShellQuote(dir()) + " " + std::to_string(kSize) + " 2>&1");
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
  ASSERT_EQ((*d)->size(), 7);
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
              HasSubstr("JPEG file '" + root + "/dogs/truncated.jpg': cannot decode"));
  EXPECT_THAT(io::ReadImageSize(root + "/dogs/truncated.jpg").status().message(),
              HasSubstr("JPEG file '" + root + "/dogs/truncated.jpg': cannot read its header"));
  PictureGeometry geometry;
  EXPECT_THAT((*d)->GetGeometry(0, &geometry).message(), HasSubstr("no IHDR chunk first"));
}

}  // namespace
}  // namespace difftrain
