// Training the evaluation classifier with AdamW, and running it over sets of images.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/data/dataset.h"
#include "model/eval/classifier.h"

namespace difftrain::eval {

// Images [count, C, H, W] and their labels, held in memory.
struct LabelledImages {
  int64_t count = 0;
  std::vector<float> images;
  std::vector<int32_t> labels;
};

// The first `count` samples (count ≤ dataset.size()) in the order a DataLoader with `seed`
// reads them: the dataset's own order without `shuffle`, else the first `count` indices of
// the permutation of epoch 0 (docs/data.md).
Result<LabelledImages> ReadImages(const Dataset& dataset, int64_t count, bool shuffle,
                                  uint64_t seed);

// What the classifier makes of a set of images.
struct Classification {
  int dim = 0;                       // F
  std::vector<float> features;       // [N, F]
  std::vector<int32_t> predictions;  // [N]
};

// Runs `net` over images [N, C, H, W] in batches of `batch`.
Classification Classify(Classifier<float>& net, const float* images, int64_t N, int batch = 500);

// The fraction of predictions equal to their label (same length, not empty).
double Accuracy(const std::vector<int32_t>& predictions, const std::vector<int32_t>& labels);

struct ClassifierTrainOptions {
  int epochs = 10;
  int batch_size = 128;
  double lr = 2e-3;               // peak; linear warm-up, then cosine decay to 0 over the whole run
  double warmup_fraction = 0.03;  // of all steps, so that short runs warm up as quickly
  double weight_decay = 0.05;
  uint64_t seed = 0;  // initialisation (kInit) and the loader's shuffle (kData)
  bool horizontal_flip = false;

  Status Validate() const;
  nlohmann::json ToJson() const;
};

// The learning rate of optimizer step `step` of `total_steps`.
double ClassifierLearningRate(const ClassifierTrainOptions& options, int64_t step,
                              int64_t total_steps);

// Called after each epoch (1-based) with the mean training loss of its steps.
using EpochCallback = std::function<void(int epoch, double mean_loss)>;

// Initialises `net` from options.seed and trains it on `train` with AdamW: epochs of
// ⌊size / batch⌋ steps over the shuffled stream of a DataLoader (docs/data.md), so that a
// run is a function of (data, options). Errors are the dataset's read errors.
Status TrainClassifier(Classifier<float>& net, const Dataset& train,
                       const ClassifierTrainOptions& options, const EpochCallback& on_epoch);

}  // namespace difftrain::eval
