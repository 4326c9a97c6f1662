#include "model/train/initial_weights.h"

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/io/checkpoint.h"
#include "model/train/checkpointing.h"
#include "model/train/trainer.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TrainConfig TinyConfig(uint64_t seed) {
  TrainConfig c = testing::TinyTrainConfig(/*hidden_size=*/32);
  c.optimizer.lr = 1e-3;
  c.seed = seed;
  return c;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainConfig& c) {
  return std::make_unique<Trainer>(c, testing::SyntheticData(c));
}

std::vector<float> Params(const Trainer& t) {
  return {t.model().params(), t.model().params() + t.model().num_params()};
}

std::vector<float> Ema(const Trainer& t) {
  return {t.ema(), t.ema() + t.model().num_params()};
}

// bf16 bits of x, rounded to nearest even.
uint16_t Bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The weights of `t` written as a plain state-dict file (no difftrain metadata) in BF16, as a
// framework other than difftrain writes them, plus tensors the model does not have.
std::string WriteStateDictBf16(const Trainer& t, const fs::path& path,
                               std::vector<float>* as_read) {
  const TensorTable& global = t.model().global_parameter_table();
  std::vector<uint16_t> bits(global.total());
  as_read->resize(global.total());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = Bf16(t.model().params()[i]);
    (*as_read)[i] = std::bit_cast<float>(uint32_t{bits[i]} << 16);
  }
  io::SafetensorsWriter w;
  for (const TensorSpec& s : global.tensors())
    w.Add(s.name, io::DType::kBF16, s.shape, bits.data() + s.offset);
  const float extra[3] = {1, 2, 3};
  w.AddF32("text_encoder.bias", {3}, extra);
  for (const FixedTensor& f : t.model().fixed_tensors())
    w.AddF32(f.name, f.shape, f.data);
  EXPECT_TRUE(w.WriteAtomic(path.string()).ok());
  return path.string();
}

TEST(InitialWeightsTest, ATrainerStartsFromAStateDictFileInBf16WithItsEmaEqualToIt) {
  TempDir dir("initial_weights");
  const auto source = MakeTrainer(TinyConfig(1));
  std::vector<float> expected;
  const std::string file =
      WriteStateDictBf16(*source, fs::path(dir.path()) / "w.safetensors", &expected);

  const auto trainer = MakeTrainer(TinyConfig(2));
  ASSERT_NE(Params(*trainer), expected);  // another seed: other weights
  Result<io::SafetensorsFile> read = io::SafetensorsFile::Read(file);
  ASSERT_TRUE(read.ok()) << read.status().message();
  Result<std::vector<std::string>> unused = trainer->InitializeFrom(*read);
  ASSERT_TRUE(unused.ok()) << unused.status().message();
  // pos_embed is the model's own fixed tensor, not reported.
  EXPECT_THAT(*unused, ElementsAre("text_encoder.bias"));
  EXPECT_EQ(Params(*trainer), expected);
  EXPECT_EQ(Ema(*trainer), expected);
  EXPECT_EQ(trainer->step(), 0);
  // It trains from there.
  Result<StepStats> stats = trainer->Step();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_TRUE(std::isfinite(stats->loss));
  EXPECT_NE(Params(*trainer), expected);
}

TEST(InitialWeightsTest, ACheckpointGivesItsWeightsAndItsEmaAndNothingElse) {
  TempDir dir("initial_weights");
  const auto source = MakeTrainer(TinyConfig(1));
  ASSERT_TRUE(source->Step().ok());
  ASSERT_TRUE(source->Step().ok());
  io::CheckpointStore store((fs::path(dir.path()) / "ckpt").string(), 3);
  ASSERT_TRUE(WriteCheckpointShard(*source, store, 0, 1).ok());
  ASSERT_TRUE(store.Commit(source->step(), 1).ok());
  ASSERT_NE(Params(*source), Ema(*source));

  // Another job (another seed) starting from that run's checkpoint directory.
  const auto trainer = MakeTrainer(TinyConfig(3));
  Result<std::string> from =
      InitializeFromWeights(*trainer, (fs::path(dir.path()) / "ckpt").string());
  ASSERT_TRUE(from.ok()) << from.status().message();
  EXPECT_EQ(*from, store.ShardPath(2, 0, 1));
  // One step directory names its step.
  EXPECT_EQ(*InitialWeightsFile(store.StepDir(2)), store.ShardPath(2, 0, 1));
  EXPECT_EQ(Params(*trainer), Params(*source));
  EXPECT_EQ(Ema(*trainer), Ema(*source));
  EXPECT_EQ(trainer->step(), 0);  // the step, data position and moments start afresh
}

