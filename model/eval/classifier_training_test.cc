// Training the evaluation classifier: a short run on a subset of Fashion-MNIST learns (well
// above chance), a run is a function of its seed, and the learning-rate schedule.
#include "model/eval/classifier_training.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "model/data/fashion_mnist.h"

namespace difftrain::eval {
namespace {

class ClassifierTrainingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* split : {"train", "test"}) {
      Result<std::unique_ptr<FashionMnistDataset>> data =
          FashionMnistDataset::Load(std::string(kFashionMnistDefaultDir), split);
      ASSERT_TRUE(data.ok()) << data.status().message();
      (std::string(split) == "train" ? train_ : test_) = std::move(data).value().release();
    }
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
  }

  static const Dataset* train_;
  static const Dataset* test_;
};

const Dataset* ClassifierTrainingTest::train_ = nullptr;
const Dataset* ClassifierTrainingTest::test_ = nullptr;

TEST_F(ClassifierTrainingTest, OneEpochOnFiveThousandImagesLearns) {
  const PrefixDataset subset(*train_, 5000);
  Classifier<float> net{ClassifierConfig{}};
  ClassifierTrainOptions options;
  options.epochs = 1;
  std::vector<double> losses;
  ASSERT_TRUE(TrainClassifier(net, subset, options, [&](int, double loss) {
                losses.push_back(loss);
              }).ok());
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_LT(losses[0], std::log(10.0));  // below the loss of a uniform guess

  Result<LabelledImages> test = ReadImages(*test_, 1000, true, 0);
  ASSERT_TRUE(test.ok()) << test.status().message();
  const Classification out = Classify(net, test->images.data(), test->count, 300);
  const double accuracy = Accuracy(out.predictions, test->labels);
  std::printf("accuracy on 1000 test images after one epoch on 5000: %.3f\n", accuracy);
  EXPECT_GT(accuracy, 0.7) << "chance is 0.1";
  EXPECT_EQ(out.features.size(), 1000u * ClassifierConfig{}.features);
}

TEST_F(ClassifierTrainingTest, TrainingIsAFunctionOfTheSeed) {
  const PrefixDataset subset(*train_, 512);
  ClassifierTrainOptions options;
  options.epochs = 1;
  options.batch_size = 64;
  auto train = [&](uint64_t seed) {
    options.seed = seed;
    auto net = std::make_unique<Classifier<float>>(ClassifierConfig{});
    EXPECT_TRUE(TrainClassifier(*net, subset, options, nullptr).ok());
    return std::vector<float>(net->params(), net->params() + net->num_params());
  };
  const std::vector<float> first = train(1);
  EXPECT_EQ(train(1), first);
  EXPECT_NE(train(2), first);
}

TEST(ClassifierLearningRateTest, WarmsUpThenDecaysToZero) {
  ClassifierTrainOptions options;
  options.lr = 1e-3;
  options.warmup_fraction = 0.01;
  EXPECT_NEAR(ClassifierLearningRate(options, 0, 1000), 1e-4, 1e-9);
  EXPECT_NEAR(ClassifierLearningRate(options, 9, 1000), 1e-3, 1e-5);
  EXPECT_NEAR(ClassifierLearningRate(options, 500, 1000), 0.5e-3, 1e-9);
  EXPECT_LT(ClassifierLearningRate(options, 999, 1000), 1e-8);
}

TEST(AccuracyTest, CountsMatches) {
  EXPECT_DOUBLE_EQ(Accuracy({1, 2, 3, 4}, {1, 0, 3, 0}), 0.5);
}

}  // namespace
}  // namespace difftrain::eval
