// The evaluation classifier: every parameter gradient of a tiny instance against central
// differences in double, the cross-entropy gradient, the += contract, float against double,
// and the classifier file (round trip, and errors that name the file).
#include "model/eval/classifier.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/cpu/gradcheck.h"
#include "model/io/safetensors.h"

namespace difftrain::eval {
namespace {

namespace fs = std::filesystem;
using cpu::gradcheck::Vector;

// 8×8 images of 2 channels in 4 patches of 4×4: every layer has more than one row and column.
ClassifierConfig TinyConfig() {
  ClassifierConfig c;
  c.channels = 2;
  c.image_size = 8;
  c.patch = 4;
  c.patch_dim = 3;
  c.hidden = 5;
  c.features = 4;
  c.num_classes = 3;
  return c;
}

class ClassifierGradientTest : public ::testing::Test {
 protected:
  static constexpr int B = 3;

  void SetUp() override {
    net_.InitializeRandom(5);
    params_.assign(net_.params(), net_.params() + net_.num_params());
  }

  // Logits of the tiny net with parameters `params_`.
  void Forward(Vector& out) {
    std::copy(params_.begin(), params_.end(), net_.params());
    net_.Forward(images_.data(), B);
    out.assign(net_.logits(), net_.logits() + B * TinyConfig().num_classes);
  }

  Vector Gradient() {
    std::fill_n(net_.grads(), net_.num_params(), 0.0);
    Vector logits;
    Forward(logits);
    net_.Backward(w_.data());
    return Vector(net_.grads(), net_.grads() + net_.num_params());
  }

