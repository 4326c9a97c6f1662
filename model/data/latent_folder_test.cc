#include "model/data/latent_folder.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/data/fashion_mnist.h"
#include "model/io/safetensors.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Every sample of `a` equals the same sample of `b`.
void ExpectSameSamples(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.sample_floats(), b.sample_floats());
  std::vector<float> x(a.sample_floats()), y(b.sample_floats());
  for (int64_t i = 0; i < a.size(); ++i) {
    int32_t label_a = -1, label_b = -2;
    ASSERT_TRUE(a.Get(i, x.data(), &label_a).ok());
    ASSERT_TRUE(b.Get(i, y.data(), &label_b).ok());
    ASSERT_EQ(x, y) << "sample " << i;
    ASSERT_EQ(label_a, label_b) << "sample " << i;
  }
}

class LatentFolderTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // 10 synthetic 4×8×8 latents in shards of 4, 4 and 2.
  void Pack() { ASSERT_TRUE(WriteLatentFolder(source_, dir_, 4).ok()); }

  Json Index() const { return Json::parse(ReadText(Path("index.json"))); }
  void SetIndex(const Json& index) { WriteText(Path("index.json"), index.dump()); }

  // Opening must fail with a message naming `path` and containing `reason`.
  void ExpectError(const std::string& path, const std::string& reason) {
    Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
    ASSERT_FALSE(data.ok());
    const std::string message = data.status().message();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }

  TempDir temp_{"latent_folder_test"};
  std::string dir_ = temp_.path();
  SyntheticDataset synthetic_{11, 4, 8, 1000};
  PrefixDataset source_{synthetic_, 10};
};

TEST_F(LatentFolderTest, RoundTripThroughTheWriter) {
  Pack();
  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok()) << data.status().message();
  const LatentFolderDataset& folder = **data;
  EXPECT_EQ(folder.channels(), 4);
  EXPECT_EQ(folder.height(), 8);
  EXPECT_EQ(folder.width(), 8);
  EXPECT_EQ(folder.num_classes(), 1000);
  EXPECT_EQ(folder.num_shards(), 3);
  ExpectSameSamples(folder, source_);
  EXPECT_TRUE(folder.VerifyChecksums().ok());
}

TEST_F(LatentFolderTest, WritesTheDocumentedLayout) {
  Pack();
  const Json index = Index();
  EXPECT_EQ(index["format"], "difftrain-latents");
  EXPECT_EQ(index["version"], 1);
  EXPECT_EQ(index["channels"], 4);
  EXPECT_EQ(index["height"], 8);
  EXPECT_EQ(index["width"], 8);
  EXPECT_EQ(index["num_classes"], 1000);
  EXPECT_EQ(index["total"], 10);
  EXPECT_EQ(index["shards"], Json::parse(R"([
      {"file": "shard-00000.safetensors", "count": 4},
      {"file": "shard-00001.safetensors", "count": 4},
      {"file": "shard-00002.safetensors", "count": 2}])"));
  Result<io::SafetensorsFile> shard = io::SafetensorsFile::Read(Path("shard-00002.safetensors"));
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  ASSERT_NE(shard->Find("labels"), nullptr);
  EXPECT_EQ(shard->Find("labels")->dtype, io::DType::kI64);
  EXPECT_EQ(shard->Find("labels")->shape, (std::vector<int64_t>{2}));
  std::vector<float> latents(2 * 4 * 8 * 8);
  ASSERT_TRUE(shard->CopyF32("latents", {2, 4, 8, 8}, latents.data()).ok());
  std::vector<float> expected(4 * 8 * 8);
  int32_t label;
  ASSERT_TRUE(source_.Get(9, expected.data(), &label).ok());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), latents.begin() + 4 * 8 * 8));
  EXPECT_EQ(shard->metadata().at("first_sample"), "8");
  EXPECT_FALSE(fs::exists(Path("index.json.tmp." + std::to_string(getpid()))));
}

TEST_F(LatentFolderTest, PacksFashionMnist) {
  Result<std::unique_ptr<FashionMnistDataset>> fashion =
      FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  ASSERT_TRUE(fashion.ok()) << fashion.status().message();
  PrefixDataset first(**fashion, 300);
  ASSERT_TRUE(WriteLatentFolder(first, dir_, 128).ok());
  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->num_classes(), 10);
  EXPECT_EQ((*data)->num_shards(), 3);
  ExpectSameSamples(**data, first);
}

TEST_F(LatentFolderTest, RepackingReplacesTheFolder) {
  Pack();
  PrefixDataset fewer(synthetic_, 3);
  ASSERT_TRUE(WriteLatentFolder(fewer, dir_, 100).ok());
  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok()) << data.status().message();
  ExpectSameSamples(**data, fewer);
}

