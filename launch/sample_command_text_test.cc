// Text-conditional data and sampling end to end, as a user runs them: Fashion-MNIST's captions
// (`data captions`), embedded by the token table (`data embed`), packed with the images as
// latent + text pairs (`data pack --text-table`), a tiny text-conditioned UNet trained on the
// folder (`train`), and samples drawn from prompts with guidance (`sample --prompt`).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/text/text_testing.h"
#include "model/vae/vae.h"
#include "model/vae/vae_testing.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

// A two-level UNet on 1×32×32 with cross-attention on texts of 4 tokens of 8 features.
constexpr const char* kTinyTextUNet = R"(model:
  name: unet
  block_out_channels: [4, 8]
  layers_per_block: 1
  attention_head_dim: 2
  cross_attention_dim: 8
  norm_num_groups: 4
  down_block_types: [CrossAttnDownBlock2D, DownBlock2D]
  up_block_types: [UpBlock2D, CrossAttnUpBlock2D]
  sample_size: 32
  in_channels: 1
  out_channels: 1
  text_length: 4
  text_dropout: 0.2
batch:
  micro: 2
  global: 2
train:
  steps: 2
  log_every: 1
)";

class TextSampleTest : public ::testing::Test {
 protected:
  // One packed folder and checkpoint for the suite.
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("sample_command_text_test_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    setup_ = new std::string(Prepare());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete setup_;
  }
  void SetUp() override { ASSERT_EQ(*setup_, ""); }

  static std::string File(const std::string& name) { return (*dir_ / name).string(); }
  static std::string Q(const std::string& name) { return ShellQuote(File(name)); }

  // The steps of the pipeline; "" when each succeeded, else what failed.
  static std::string Prepare() {
    for (const std::string& step : {
             "data captions --out " + Q("captions.json"),
             "data embed --captions " + Q("captions.json") + " --length 4 --dim 8 --out " +
                 Q("texts.safetensors"),
             "data pack --dataset fashion_mnist --split test --limit 64 --per-shard 40 "
             "--text-table " +
                 Q("texts.safetensors") + " --out " + Q("data"),
         }) {
      const CommandResult r = RunDifftrain(step);
      if (r.exit_code != 0) return step + "\n" + r.output;
    }
    std::ofstream(File("job.yaml"))
        << kTinyTextUNet << "data:\n  kind: latent_folder\n  path: " << File("data")
        << "\ncheckpoint:\n  dir: " << File("ckpt") << "\n";
    const CommandResult r = RunDifftrain("train --config " + Q("job.yaml"));
    return r.exit_code == 0 ? "" : r.output;
  }

