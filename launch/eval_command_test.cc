// Runs the built `difftrain eval` the way a user does. The metric tests use a classifier that
// `eval train-classifier` trains on 5k images for one epoch (a second or two): real test images
// under their true labels score high accuracy and an FD near the floor, noise scores low
// accuracy and a large FD. Bad input exits 2 naming the file; those tests use an untrained
// classifier.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/data/fashion_mnist.h"
#include "model/eval/classifier.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "tests/testing/run_command.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

constexpr int64_t kSamples = 1000;
constexpr int64_t kImageFloats = 32 * 32;

class EvalCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("eval_command_test");
    eval::Classifier<float> untrained{eval::ClassifierConfig{}};
    untrained.InitializeRandom(0);
    ASSERT_TRUE(eval::SaveClassifier(untrained, {}, Classifier()).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string Classifier() { return dir_->path() + "/untrained.safetensors"; }
  // Trained on the first call; every test runs in a process of its own under ctest.
  static std::string TrainedClassifier() {
    const std::string path = dir_->path() + "/trained.safetensors";
    if (fs::exists(path)) return path;
    const CommandResult trained =
        RunDifftrain("eval train-classifier --limit 5000 --epochs 1 --out " + ShellQuote(path));
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    EXPECT_NE(trained.output.find("test accuracy"), std::string::npos) << trained.output;
    return path;
  }
  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  // Writes a samples file as `difftrain sample --raw` does.
  static void WriteSamples(const std::string& path, const std::vector<float>& images,
                           const std::vector<int64_t>& labels,
                           std::vector<int64_t> image_shape = {}) {
    if (image_shape.empty()) image_shape = {static_cast<int64_t>(labels.size()), 1, 32, 32};
    io::SafetensorsWriter file;
    file.AddF32("images", image_shape, images.data());
    file.Add("labels", io::DType::kI64, {static_cast<int64_t>(labels.size())}, labels.data());
    ASSERT_TRUE(file.WriteAtomic(path).ok());
  }

  // The metrics `eval --floor --json` computes for a samples file.
  static nlohmann::json Evaluate(const std::string& samples) {
    const std::string json = samples + ".json";
    const CommandResult result =
        RunDifftrain("eval --classifier " + ShellQuote(TrainedClassifier()) + " --samples " +
                     ShellQuote(samples) + " --floor --json " + ShellQuote(json));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::ifstream in(json);
    return nlohmann::json::parse(in, nullptr, false);
  }

  static TempDir* dir_;
};

TempDir* EvalCommandTest::dir_ = nullptr;

TEST_F(EvalCommandTest, RealTestImagesScoreHighAccuracyAndAnFdNearTheFloor) {
  Result<std::unique_ptr<FashionMnistDataset>> test =
      FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), "test");
  ASSERT_TRUE(test.ok()) << test.status().message();
  std::vector<float> images(kSamples * kImageFloats);
  std::vector<int64_t> labels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) {
    int32_t label = 0;
    ASSERT_TRUE((*test)->Get(i, images.data() + i * kImageFloats, &label).ok());
    labels[i] = label;
  }
  WriteSamples(Path("real.safetensors"), images, labels);
  const nlohmann::json m = Evaluate(Path("real.safetensors"));
  ASSERT_FALSE(m.is_discarded());
  EXPECT_EQ(m["samples"], kSamples);
  EXPECT_EQ(m["real_count"], 10000);
  EXPECT_GT(m["conditional_accuracy"].get<double>(), 0.7) << m.dump();
  // Real images are as close to the test set as the floor, whose images are real too.
  EXPECT_GT(m["floor_fd"].get<double>(), 0) << m.dump();
  EXPECT_LT(m["fd"].get<double>(), 1.5 * m["floor_fd"].get<double>()) << m.dump();
}

TEST_F(EvalCommandTest, NoiseScoresLowAccuracyAndALargeFd) {
  std::vector<float> images(kSamples * kImageFloats);
  std::vector<int64_t> labels(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) {
    Rng rng(1, RngStream::kSample, i);
    for (int64_t k = 0; k < kImageFloats; ++k)
      images[i * kImageFloats + k] = static_cast<float>(2 * rng.Uniform() - 1);
    labels[i] = i % 10;
  }
  WriteSamples(Path("noise.safetensors"), images, labels);
  const nlohmann::json m = Evaluate(Path("noise.safetensors"));
  ASSERT_FALSE(m.is_discarded());
  EXPECT_LT(m["conditional_accuracy"].get<double>(), 0.3) << m.dump();
  EXPECT_GT(m["fd"].get<double>(), 10 * m["floor_fd"].get<double>()) << m.dump();
}

// A samples file that is not of the classifier's shape, and one with a bad label.
TEST_F(EvalCommandTest, BadSamplesExitTwoNamingTheFile) {
  const std::string wrong_shape = Path("wrong-shape.safetensors");
  WriteSamples(wrong_shape, std::vector<float>(4 * 28 * 28), {0, 1, 2, 3}, {4, 1, 28, 28});
  CommandResult result = RunDifftrain("eval --classifier " + ShellQuote(Classifier()) +
                                      " --samples " + ShellQuote(wrong_shape));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(wrong_shape), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[4, 1, 28, 28]"), std::string::npos) << result.output;

  const std::string bad_label = Path("bad-label.safetensors");
  WriteSamples(bad_label, std::vector<float>(3 * kImageFloats), {0, 10, 2});
  result = RunDifftrain("eval --classifier " + ShellQuote(Classifier()) + " --samples " +
                        ShellQuote(bad_label));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(bad_label), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("label 10 of sample 1"), std::string::npos) << result.output;

  const std::string missing = Path("missing.safetensors");
  result = RunDifftrain("eval --classifier " + ShellQuote(Classifier()) + " --samples " +
                        ShellQuote(missing));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(missing), std::string::npos) << result.output;
}

// A samples file given where the classifier belongs.
TEST_F(EvalCommandTest, NotAClassifierExitsTwoNamingTheFile) {
  const std::string samples = Path("two.safetensors");
  WriteSamples(samples, std::vector<float>(2 * kImageFloats), {0, 1});
  const CommandResult result = RunDifftrain("eval --classifier " + ShellQuote(samples) +
                                            " --samples " + ShellQuote(samples));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(samples), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("difftrain-classifier"), std::string::npos) << result.output;
}

TEST_F(EvalCommandTest, MissingArgumentsAreBadInput) {
  CommandResult result = RunDifftrain("eval --samples x.safetensors");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--classifier"), std::string::npos) << result.output;
  result = RunDifftrain("eval train-classifier");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  result = RunDifftrain("eval --classifier " + ShellQuote(Classifier()) +
                        " --samples x --real-split validation");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("validation"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace difftrain
