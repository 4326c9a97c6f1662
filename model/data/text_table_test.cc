#include "model/data/text_table.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/data/captions.h"
#include "model/data/latent_folder.h"
#include "model/io/safetensors.h"

namespace difftrain {
namespace {

class TextTableTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return temp_.path() + "/" + name; }

  TempDir temp_{"text_table_test"};
};

TEST_F(TextTableTest, WritesAndReadsBack) {
  Result<TextTable> table =
      EmbedWithTokenTable({"a photo of a bag", "an image of a coat", "a photo of a coat"}, 5, 8);
  ASSERT_TRUE(table.ok()) << table.status().message();
  table->labels = {8, 4, 4};
  table->held_out = {false, false, true};
  ASSERT_TRUE(WriteTextTable(*table, Path("t.safetensors")).ok());

  Result<TextTable> read = ReadTextTable(Path("t.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->length, 5);
  EXPECT_EQ(read->dim, 8);
  EXPECT_EQ(read->captions, table->captions);
  EXPECT_EQ(read->labels, table->labels);
  EXPECT_EQ(read->held_out, table->held_out);
  EXPECT_EQ(read->embeddings, table->embeddings);
  EXPECT_EQ(read->encoder, table->encoder);
  EXPECT_EQ(read->Find("an image of a coat"), 1);
  EXPECT_FALSE(read->Find("an image of a Coat").has_value());
  EXPECT_TRUE(read->is_held_out(2));
}

// SDXL's tables carry each text's pooled embedding beside its tokens'; a table without them
// reads as none, and a misshapen one is refused by name.
TEST_F(TextTableTest, PooledEmbeddingsWriteAndReadBack) {
  Result<TextTable> table = EmbedWithTokenTable({"a photo of a bag", "a coat"}, 3, 4);
  ASSERT_TRUE(table.ok());
  ASSERT_TRUE(WriteTextTable(*table, Path("plain.safetensors")).ok());
  Result<TextTable> plain = ReadTextTable(Path("plain.safetensors"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->pooled_dim, 0);
  EXPECT_TRUE(plain->pooled.empty());

  table->pooled_dim = 5;
  table->pooled = {1, 2, 3, 4, 5, -1, -2, -3, -4, -5};
  ASSERT_TRUE(WriteTextTable(*table, Path("pooled.safetensors")).ok());
  Result<TextTable> read = ReadTextTable(Path("pooled.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->pooled_dim, 5);
  EXPECT_EQ(read->pooled, table->pooled);
  EXPECT_EQ(read->pooled_embedding(1)[4], -5.0f);

  table->pooled.pop_back();
  const Status short_pooled = WriteTextTable(*table, Path("short.safetensors"));
  ASSERT_FALSE(short_pooled.ok());
  EXPECT_NE(short_pooled.message().find("9 pooled floats for 2 texts of 5"), std::string::npos)
      << short_pooled.message();

  io::SafetensorsFile file = *io::SafetensorsFile::Read(Path("pooled.safetensors"));
  io::SafetensorsWriter writer;
  for (const auto& [key, value] : file.metadata())
    if (key != "difftrain.crc32") writer.SetMetadata(key, value);
  writer.AddF32("embeddings", {2, 3, 4}, table->embeddings.data());
  writer.AddF32("pooled", {3, 3}, table->pooled.data());  // three rows for two texts
  ASSERT_TRUE(writer.WriteAtomic(Path("bad.safetensors")).ok());
  Result<TextTable> bad = ReadTextTable(Path("bad.safetensors"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'pooled' must be F32 [2, P]"), std::string::npos)
      << bad.status().message();
}

TEST_F(TextTableTest, TokenTableEmbedsWordsAndPositions) {
  const int L = 6, D = 8;
  Result<TextTable> t = EmbedWithTokenTable({"A photo of a BAG", "bag photo", "x"}, L, D);
  ASSERT_TRUE(t.ok()) << t.status().message();
  // Word w at position i is e(w) + p(i): the difference of one word at two positions is the
  // difference of the position codes, whatever the word.
  const float* first = t->embedding(0);   // a photo of a bag
  const float* second = t->embedding(1);  // bag photo
  const double scale = 1 / std::sqrt(double{D});
  for (int j = 0; j < D / 2; ++j) {
    const double omega = std::pow(10000.0, -2.0 * j / D);
    // "photo": position 1 in the first caption, 1 in the second: identical.
    EXPECT_FLOAT_EQ(first[1 * D + 2 * j], second[1 * D + 2 * j]);
    // "bag": position 4 (upper case folded) and 0.
    EXPECT_NEAR(first[4 * D + 2 * j] - second[0 * D + 2 * j],
                scale * (std::sin(4 * omega) - std::sin(0 * omega)), 1e-6);
    EXPECT_NEAR(first[4 * D + 2 * j + 1] - second[0 * D + 2 * j + 1],
                scale * (std::cos(4 * omega) - std::cos(0 * omega)), 1e-6);
  }
  // "a" at positions 0 and 3 of the first caption: same word vector.
  EXPECT_NEAR(first[0] - first[3 * D], -scale * std::sin(3.0), 1e-6);
  // Positions after the words are zero (the first caption has 5 words).
  for (int i = 5 * D; i < L * D; ++i)
    EXPECT_EQ(first[i], 0.0f);
  // The same caption embeds the same in every table.
  Result<TextTable> again = EmbedWithTokenTable({"bag photo"}, L, D);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::vector<float>(again->embedding(0), again->embedding(0) + L * D),
            std::vector<float>(second, second + L * D));

  EXPECT_FALSE(EmbedWithTokenTable({"  ,. "}, L, D).ok());
  EXPECT_FALSE(EmbedWithTokenTable({"a"}, L, 7).ok());
}

TEST_F(TextTableTest, BadFilesNameTheFileAndField) {
  Result<TextTable> table = EmbedWithTokenTable({"a b", "c d"}, 2, 4);
  ASSERT_TRUE(table.ok());
  const std::string path = Path("bad.safetensors");
  auto expect_error = [&](const io::SafetensorsWriter& writer, const std::string& what) {
    ASSERT_TRUE(writer.WriteAtomic(path).ok());
    Result<TextTable> read = ReadTextTable(path);
    ASSERT_FALSE(read.ok()) << what;
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status().message();
    EXPECT_NE(read.status().message().find(what), std::string::npos) << read.status().message();
  };
  io::SafetensorsWriter w;
  w.AddF32("embeddings", {2, 2, 4}, table->embeddings.data());
  expect_error(w, "'format'");
  w.SetMetadata("format", "difftrain-text");
  w.SetMetadata("version", "1");
  expect_error(w, "no 'captions'");
  w.SetMetadata("captions", R"(["a b"])");
  expect_error(w, "'embeddings' holds 2 texts and metadata 'captions' 1");
  w.SetMetadata("captions", R"(["a b", "c d"])");
  w.SetMetadata("labels", R"([0])");
  expect_error(w, "1 labels for 2 captions");
  w.SetMetadata("labels", R"([0, -1])");
  expect_error(w, "metadata 'labels' holds -1");

  io::SafetensorsWriter flat;
  flat.AddF32("embeddings", {2, 8}, table->embeddings.data());
  flat.SetMetadata("format", "difftrain-text");
  flat.SetMetadata("version", "1");
  expect_error(flat, "'embeddings' F32 [K, L, D]");
}

TEST(FashionMnistCaptionsTest, TemplatesPerClassWithParaphrasesHeldOut) {
  const TextTable t = FashionMnistCaptions();
  ASSERT_EQ(t.size(), 60);
  EXPECT_EQ(t.captions[0], "a photo of a t-shirt");
  EXPECT_EQ(t.captions[7 * 6 + 1], "a picture of a sneaker");
  EXPECT_EQ(t.captions[9 * 6 + 2], "an image of an ankle boot");
  for (int k = 0; k < 60; ++k) {
    EXPECT_EQ(t.labels[k], k / 6);
    EXPECT_EQ(t.held_out[k], k % 6 >= kFashionMnistTrainingTemplates);
  }
}

// Every sample gets a training caption of its own class, each class's captions used in turn;
// held-out captions never.
TEST_F(TextTableTest, CaptionedDatasetUsesTrainingCaptionsOfTheClass) {
  SyntheticDataset synthetic(3, 1, 4, 10);
  const PrefixDataset images(synthetic, 200);
  ASSERT_TRUE(WriteLatentFolder(images, Path("images"), 64).ok());
  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(Path("images"));
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  TextTable captions = FashionMnistCaptions();
  Result<TextTable> texts = EmbedWithTokenTable(captions.captions, 4, 6);
  ASSERT_TRUE(texts.ok());
  texts->labels = captions.labels;
  texts->held_out = captions.held_out;
  Result<std::unique_ptr<CaptionedDataset>> captioned =
      CaptionedDataset::Create(std::move(folder).value(), *texts);
  ASSERT_TRUE(captioned.ok()) << captioned.status().message();
  std::vector<float> x((*captioned)->sample_floats());
  for (int64_t i = 0; i < 200; ++i) {
    int32_t label = -1;
    ASSERT_TRUE((*captioned)->Get(i, x.data(), &label).ok());
    const int64_t id = (*captioned)->TextId(i);
    EXPECT_EQ(texts->labels[id], label) << "sample " << i;
    EXPECT_FALSE(texts->is_held_out(id)) << "sample " << i;
    EXPECT_EQ(id % 6, i % 4) << "sample " << i;
  }

  // A table without labels, or without a training caption of some class, is refused.
  texts->labels.clear();
  Result<std::unique_ptr<LatentFolderDataset>> again = LatentFolderDataset::Open(Path("images"));
  ASSERT_TRUE(again.ok());
  Result<std::unique_ptr<CaptionedDataset>> refused =
      CaptionedDataset::Create(std::move(again).value(), *texts);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no labels"), std::string::npos);
  texts->labels = captions.labels;
  for (int k = 6 * 3; k < 6 * 4; ++k)
    texts->held_out[k] = true;
  again = LatentFolderDataset::Open(Path("images"));
  ASSERT_TRUE(again.ok());
  refused = CaptionedDataset::Create(std::move(again).value(), *texts);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no training caption of class 3"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace difftrain
