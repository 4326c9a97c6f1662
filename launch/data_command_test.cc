// Runs the built `difftrain data` the way a user does.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/data/dataset.h"
#include "model/data/fashion_mnist.h"
#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/data/loader.h"
#include "model/data/moving_fashion_mnist.h"
#include "model/io/png.h"
#include "model/text/embedder.h"
#include "model/text/text_testing.h"
#include "model/vae/encoded_dataset.h"
#include "model/vae/vae_testing.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

void ExpectSameSamples(const Dataset& a, const Dataset& b, int64_t count) {
  std::vector<float> x(a.sample_floats()), y(b.sample_floats());
  ASSERT_EQ(x.size(), y.size());
  for (int64_t i = 0; i < count; ++i) {
    int32_t label_a = -1, label_b = -2;
    ASSERT_TRUE(a.Get(i, x.data(), &label_a).ok());
    ASSERT_TRUE(b.Get(i, y.data(), &label_b).ok());
    ASSERT_EQ(x, y) << "sample " << i;
    ASSERT_EQ(label_a, label_b) << "sample " << i;
  }
}

class DataCommandTest : public ::testing::Test {
 protected:
  std::unique_ptr<LatentFolderDataset> OpenOut() {
    Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(dir_ + "/out");
    EXPECT_TRUE(folder.ok()) << folder.status().message();
    return folder.ok() ? std::move(folder).value() : nullptr;
  }

  // The output folder as one shell word.
  std::string Out() const { return ShellQuote(dir_ + "/out"); }

  // `data pack ARGS --out DIR`, which must succeed, and the folder it wrote.
  std::unique_ptr<LatentFolderDataset> Pack(const std::string& args) {
    const CommandResult result = RunDifftrain("data pack " + args + " --out " + Out());
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.exit_code == 0 ? OpenOut() : nullptr;
  }

  TempDir temp_{"data_command_test"};
  std::string dir_ = temp_.path();
};

TEST_F(DataCommandTest, PacksSyntheticSamples) {
  const CommandResult result = RunDifftrain(
      "data pack --dataset synthetic --seed 5 --channels 4 --image-size 8 --num-classes 100 "
      "--limit 10 --per-shard 4 --out " +
      Out());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::unique_ptr<LatentFolderDataset> folder = OpenOut();
  ASSERT_NE(folder, nullptr);
  EXPECT_EQ(folder->size(), 10);
  EXPECT_EQ(folder->num_shards(), 3);
  ExpectSameSamples(*folder, SyntheticDataset(5, 4, 8, 100), 10);
}

// A folder of videos: index.json says its frames, shards hold [n, F, C, H, W], and the
// samples read back are the moving garments (and synthetic videos) that were packed.
TEST_F(DataCommandTest, PacksVideos) {
  std::unique_ptr<LatentFolderDataset> folder = Pack(
      "--dataset moving_fashion_mnist --split test --frames 6 --image-size 28 --limit 7 "
      "--per-shard 3");
  ASSERT_NE(folder, nullptr);
  EXPECT_EQ(folder->frames(), 6);
  EXPECT_EQ(folder->size(), 7);
  EXPECT_EQ(folder->sample_floats(), 6 * 28 * 28);
  auto garments = FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  ASSERT_TRUE(garments.ok());
  auto moving = MovingFashionMnistDataset::Create(std::move(*garments), 6, 28);
  ASSERT_TRUE(moving.ok());
  ExpectSameSamples(*folder, **moving, 7);
  EXPECT_EQ(RunDifftrain("data verify " + Out()).exit_code, 0);

  folder = Pack(
      "--dataset synthetic --seed 2 --channels 4 --image-size 8 --frames 3 --num-classes 5 "
      "--limit 4");
  ASSERT_NE(folder, nullptr);
  EXPECT_EQ(folder->frames(), 3);
  ExpectSameSamples(*folder, SyntheticDataset(2, 4, 8, 5, 3), 4);
}