TEST_F(LatentFolderTest, WriterRefusesUnboundedAndEmptySourcesAndBadShardSizes) {
  Status unbounded = WriteLatentFolder(synthetic_, dir_, 4);
  ASSERT_FALSE(unbounded.ok());
  EXPECT_NE(unbounded.message().find("unbounded"), std::string::npos);
  EXPECT_FALSE(WriteLatentFolder(PrefixDataset(synthetic_, 0), dir_, 4).ok());
  EXPECT_FALSE(WriteLatentFolder(source_, dir_, 0).ok());
  EXPECT_FALSE(fs::exists(Path("index.json")));
}

TEST_F(LatentFolderTest, MissingIndex) {
  ExpectError(Path("index.json"), "No such file");
}

TEST_F(LatentFolderTest, IndexThatIsNotJson) {
  WriteText(Path("index.json"), "{\"format\": ");
  ExpectError(Path("index.json"), "is not a JSON object");
}

TEST_F(LatentFolderTest, WrongFormatOrVersion) {
  Pack();
  Json index = Index();
  index["format"] = "something-else";
  SetIndex(index);
  ExpectError(Path("index.json"), "format is \"something-else\"");
  index = Index();
  index["format"] = "difftrain-latents";
  index["version"] = 2;
  SetIndex(index);
  ExpectError(Path("index.json"), "version 2 is not supported");
}

TEST_F(LatentFolderTest, TotalThatDisagreesWithTheShards) {
  Pack();
  Json index = Index();
  index["total"] = 11;
  SetIndex(index);
  ExpectError(Path("index.json"), "'total' is 11 but the shards hold 10 samples");
}

TEST_F(LatentFolderTest, ShardOutsideTheFolder) {
  Pack();
  Json index = Index();
  index["shards"][1]["file"] = "../shard-00001.safetensors";
  SetIndex(index);
  ExpectError(Path("index.json"), "shard 1: 'file' must be a file name in the folder");
}

TEST_F(LatentFolderTest, MissingShard) {
  Pack();
  fs::remove(Path("shard-00001.safetensors"));
  ExpectError(Path("shard-00001.safetensors"), "No such file");
}

TEST_F(LatentFolderTest, ShardOfAnotherShape) {
  Pack();
  Json index = Index();
  index["channels"] = 3;
  SetIndex(index);
  ExpectError(Path("shard-00000.safetensors"),
              "tensor 'latents' is F32 [4,4,8,8], expected F32 [4,3,8,8]");
}

TEST_F(LatentFolderTest, CountThatDisagreesWithTheShard) {
  Pack();
  Json index = Index();
  index["shards"][2]["count"] = 3;
  index["total"] = 11;
  SetIndex(index);
  ExpectError(Path("shard-00002.safetensors"), "expected F32 [3,4,8,8]");
}

// Labels grow shard by shard as each shard vouches for its count: a bogus count in the index
// is an error, not a huge allocation.
TEST_F(LatentFolderTest, HugeCountInTheIndexIsAnErrorNotAnAllocation) {
  Pack();
  Json index = Index();
  index["shards"][0]["count"] = int64_t{1} << 60;
  index["total"] = (int64_t{1} << 60) + 6;
  SetIndex(index);
  ExpectError(Path("shard-00000.safetensors"), "expected F32 [1152921504606846976,4,8,8]");
}

TEST_F(LatentFolderTest, TruncatedShard) {
  Pack();
  const std::string path = Path("shard-00001.safetensors");
  fs::resize_file(path, fs::file_size(path) - 100);
  ExpectError(path, "truncated");
}

TEST_F(LatentFolderTest, LabelOutsideTheClasses) {
  Pack();
  Json index = Index();
  index["num_classes"] = 2;
  SetIndex(index);
  ExpectError(Path("shard-00000.safetensors"), "is outside [0, 2)");
}

TEST_F(LatentFolderTest, CorruptDataFailsTheChecksumOnly) {
  Pack();
  const std::string path = Path("shard-00002.safetensors");
  std::string bytes = ReadText(path);
  bytes[bytes.size() - 40] ^= 0x10;  // inside the latents
  WriteText(path, bytes);
  Result<std::unique_ptr<LatentFolderDataset>> data = LatentFolderDataset::Open(dir_);
  ASSERT_TRUE(data.ok()) << data.status().message();
  Status verified = (*data)->VerifyChecksums();
  ASSERT_FALSE(verified.ok());
  EXPECT_NE(verified.message().find(path), std::string::npos) << verified.message();
}

}  // namespace
}  // namespace difftrain
