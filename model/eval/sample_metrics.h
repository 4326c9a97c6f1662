// The metrics of `difftrain eval` (docs/eval.md) for a file of generated samples:
//   conditional accuracy  the fraction of samples the classifier assigns to their label;
//   FD                    the Fréchet distance of classifier features, samples vs a real split;
//   floor FD              the same distance for N real training images (the first N of a
//                         seeded shuffle) — what a perfect generator of N samples would score.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/data/dataset.h"
#include "model/eval/classifier.h"
#include "model/eval/classifier_training.h"

namespace difftrain::eval {

// Reads a samples file (`difftrain sample --raw`): tensor `images` F32 [N, C, S, S] of the
// classifier's shape and `labels` I64 [N] in [0, classes), N ≥ 2, every value finite. Errors
// name the file and what is wrong.
Result<LabelledImages> ReadSampleFile(const std::string& path, const ClassifierConfig& config);

struct EvalReport {
  int64_t samples = 0;
  int feature_dim = 0;
  double conditional_accuracy = 0;
  // Per class: the accuracy over the samples of that label; nullopt when there are none.
  std::vector<std::optional<double>> class_accuracy;
  double fd = 0;
  int64_t real_count = 0;
  double real_accuracy = 0;  // the classifier's accuracy on the real split, for scale
  std::optional<double> floor_fd;
  int64_t floor_count = 0;  // the real training images behind floor_fd

  nlohmann::json ToJson() const;
};

// Classifies `samples` and the whole of `real`; with `floor_source`, also the first
// samples.count images of its shuffle by `seed` (all of it when it has fewer).
Result<EvalReport> EvaluateSamples(Classifier<float>& net, const LabelledImages& samples,
                                   const Dataset& real, const Dataset* floor_source, uint64_t seed);

}  // namespace difftrain::eval