  Classifier<double> net_{TinyConfig()};
  std::mt19937 rng_{17};
  Vector images_ = cpu::gradcheck::Random(B * TinyConfig().image_floats(), rng_);
  Vector w_ = cpu::gradcheck::Random(B * TinyConfig().num_classes, rng_);  // dlogits
  Vector params_;
};

TEST_F(ClassifierGradientTest, EveryParameterGradientMatchesFiniteDifferences) {
  Vector analytic = Gradient();
  cpu::gradcheck::ForwardFn forward = [this](Vector& out) { Forward(out); };
  // Every parameter, tensor by tensor, so that a failure names the tensor.
  for (const TensorSpec& t : net_.parameter_table().tensors()) {
    std::vector<size_t> indices(t.numel);
    std::iota(indices.begin(), indices.end(), t.offset);
    EXPECT_TRUE(cpu::gradcheck::GradientMatches(params_, analytic, w_, forward, indices)) << t.name;
  }
}

TEST_F(ClassifierGradientTest, BackwardAddsIntoGradients) {
  const Vector once = Gradient();
  Vector logits;
  Forward(logits);
  net_.Backward(w_.data());
  Vector twice(net_.grads(), net_.grads() + net_.num_params());
  for (double& g : twice)
    g /= 2;
  EXPECT_TRUE(cpu::gradcheck::Near(twice, once, 1e-14));
}

TEST_F(ClassifierGradientTest, FloatMatchesDouble) {
  Classifier<float> single(TinyConfig());
  std::copy(params_.begin(), params_.end(), single.params());
  const std::vector<float> images(images_.begin(), images_.end()), w(w_.begin(), w_.end());
  single.Forward(images.data(), B);
  single.Backward(w.data());
  const Vector grads = Gradient();
  Vector logits;
  Forward(logits);
  EXPECT_TRUE(cpu::gradcheck::Near(
      std::vector<float>(single.logits(), single.logits() + logits.size()), logits, 1e-5));
  EXPECT_TRUE(cpu::gradcheck::Near(
      std::vector<float>(single.grads(), single.grads() + single.num_params()), grads, 1e-4));
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  constexpr int B = 4, K = 5;
  std::mt19937 rng(3);
  Vector logits = cpu::gradcheck::Random(B * K, rng, -4, 4);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  Vector dlogits(B * K);
  SoftmaxCrossEntropy(dlogits.data(), logits.data(), labels.data(), B, K);
  Vector scratch(B * K);
  const cpu::gradcheck::ForwardFn loss = [&](Vector& out) {
    out = {SoftmaxCrossEntropy(scratch.data(), logits.data(), labels.data(), B, K)};
  };
  EXPECT_TRUE(cpu::gradcheck::GradientMatches(logits, dlogits, {1.0}, loss));
}

TEST(SoftmaxCrossEntropyTest, LossOfUniformLogitsIsLogK) {
  const std::vector<float> logits(2 * 10, 3.0f);
  const std::vector<int32_t> labels = {1, 7};
  std::vector<float> dlogits(20);
  EXPECT_NEAR(SoftmaxCrossEntropy(dlogits.data(), logits.data(), labels.data(), 2, 10),
              std::log(10.0), 1e-6);
  // Large logits must not overflow.
  const std::vector<float> large = {1000.0f, 0.0f};
  EXPECT_NEAR(SoftmaxCrossEntropy(dlogits.data(), large.data(), labels.data(), 1, 2), 1000.0, 1e-3);
}

class ClassifierFileTest : public ::testing::Test {
 protected:
  TempDir temp_{"classifier_test"};
  std::string dir_ = temp_.path();
};

TEST_F(ClassifierFileTest, RoundTripKeepsConfigWeightsAndTraining) {
  Classifier<float> net(TinyConfig());
  net.InitializeRandom(9);
  const std::string path = dir_ + "/c.safetensors";
  ASSERT_TRUE(SaveClassifier(net, {{"epochs", 3}}, path).ok());
  Result<LoadedClassifier> loaded = LoadClassifier(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->classifier->config().ToJson(), TinyConfig().ToJson());
  EXPECT_EQ(loaded->training["epochs"], 3);
  EXPECT_TRUE(
      std::equal(net.params(), net.params() + net.num_params(), loaded->classifier->params()));
}

TEST_F(ClassifierFileTest, OtherSafetensorsFileIsRejectedWithItsName) {
  const std::string path = dir_ + "/other.safetensors";
  io::SafetensorsWriter writer;
  const float x = 1;
  writer.AddF32("x", {1}, &x);
  ASSERT_TRUE(writer.WriteAtomic(path).ok());
  Result<LoadedClassifier> loaded = LoadClassifier(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("difftrain-classifier"), std::string::npos)
      << loaded.status().message();
}

TEST_F(ClassifierFileTest, WrongTensorShapeIsRejected) {
  // The metadata says one architecture, the tensors are another's.
  Classifier<float> net(TinyConfig());
  const std::string path = dir_ + "/c.safetensors";
  io::SafetensorsWriter writer;
  for (const TensorSpec& t : net.parameter_table().tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (t.name == "fc2.weight") shape = {static_cast<int64_t>(t.numel)};
    writer.AddF32(t.name, shape, net.params() + t.offset);
  }
  writer.SetMetadata("format", "difftrain-classifier");
  writer.SetMetadata("version", "1");
  writer.SetMetadata("config", TinyConfig().ToJson().dump());
  ASSERT_TRUE(writer.WriteAtomic(path).ok());
  Result<LoadedClassifier> loaded = LoadClassifier(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("fc2.weight"), std::string::npos)
      << loaded.status().message();
}

TEST(ClassifierConfigTest, FromJsonRejectsMissingFieldsAndBadSizes) {
  nlohmann::json json = TinyConfig().ToJson();
  json.erase("hidden");
  EXPECT_FALSE(ClassifierConfig::FromJson(json).ok());
  json = TinyConfig().ToJson();
  json["patch"] = 3;  // 8 is not divisible by 3
  EXPECT_FALSE(ClassifierConfig::FromJson(json).ok());
  EXPECT_TRUE(ClassifierConfig::FromJson(TinyConfig().ToJson()).ok());
}

}  // namespace
}  // namespace difftrain::eval