TEST_F(DataCommandTest, PacksFashionMnistAndVerifies) {
  CommandResult result = RunDifftrain(
      "data pack --dataset fashion_mnist --split test --limit 500 "
      "--out " +
      Out());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::unique_ptr<LatentFolderDataset> folder = OpenOut();
  ASSERT_NE(folder, nullptr);
  EXPECT_EQ(folder->size(), 500);
  Result<std::unique_ptr<FashionMnistDataset>> fashion =
      FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  ASSERT_TRUE(fashion.ok()) << fashion.status().message();
  ExpectSameSamples(*folder, **fashion, 500);

  result = RunDifftrain("data verify " + Out());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("500 samples of 1×32×32, 10 classes, 1 shards, checksums good"),
            std::string::npos)
      << result.output;
}

TEST_F(DataCommandTest, VerifyFindsACorruptShard) {
  ASSERT_EQ(RunDifftrain("data pack --limit 3 --out " + Out()).exit_code, 0);
  const std::string shard = dir_ + "/out/shard-00000.safetensors";
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 100] ^= 1;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  const CommandResult result = RunDifftrain("data verify " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(shard), std::string::npos) << result.output;
}

TEST_F(DataCommandTest, SyntheticWithoutLimitIsBadInput) {
  const CommandResult result = RunDifftrain("data pack --dataset synthetic --out " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("give --limit"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(dir_ + "/out"));
}

TEST_F(DataCommandTest, UnknownDatasetOrMissingFilesAreBadInput) {
  CommandResult result = RunDifftrain("data pack --dataset imagenet --out " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("unknown dataset 'imagenet'"), std::string::npos) << result.output;

  result = RunDifftrain("data pack --dataset fashion_mnist --path " + ShellQuote(dir_) + " --out " +
                        Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(dir_ + "/train-images-idx3-ubyte.gz"), std::string::npos)
      << result.output;
}

TEST_F(DataCommandTest, TextTableThatCannotCaptionIsBadInput) {
  CommandResult result = RunDifftrain(
      "data pack --dataset fashion_mnist --split test --limit 8 "
      "--text-table " +
      ShellQuote(dir_ + "/missing.safetensors") + " --out " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(dir_ + "/missing.safetensors"), std::string::npos) << result.output;

  // Captions without labels name no class to pair an image with.
  std::ofstream(dir_ + "/captions.json") << R"({"captions": ["a photo", "a picture"]})";
  result = RunDifftrain("data embed --captions " + ShellQuote(dir_ + "/captions.json") +
                        " --length 3 --dim 4 --out " + ShellQuote(dir_ + "/t.safetensors"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  result = RunDifftrain("data pack --dataset fashion_mnist --split test --limit 8 --text-table " +
                        ShellQuote(dir_ + "/t.safetensors") + " --out " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--text-table: the text table has no labels"), std::string::npos)
      << result.output;

  std::ofstream(dir_ + "/bad.json") << R"({"texts": []})";
  result = RunDifftrain("data embed --captions " + ShellQuote(dir_ + "/bad.json") + " --out " +
                        ShellQuote(dir_ + "/t.safetensors"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("no 'captions' list"), std::string::npos) << result.output;
}

// A VAE of two levels (images halved once) for `channels`-channel images, 4 latent channels.
std::string VaeFolder(const std::string& dir, int channels) {
  const nlohmann::json config = {{"block_out_channels", {4, 8}},
                                 {"norm_num_groups", 2},
                                 {"in_channels", channels},
                                 {"out_channels", channels},
                                 {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                                 {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}}};
  EXPECT_EQ(testing::WriteVaeFolder(dir, config, 5), "");
  return dir;
}

// Two classes of PNGs of different sizes and colours.
std::string ImageFolder(const std::string& dir) {
  for (int k = 0; k < 5; ++k) {
    const std::string klass = dir + (k < 2 ? "/boots" : "/coats");
    fs::create_directories(klass);
    const int w = 20 + 3 * k, h = 18 + k, c = k == 3 ? 1 : 3;
    std::vector<uint8_t> pixels(size_t(w) * h * c);
    for (size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<uint8_t>((i * 37 + k * 11) % 251);
    EXPECT_TRUE(
        io::WritePng(klass + "/" + std::to_string(k) + ".png", pixels.data(), w, h, c).ok());
  }
  return dir;
}

// An image folder's own captions (`data pack --text-encoder`): from metadata.jsonl, as
// diffusers' train_text_to_image reads an imagefolder, or from IMAGE.txt / IMAGE.caption sidecar
// files (kohya's); each distinct caption embedded once, as the encoder embeds it, and each
// sample paired with its own. An image without a caption, or another dataset, is refused.
TEST_F(DataCommandTest, PacksAnImageFolderWithItsOwnCaptions) {
  const std::string images = ImageFolder(dir_ + "/images");
  const std::string encoder = dir_ + "/encoder";
  ASSERT_EQ(testing::WriteTextEncoderFolder(encoder, 8, 3), "");
  const std::vector<std::string> captions = {"a red boot", "a boot in the rain", "a coat",
                                             "a red boot", "a long coat"};
  const std::vector<std::string> files = {"boots/0.png", "boots/1.png", "coats/2.png",
                                          "coats/3.png", "coats/4.png"};
  {
    std::ofstream jsonl(images + "/metadata.jsonl");
    for (int k = 4; k >= 0; --k)  // any order
      jsonl << nlohmann::json{{"file_name", files[k]}, {"text", captions[k]}}.dump() << "\n";
  }
  const std::string pack = "--dataset image_folder --path " + ShellQuote(images) +
                           " --image-size 16 --text-encoder " + ShellQuote(encoder) +
                           " --text-length 12";
  std::unique_ptr<LatentFolderDataset> packed = Pack(pack);
  ASSERT_NE(packed, nullptr);
  const auto expect_captions = [&](const LatentFolderDataset& folder) {
    const TextTable* texts = folder.texts();
    ASSERT_NE(texts, nullptr);
    EXPECT_EQ(texts->captions, (std::vector<std::string>{"a red boot", "a boot in the rain",
                                                         "a coat", "a long coat"}));
    EXPECT_EQ(texts->length, 12);
    Result<TextEmbedder> embedder = TextEmbedder::Load(encoder);
    ASSERT_TRUE(embedder.ok()) << embedder.status().message();
    Result<std::vector<float>> want = embedder->Embed(texts->captions, 12, 0);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(texts->embeddings, *want);
    for (int64_t i = 0; i < folder.size(); ++i)
      EXPECT_EQ(texts->captions[folder.TextId(i)], captions[i]) << i;
  };
  expect_captions(*packed);
  packed.reset();
  fs::remove_all(dir_ + "/out");

  // Sidecar files in place of metadata.jsonl (trailing newlines dropped).
  fs::remove(images + "/metadata.jsonl");
  for (size_t k = 0; k < files.size(); ++k) {
    fs::path sidecar = images + "/" + files[k];
    sidecar.replace_extension(k % 2 ? ".caption" : ".txt");
    std::ofstream(sidecar) << captions[k] << "\n";
  }
  packed = Pack(pack);
  ASSERT_NE(packed, nullptr);
  expect_captions(*packed);
  packed.reset();
  fs::remove_all(dir_ + "/out");

  fs::remove(images + "/coats/3.caption");
  CommandResult r = RunDifftrain("data pack " + pack + " --out " + Out());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the image '" + images + "/coats/3.png' has no caption"),
            std::string::npos)
      << r.output;
  r = RunDifftrain("data pack --dataset fashion_mnist --split test --limit 4 --text-encoder " +
                   ShellQuote(encoder) + " --out " + Out());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--text-encoder embeds an image folder's own captions"),
            std::string::npos)
      << r.output;
}

// `data pack --vae`: an image folder (and a video dataset, frame by frame) packed as the
// latents the VAE encodes them into, a draw of the posterior or its mean, exactly what the
// library's encoded dataset gives.
TEST_F(DataCommandTest, PacksAnImageFolderThroughAVae) {
  const std::string images = ImageFolder(dir_ + "/images");
  const std::string vae_dir = VaeFolder(dir_ + "/vae", 3);
  const auto expected = [&](VaePosterior posterior, uint64_t seed) {
    Result<std::unique_ptr<ImageFolderDataset>> folder = ImageFolderDataset::Open(images, 16, 3);
    EXPECT_TRUE(folder.ok()) << folder.status().message();
    auto vae = std::make_shared<const Vae>(*Vae::Load(vae_dir));
    return std::move(VaeEncodedDataset::Create(std::move(folder).value(), vae, posterior, seed))
        .value();
  };
  const std::string pack = "--dataset image_folder --path " + ShellQuote(images) +
                           " --image-size 16 --vae " + ShellQuote(vae_dir);
  std::unique_ptr<LatentFolderDataset> drawn = Pack(pack);
  ASSERT_NE(drawn, nullptr);
  EXPECT_EQ(drawn->size(), 5);
  EXPECT_EQ(drawn->num_classes(), 2);
  EXPECT_EQ(drawn->channels(), 4);
  EXPECT_EQ(drawn->height(), 8);
  ExpectSameSamples(*drawn, *expected(VaePosterior::kSample, 0), 5);
  ASSERT_TRUE(drawn->vae().has_value());
  EXPECT_EQ(drawn->vae()->path, vae_dir + "/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(drawn->vae()->scaling_factor, 0.18215);
  EXPECT_EQ(drawn->vae()->posterior, "sample");
  EXPECT_EQ(drawn->vae()->seed, 0u);
  drawn.reset();
  std::unique_ptr<LatentFolderDataset> mean = Pack(pack + " --vae-posterior mode --seed 4");
  ASSERT_NE(mean, nullptr);
  ExpectSameSamples(*mean, *expected(VaePosterior::kMode, 4), 5);
  EXPECT_EQ(mean->vae()->posterior, "mode");
  EXPECT_EQ(mean->vae()->seed, 4u);
  mean.reset();

  // Pixels alone, without a VAE: 3×16×16 in [−1, 1], labels by folder.
  std::unique_ptr<LatentFolderDataset> pixels =
      Pack("--dataset image_folder --path " + ShellQuote(images) + " --image-size 16");
  ASSERT_NE(pixels, nullptr);
  ExpectSameSamples(*pixels, **ImageFolderDataset::Open(images, 16, 3), 5);
  EXPECT_FALSE(pixels->vae().has_value());
  pixels.reset();
  pixels = Pack("--dataset image_folder --path " + ShellQuote(images) +
                " --image-size 16 --crop square --channels 1");
  ASSERT_NE(pixels, nullptr);
  ExpectSameSamples(*pixels, **ImageFolderDataset::Open(images, 16, 1, ImageCrop::kSquare), 5);
  // Each picture's geometry with it, which `data verify` reports.
  EXPECT_TRUE(pixels->has_geometry());
  pixels.reset();
  const CommandResult verified = RunDifftrain("data verify " + Out());
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, ::testing::HasSubstr("each picture's size and crop"));

  // Videos: each of a video's 3 frames through the VAE, [3, 4, 16, 16] a sample.
  const std::string grey = VaeFolder(dir_ + "/grey-vae", 1);
  std::unique_ptr<LatentFolderDataset> videos = Pack(
      "--dataset moving_fashion_mnist --split test --frames 3 --limit 2 --vae " + ShellQuote(grey));
  ASSERT_NE(videos, nullptr);
  EXPECT_EQ(videos->frames(), 3);
  EXPECT_EQ(videos->channels(), 4);
  EXPECT_EQ(videos->height(), 16);
  DatasetSpec spec;
  spec.kind = "moving_fashion_mnist";
  spec.split = "test";
  spec.frames = 3;
  auto encoded = VaeEncodedDataset::Create(std::move(OpenDataset(spec)).value(),
                                           std::make_shared<const Vae>(*Vae::Load(grey)),
                                           VaePosterior::kSample, 0);
  ASSERT_TRUE(encoded.ok()) << encoded.status().message();
  ExpectSameSamples(*videos, **encoded, 2);
}

// `data pack --vae --mirror`: each picture flipped left-right through the VAE too, which is not
// its latents flipped; a loader with horizontal_flip gives a flipped sample that mirror image, as
// diffusers' --random_flip flips the picture before encoding it.
TEST_F(DataCommandTest, MirrorPacksEachPicturesFlippedPictureThroughTheVae) {
  const std::string images = ImageFolder(dir_ + "/images");
  const std::string vae_dir = VaeFolder(dir_ + "/vae", 3);
  std::unique_ptr<LatentFolderDataset> folder =
      Pack("--dataset image_folder --path " + ShellQuote(images) + " --image-size 16 --vae " +
           ShellQuote(vae_dir) + " --vae-posterior mode --mirror");
  ASSERT_NE(folder, nullptr);
  ASSERT_TRUE(folder->has_mirrored());
  Result<std::unique_ptr<ImageFolderDataset>> pictures = ImageFolderDataset::Open(images, 16, 3);
  ASSERT_TRUE(pictures.ok()) << pictures.status().message();
  Result<Vae> vae = Vae::Load(vae_dir);
  ASSERT_TRUE(vae.ok());
  std::vector<float> picture(3 * 16 * 16), want(4 * 8 * 8), got(4 * 8 * 8), flipped(4 * 8 * 8);
  for (int64_t i = 0; i < 5; ++i) {
    int32_t label = 0, stored = -1;
    ASSERT_TRUE((*pictures)->Get(i, picture.data(), &label).ok());
    for (int row = 0; row < 3 * 16; ++row)
      std::reverse(picture.begin() + row * 16, picture.begin() + (row + 1) * 16);
    ASSERT_TRUE(
        vae->Encode(picture.data(), 1, 16, 16, VaePosterior::kMode, 0, 0, want.data()).ok());
    ASSERT_TRUE(folder->GetMirrored(i, got.data(), &stored).ok());
    EXPECT_EQ(got, want) << "sample " << i;
    EXPECT_EQ(stored, label);
    // The VAE's latents of the flipped picture are not its latents flipped.
    ASSERT_TRUE(folder->Get(i, flipped.data(), &stored).ok());
    for (int row = 0; row < 4 * 8; ++row)
      std::reverse(flipped.begin() + row * 8, flipped.begin() + (row + 1) * 8);
    EXPECT_NE(flipped, want) << "sample " << i;
  }
  DataLoaderOptions options;
  options.batch_size = 5;
  options.shuffle = false;
  options.horizontal_flip = true;
  options.prefetch = false;
  DataLoader loader(*folder, options);
  std::vector<float> batch(5 * 4 * 8 * 8);
  std::vector<int32_t> labels(5);
  ASSERT_TRUE(loader.Fill(0, 5, batch.data(), labels.data()).ok());
  int mirrored = 0;
  for (int64_t n = 0; n < 5; ++n) {
    int32_t label = 0;
    if (loader.IsFlipped(n)) {
      ASSERT_TRUE(folder->GetMirrored(n, got.data(), &label).ok());
      ++mirrored;
    } else {
      ASSERT_TRUE(folder->Get(n, got.data(), &label).ok());
    }
    EXPECT_EQ(std::vector<float>(batch.begin() + n * 256, batch.begin() + (n + 1) * 256), got)
        << "sample " << n;
  }
  EXPECT_GT(mirrored, 0);
  folder.reset();
  const CommandResult verified = RunDifftrain("data verify " + Out());
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, ::testing::HasSubstr("each picture's mirror image"));
}

TEST_F(DataCommandTest, ImagesAVaeCannotEncodeAreBadInput) {
  const std::string images = ImageFolder(dir_ + "/images");
  const std::string vae = VaeFolder(dir_ + "/vae", 3);
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--dataset image_folder --path " + ShellQuote(images),
            "--image-size is required for image_folder"},
           {"--dataset fashion_mnist --split test --vae " + ShellQuote(vae),
            "encodes images of 3 channels and the dataset's have 1"},
           {"--dataset image_folder --path " + ShellQuote(images) + " --image-size 15 --vae " +
                ShellQuote(vae),
            "their 15×15 pixels must be multiples of 2"},
           {"--dataset fashion_mnist --vae-posterior mode", "--vae-posterior is for --vae"},
           {"--dataset fashion_mnist --mirror", "--mirror is for --vae"},
           {"--dataset fashion_mnist --vae " + ShellQuote(dir_ + "/none"),
            "--vae: VAE '" + dir_ + "/none': no such file or directory"},
       }) {
    const CommandResult result = RunDifftrain("data pack " + c.args + " --out " + Out());
    EXPECT_EQ(result.exit_code, 2) << c.args << "\n" << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << c.args << "\n" << result.output;
  }
}