TEST(InitialWeightsTest, MissingMisshapenAndIntegerTensorsAreNamed) {
  TempDir dir("initial_weights");
  const auto trainer = MakeTrainer(TinyConfig(1));
  const TensorTable& global = trainer->model().global_parameter_table();
  std::vector<float> zeros(global.total());
  std::vector<int32_t> ints(global.total());
  std::vector<float> more(global.total() + 64);  // the writer keeps pointers until it writes
  io::SafetensorsWriter w;
  const std::vector<TensorSpec>& all = global.tensors();
  for (size_t i = 1; i < all.size(); ++i) {  // the first one left out
    if (i == 2) {
      w.Add(all[i].name, io::DType::kI32, all[i].shape, ints.data());
    } else if (i == 3) {
      std::vector<int64_t> wrong = all[i].shape;
      wrong.back() += 1;
      w.AddF32(all[i].name, wrong, more.data());
    } else {
      w.AddF32(all[i].name, all[i].shape, zeros.data());
    }
  }
  const std::string path = (fs::path(dir.path()) / "bad.safetensors").string();
  ASSERT_TRUE(w.WriteAtomic(path).ok());
  Result<io::SafetensorsFile> header = io::SafetensorsFile::ReadHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_FALSE(header->has_data());
  const Status s = CheckInitialWeights(*header, global).status();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(),
              HasSubstr(fmt::format("3 of the model's {} tensors do not match", all.size())));
  EXPECT_THAT(s.message(), HasSubstr("'" + all[0].name + "' missing (the model's is " +
                                     ShapeString(all[0].shape) + ")"));
  EXPECT_THAT(s.message(), HasSubstr("'" + all[2].name + "' is I32, not F16, BF16, F32 or F64"));
  EXPECT_THAT(s.message(), HasSubstr("'" + all[3].name + "' is "));
  // The trainer refuses it alike, and keeps its own weights.
  const std::vector<float> before = Params(*trainer);
  Result<io::SafetensorsFile> read = io::SafetensorsFile::Read(path);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(trainer->InitializeFrom(*read).ok());
  EXPECT_EQ(Params(*trainer), before);
}

TEST(InitialWeightsTest, PathsResolveToDiffusersFilesOrTheNewestCheckpoint) {
  TempDir dir("initial_weights");
  const fs::path root(dir.path());
  const auto touch = [](const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
  };
  // A file is itself.
  touch(root / "w.safetensors");
  EXPECT_EQ(*InitialWeightsFile((root / "w.safetensors").string()),
            (root / "w.safetensors").string());
  // A diffusers model folder: the full-precision file, else the fp16 variant.
  touch(root / "model/diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(*InitialWeightsFile((root / "model").string()),
            (root / "model/diffusion_pytorch_model.fp16.safetensors").string());
  touch(root / "model/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(*InitialWeightsFile((root / "model").string()),
            (root / "model/diffusion_pytorch_model.safetensors").string());
  // A pipeline's folder: its unet/.
  touch(root / "pipeline/unet/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(*InitialWeightsFile((root / "pipeline").string()),
            (root / "pipeline/unet/diffusion_pytorch_model.safetensors").string());

  Result<std::string> missing = InitialWeightsFile((root / "nothing").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("no such file or directory"));
  fs::create_directories(root / "empty");
  Result<std::string> empty = InitialWeightsFile((root / "empty").string());
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(),
              HasSubstr("no diffusion_pytorch_model.safetensors (or .fp16.safetensors; in it, its "
                        "unet/ or transformer/) and no complete difftrain checkpoint"));
}

TEST(InitialWeightsTest, TheLaunchersCheckReadsTheHeaderAgainstTheModelsShapes) {
  TempDir dir("initial_weights");
  const TrainConfig c = TinyConfig(1);
  const auto source = MakeTrainer(c);
  std::vector<float> unused;
  const std::string file =
      WriteStateDictBf16(*source, fs::path(dir.path()) / "w.safetensors", &unused);
  EXPECT_TRUE(CheckInitialWeightsForModel(c.model, file).ok());
  ModelSpec deeper = c.model;
  deeper.config["depth"] = deeper.config["depth"].get<int>() + 1;
  const Status s = CheckInitialWeightsForModel(deeper, file);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'blocks.2."));
}

}  // namespace
}  // namespace difftrain