  // `sample ARGS --raw FILE` from the checkpoint; the samples and their labels.
  static io::SafetensorsFile Sample(const std::string& args, const std::string& raw) {
    const CommandResult r =
        RunDifftrain("sample --checkpoint " + Q("ckpt") +
                     " --sampler ddim --steps 3 --per-class 2 --raw " + Q(raw) + " " + args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(File(raw));
    EXPECT_TRUE(file.ok()) << file.status().message();
    return std::move(file).value();
  }
  static std::vector<float> Images(const io::SafetensorsFile& file) {
    std::vector<float> x(4 * 32 * 32);
    EXPECT_TRUE(file.CopyF32("images", {4, 1, 32, 32}, x.data()).ok());
    return x;
  }

  static fs::path* dir_;
  static std::string* setup_;
};

fs::path* TextSampleTest::dir_ = nullptr;
std::string* TextSampleTest::setup_ = nullptr;

TEST_F(TextSampleTest, PackedFolderVerifies) {
  const CommandResult r = RunDifftrain("data verify " + Q("data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("64 samples of 1×32×32, 10 classes, 2 shards, 60 texts of 4×8"),
            std::string::npos)
      << r.output;
}

TEST_F(TextSampleTest, SamplesFromPromptsIntoGridAndRawFile) {
  const CommandResult r = RunDifftrain(
      "sample --checkpoint " + Q("ckpt") +
      " --prompt 'a photo of a sneaker' --prompt 'an image of a bag' --per-class 2 --sampler ddim "
      "--steps 3 --cfg 3 --clip-denoised true --out " +
      Q("grid.png") + " --raw " + Q("raw.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<io::PngImage> png = io::ReadPng(File("grid.png"));
  ASSERT_TRUE(png.ok()) << png.status().message();
  EXPECT_EQ(png->width, 2 * 34 + 2);   // two samples a row
  EXPECT_EQ(png->height, 2 * 34 + 2);  // one row per prompt
  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File("raw.safetensors"));
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  std::vector<int64_t> labels(4);
  const io::TensorView* view = raw->Find("labels");
  ASSERT_NE(view, nullptr);
  std::memcpy(labels.data(), view->data, 4 * sizeof(int64_t));
  // A sample's label is the class its prompt names: sneaker 7, bag 8.
  EXPECT_EQ(labels, (std::vector<int64_t>{7, 7, 8, 8}));
  const nlohmann::json how = nlohmann::json::parse(raw->metadata().at("sampling"));
  EXPECT_EQ(how["prompts"], nlohmann::json({"a photo of a sneaker", "an image of a bag"}));
  EXPECT_EQ(how["text_ids"], nlohmann::json({42, 50}));
  EXPECT_EQ(how["cfg_scale"], 3.0);
}

// DreamBooth's prior preservation end to end: the model's own samples of the class prompt as one
// PNG each with their captions (`sample --out-dir`), packed as an image folder with a text
// encoder, and trained beside the data as its prior (data.prior_path).
TEST_F(TextSampleTest, ClassImagesFromOutDirPackAndTrainAsThePrior) {
  const std::string prompt = "a photo of a sneaker";
  CommandResult r = RunDifftrain("sample --checkpoint " + Q("ckpt") + " --prompt '" + prompt +
                                 "' --per-class 3 --sampler ddim --steps 3 --out-dir " +
                                 Q("class") + " --raw " + Q("class.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File("class.safetensors"));
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  std::vector<float> images(3 * 32 * 32);
  ASSERT_TRUE(raw->CopyF32("images", {3, 1, 32, 32}, images.data()).ok());
  std::ifstream metadata(File("class/metadata.jsonl"));
  for (int i = 0; i < 3; ++i) {
    const std::string name = "0000" + std::to_string(i) + ".png";
    Result<io::PngImage> png = io::ReadPng(File("class/" + name));
    ASSERT_TRUE(png.ok()) << png.status().message();
    ASSERT_EQ(png->width * png->height * png->channels, 32 * 32);
    for (int p = 0; p < 32 * 32; ++p) {
      const float v = std::clamp(images[i * 1024 + p], -1.0f, 1.0f);
      ASSERT_EQ(png->pixels[p], static_cast<uint8_t>(std::lround((v + 1) * 127.5f)))
          << name << " pixel " << p;
    }
    std::string line;
    ASSERT_TRUE(std::getline(metadata, line));
    EXPECT_EQ(nlohmann::json::parse(line), (nlohmann::json{{"file_name", name}, {"text", prompt}}));
  }

  ASSERT_EQ(testing::WriteTextEncoderFolder(File("class_bert"), 8, 5), "");
  r = RunDifftrain("data pack --dataset image_folder --path " + Q("class") +
                   " --channels 1 --image-size 32 --crop square --text-encoder " + Q("class_bert") +
                   " --text-length 4 --out " + Q("class_latents"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(File("prior.yaml"))
      << kTinyTextUNet << "data:\n  kind: latent_folder\n  path: " << File("data")
      << "\n  prior_path: " << File("class_latents") << "\n  prior_loss_weight: 0.5\n";
  r = RunDifftrain("train --config " + Q("prior.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("prior preservation with the 3 samples of " + File("class_latents")),
            std::string::npos)
      << r.output;
}

TEST_F(TextSampleTest, CaptionIdsAreThePromptsAndGuidanceChangesTheSamples) {
  const std::vector<float> by_prompt =
      Images(Sample("--cfg 3 --prompt 'a photo of a sneaker' --prompt 'a photo of a bag'",
                    "prompts.safetensors"));
  const std::vector<float> by_id = Images(Sample("--cfg 3 --captions 42,48", "ids.safetensors"));
  EXPECT_EQ(by_prompt, by_id);
  // The held-out paraphrases are in the table: a model is sampled from them by prompt too.
  const std::vector<float> unguided =
      Images(Sample("--cfg 1 --captions 42,48", "cfg1.safetensors"));
  EXPECT_NE(unguided, by_id);
  const std::vector<float> paraphrase =
      Images(Sample("--cfg 3 --prompt 'a grayscale snapshot showing a sneaker' --captions 48",
                    "para.safetensors"));
  EXPECT_NE(paraphrase, by_id);
}

TEST_F(TextSampleTest, BadInputExitsTwo) {
  ASSERT_EQ(RunDifftrain("data embed --captions " + Q("captions.json") +
                         " --length 4 --dim 16 --out " + Q("wide.safetensors"))
                .exit_code,
            0);
  struct Case {
    std::string args, message;
  };
  const std::string ckpt = "--checkpoint " + Q("ckpt") + " --out " + Q("bad.png");
  for (const Case& c : std::vector<Case>{
           {ckpt + " --prompt 'a photo of a boat'", "'a photo of a boat' is not in the text table"},
           {ckpt + " --classes 1 --text-encoder x", "--classes: a text-conditional model"},
           {ckpt + " --classes 1", "a text-conditional model samples from --prompt or --captions"},
           {ckpt, "needs --prompt TEXT"},
           {ckpt + " --captions 60", "60 is outside the text table's [0, 60)"},
           {ckpt + " --captions 1 --text-table " + Q("wide.safetensors"),
            "holds texts of 4x16, the model takes 4x8"},
           {ckpt + " --captions 1 --text-table " + Q("missing.safetensors"),
            File("missing.safetensors")},
           {ckpt + " --captions 1 --vae " + Q("no-vae"),
            "--vae: VAE '" + File("no-vae") + "': no such file"},
       }) {
    const CommandResult r = RunDifftrain("sample " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// `--vae` decodes the latent model's samples (1×32×32 here) for the grid and into --raw's
// `decoded`: what the VAE itself decodes them into, 3×64×64 through two levels.
TEST_F(TextSampleTest, VaeDecodesTheSamplesForTheGridAndTheRawFile) {
  const nlohmann::json config = {{"block_out_channels", {4, 8}},
                                 {"norm_num_groups", 2},
                                 {"latent_channels", 1},
                                 {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                                 {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}}};
  ASSERT_EQ(testing::WriteVaeFolder(File("pipeline") + "/vae", config, 3), "");
  const io::SafetensorsFile raw =
      Sample("--cfg 3 --captions 42,48 --vae " + Q("pipeline") + " --out " + Q("decoded.png"),
             "decoded.safetensors");
  Result<io::PngImage> png = io::ReadPng(File("decoded.png"));
  ASSERT_TRUE(png.ok()) << png.status().message();
  EXPECT_EQ(png->channels, 3);
  EXPECT_EQ(png->width, 2 * 66 + 2);
  EXPECT_EQ(png->height, 2 * 66 + 2);

  const std::vector<float> latents = Images(raw);
  std::vector<float> decoded(4 * 3 * 64 * 64), want(decoded.size());
  ASSERT_TRUE(raw.CopyF32("decoded", {4, 3, 64, 64}, decoded.data()).ok());
  Result<Vae> vae = Vae::Load(File("pipeline"));
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  ASSERT_TRUE(vae->Decode(latents.data(), 4, 32, 32, want.data()).ok());
  EXPECT_EQ(decoded, want);
  const nlohmann::json how = nlohmann::json::parse(raw.metadata().at("sampling"));
  EXPECT_EQ(how["vae"], File("pipeline") + "/vae/diffusion_pytorch_model.safetensors");

  // A VAE of other latents is refused before sampling, naming both.
  nlohmann::json four = config;
  four["latent_channels"] = 4;
  ASSERT_EQ(testing::WriteVaeFolder(File("four"), four, 3), "");
  const CommandResult r = RunDifftrain("sample --checkpoint " + Q("ckpt") + " --captions 1 --vae " +
                                       Q("four") + " --out " + Q("four.png"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("decodes latents of 4 channels and this model makes 1"),
            std::string::npos)
      << r.output;
}

// A table embedded by a text encoder (`data embed --encoder`) records it, and `sample` embeds
// the prompts the table lacks with it: a new prompt samples exactly as from a table that holds
// it, embedded by the same encoder. `--text-encoder none` looks prompts up only; from
// --pretrained weights the encoder alone serves, guided by the empty prompt's embedding.
TEST_F(TextSampleTest, TextEncoderEmbedsPromptsTheTableLacks) {
  ASSERT_EQ(testing::WriteTextEncoderFolder(File("bert"), 8, 5), "");
  ASSERT_EQ(testing::WriteTextEncoderFolder(File("bert16"), 16, 5), "");
  CommandResult r =
      RunDifftrain("data embed --captions " + Q("captions.json") + " --length 4 --encoder " +
                   Q("bert") + " --out " + Q("bert_texts.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<TextTable> table = ReadTextTable(File("bert_texts.safetensors"));
  ASSERT_TRUE(table.ok()) << table.status().message();
  EXPECT_EQ(table->text_encoder, File("bert"));
  EXPECT_EQ(table->size(), 60);
  EXPECT_EQ(table->labels[42], 7);
  EXPECT_NE(table->encoder.find("BERT, 2 layers, 8 features, 4 heads"), std::string::npos)
      << table->encoder;
  // Its rows are what the encoder embeds.
  Result<TextEmbedder> embedder = TextEmbedder::Load(File("bert"));
  ASSERT_TRUE(embedder.ok()) << embedder.status().message();
  Result<std::vector<float>> row = embedder->Embed({table->captions[42]}, 4, 0);
  ASSERT_TRUE(row.ok());
  for (size_t i = 0; i < row->size(); ++i)
    EXPECT_NEAR((*row)[i], table->embedding(42)[i], 1e-5) << i;

  // Packed with the images, the table keeps its record, and `data verify` says it.
  r = RunDifftrain("data pack --dataset fashion_mnist --split test --limit 8 --text-table " +
                   Q("bert_texts.safetensors") + " --out " + Q("bert_data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunDifftrain("data verify " + Q("bert_data"));
  EXPECT_NE(r.output.find("60 texts of 4×8 embedded by the text encoder " + File("bert")),
            std::string::npos)
      << r.output;

  const std::string boat = "a photo of a boat";
  const std::string table_args = "--cfg 3 --text-table " + Q("bert_texts.safetensors");
  const io::SafetensorsFile embedded =
      Sample(table_args + " --prompt '" + boat + "' --captions 48", "boat.safetensors");
  const nlohmann::json how = nlohmann::json::parse(embedded.metadata().at("sampling"));
  EXPECT_EQ(how["text_encoder"], File("bert"));
  EXPECT_EQ(how["text_ids"], nlohmann::json({60, 48}));
  std::vector<int64_t> labels(4);
  std::memcpy(labels.data(), embedded.Find("labels")->data, 4 * sizeof(int64_t));
  EXPECT_EQ(labels, (std::vector<int64_t>{-1, -1, 8, 8}));  // a new prompt names no class

  std::ofstream(File("boat.json")) << nlohmann::json{{"captions", {boat}}}.dump();
  r = RunDifftrain("data embed --captions " + Q("boat.json") + " --length 4 --encoder " +
                   Q("bert") + " --out " + Q("boat_table.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<float> looked_up =
      Images(Sample("--cfg 3 --text-encoder none --text-table " + Q("boat_table.safetensors") +
                        " --prompt '" + boat + "' --prompt '" + boat + "'",
                    "looked_up.safetensors"));
  const std::vector<float> from_encoder = Images(embedded);
  EXPECT_EQ(std::vector<float>(from_encoder.begin(), from_encoder.begin() + 2 * 1024),
            std::vector<float>(looked_up.begin(), looked_up.begin() + 2 * 1024));

  // From the checkpoint's weights as --pretrained, with the job's model: no table is needed,
  // and the unconditional text is the empty prompt's embedding, not zeros. Unguided, it
  // samples as the checkpoint does; guided, differently.
  const std::string pretrained = "--pretrained " + Q("ckpt") + " --config " + Q("job.yaml") +
                                 " --clip-denoised false --text-encoder " + Q("bert") +
                                 " --prompt '" + boat + "' --prompt '" + boat + "'";
  const std::string checkpoint = "--clip-denoised false --text-table " +
                                 Q("boat_table.safetensors") + " --prompt '" + boat +
                                 "' --prompt '" + boat + "'";
  const auto sample = [&](const std::string& source, const std::string& args,
                          const std::string& raw) {
    const CommandResult c =
        RunDifftrain("sample " + source + " --sampler ddim --steps 3 --per-class 1 --raw " +
                     Q(raw) + " " + args);
    EXPECT_EQ(c.exit_code, 0) << args << "\n" << c.output;
    Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(File(raw));
    EXPECT_TRUE(file.ok()) << file.status().message();
    std::vector<float> x(2 * 1024);
    EXPECT_TRUE(file->CopyF32("images", {2, 1, 32, 32}, x.data()).ok());
    return x;
  };
  EXPECT_EQ(sample(pretrained, "--cfg 1", "p1.safetensors"),
            sample("--checkpoint " + Q("ckpt"), checkpoint + " --cfg 1", "c1.safetensors"));
  EXPECT_NE(sample(pretrained, "--cfg 3", "p3.safetensors"),
            sample("--checkpoint " + Q("ckpt"), checkpoint + " --cfg 3", "c3.safetensors"));

  // A negative prompt is the unconditional text: with the empty prompt as the negative one,
  // the checkpoint samples as the pretrained weights do (guided by the empty prompt).
  const std::vector<float> negative =
      sample("--checkpoint " + Q("ckpt"),
             checkpoint + " --cfg 3 --text-encoder " + Q("bert") + " --negative-prompt ''",
             "n3.safetensors");
  EXPECT_EQ(negative, sample(pretrained, "--cfg 3", "p3-again.safetensors"));
  EXPECT_NE(negative, sample(pretrained, "--cfg 3 --negative-prompt 'a photo of a bag'",
                             "p3-bag.safetensors"));

  struct Case {
    std::string args, message;
  };
  const std::string ckpt = "--checkpoint " + Q("ckpt") + " --out " + Q("bad.png");
  for (const Case& c : std::vector<Case>{
           {ckpt + " --captions 1 --negative-prompt 'a photo of a boat'",
            "--negative-prompt: 'a photo of a boat' is not in the text table"},
           {ckpt + " --text-table " + Q("bert_texts.safetensors") +
                " --text-encoder none --prompt '" + boat + "'",
            "no text encoder embeds new prompts"},
           {ckpt + " --prompt '" + boat + "' --text-encoder " + Q("bert16"),
            "embeds 16 features per token, the model takes 8"},
           {ckpt + " --prompt '" + boat + "' --text-encoder " + Q("nowhere"),
            "--text-encoder: text encoder '" + File("nowhere") + "': no such file"},
           {ckpt + " --prompt '" + boat + "' --text-encoder " + Q("bert") + " --skip-layers 2",
            "cannot skip 2 of its 2 layers"},
       }) {
    const CommandResult bad = RunDifftrain("sample " + c.args);
    EXPECT_EQ(bad.exit_code, 2) << c.args << "\n" << bad.output;
    EXPECT_NE(bad.output.find(c.message), std::string::npos) << c.args << "\n" << bad.output;
  }
  for (const Case& c : std::vector<Case>{
           {"--encoder " + Q("bert") + " --dim 8", "--dim is the token table's"},
           {"--skip-layers 1", "--skip-layers is for a text encoder"},
           {"--encoder " + Q("bert") + " --length 17", "texts of 17 tokens; it takes 2 to 16"},
       }) {
    const CommandResult bad = RunDifftrain("data embed --captions " + Q("captions.json") +
                                           " --out " + Q("bad.safetensors") + " " + c.args);
    EXPECT_EQ(bad.exit_code, 2) << c.args << "\n" << bad.output;
    EXPECT_NE(bad.output.find(c.message), std::string::npos) << c.args << "\n" << bad.output;
  }
}

// Training refuses texts of another shape than the model's cross-attention takes.
TEST_F(TextSampleTest, TrainingRefusesTextsOfAnotherShape) {
  std::string job = kTinyTextUNet;
  job.replace(job.find("cross_attention_dim: 8"), 22, "cross_attention_dim: 16");
  std::ofstream(File("wide.yaml"))
      << job << "data:\n  kind: latent_folder\n  path: " << File("data") << "\n";
  const CommandResult r = RunDifftrain("train --config " + Q("wide.yaml"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("texts are embedded as 4x8 (tokens x features), but the model takes "
                          "text embeddings of 4x16"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace difftrain