// `--crop buckets` and `--buckets`: a malformed list, buckets without the buckets crop, an
// automatic list for a size that is not a multiple of 64, a bucket given twice; each refused by
// name before anything is written.
TEST_F(DataCommandTest, BucketFlagsThatCannotBeUsedAreBadInput) {
  const std::string images = ImageFolder(dir_ + "/images");
  const std::string folder = "--dataset image_folder --path " + ShellQuote(images);
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {folder + " --image-size 16 --crop buckets --buckets 12x",
            "--buckets: '12x' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 12x20,,20x12",
            "--buckets: '' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 12x20,20*12",
            "--buckets: '20*12' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 0x16",
            "--buckets: '0x16' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 16x-16",
            "--buckets: '16x-16' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 16x16x16",
            "--buckets: '16x16x16' is not HxW"},
           {folder + " --image-size 16 --crop buckets --buckets 99999999999x16",
            "--buckets: '99999999999x16' is not HxW"},
           {folder + " --image-size 16 --buckets 12x20",
            "--buckets is for --dataset image_folder --crop buckets"},
           {folder + " --image-size 16 --crop square --buckets auto",
            "--buckets is for --dataset image_folder --crop buckets"},
           {"--dataset synthetic --limit 2 --crop buckets --buckets 8x8",
            "--buckets is for --dataset image_folder --crop buckets"},
           {folder + " --image-size 100 --crop buckets",
            "the automatic aspect-ratio buckets need an image size that is a multiple of 64, got "
            "100"},
           {folder + " --image-size 16 --crop buckets --buckets auto",
            "the automatic aspect-ratio buckets need an image size that is a multiple of 64, got "
            "16"},
           {folder + " --image-size 16 --crop buckets --buckets 12x20,16x16,12x20",
            "bucket 12x20 is given twice"},
       }) {
    const CommandResult result = RunDifftrain("data pack " + c.args + " --out " + Out());
    EXPECT_EQ(result.exit_code, 2) << c.args << "\n" << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << c.args << "\n" << result.output;
    EXPECT_FALSE(fs::exists(dir_ + "/out")) << c.args;
  }
  // --crop takes the three crops only.
  const CommandResult result =
      RunDifftrain("data pack " + folder + " --image-size 16 --crop sdxl --out " + Out());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("buckets"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace difftrain
