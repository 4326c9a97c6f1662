// The Fashion-MNIST classifier behind `difftrain eval` (docs/eval.md): a patch-MLP built from
// the model core's CPU ops, whose penultimate layer is the feature space of the Fréchet
// distance and whose predictions give the conditional accuracy of generated samples.
//
//   patches  = Patchify(images)                 [B, T, C·p·p]   T = (S/p)²
//   embed    = GELU(patches · Wpᵀ + bp)         [B, T, D]       a p×p conv of stride p
//   normed   = LayerNorm(embed over T·D)        [B, T·D]        no affine parameters
//   hidden   = GELU(normed · W1ᵀ + b1)          [B, H]
//   features = GELU(hidden · W2ᵀ + b2)          [B, F]          the Fréchet features
//   logits   = features · Whᵀ + bh              [B, K]
//
// Parameters are one arena laid out by a TensorTable; gradients are a second arena of the
// same layout, and Backward adds (+=) into it. Templated on the element type so that the
// backward can be checked against finite differences in double precision; training and
// evaluation use float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/tensor/buffer.h"
#include "model/tensor/tensor_table.h"

namespace difftrain::eval {

struct ClassifierConfig {
  int channels = 1;
  int image_size = 32;
  int patch = 4;
  int patch_dim = 32;  // D: output channels of the patch embedding
  int hidden = 256;    // H
  int features = 128;  // F: the penultimate layer
  int num_classes = 10;

  int tokens() const { return (image_size / patch) * (image_size / patch); }
  int patch_features() const { return channels * patch * patch; }
  int64_t image_floats() const { return int64_t{channels} * image_size * image_size; }

  Status Validate() const;
  nlohmann::json ToJson() const;
  // Every field must be present and an integer; the result is validated.
  static Result<ClassifierConfig> FromJson(const nlohmann::json& json);
};

// Mean softmax cross-entropy of logits [B, K] against labels, accumulated in double.
// Writes (=) dlogits = (softmax(logits) − onehot(label)) / B, the gradient of that mean.
template <typename T>
double SoftmaxCrossEntropy(T* dlogits, const T* logits, const int32_t* labels, int B, int K);

// The index of the largest of each row of logits [B, K] (the first one on ties).
template <typename T>
void Argmax(int32_t* out, const T* logits, int B, int K);

template <typename T>
class Classifier {
 public:
  explicit Classifier(const ClassifierConfig& config);

  const ClassifierConfig& config() const { return config_; }
  const TensorTable& parameter_table() const { return table_; }
  size_t num_params() const { return table_.total(); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }

  // PyTorch's default for nn.Linear: every weight and bias U(−1/√fan_in, 1/√fan_in), drawn
  // from Rng(seed, kInit, i) for the i-th tensor of the table.
  void InitializeRandom(uint64_t seed);

  // Runs the network on images [B, C, S, S]; logits() and features() then hold its outputs,
  // and the activations are kept for Backward.
  void Forward(const T* images, int B);
  const T* logits() const { return acts_.logits; }
  const T* features() const { return acts_.features; }

  // Adds into grads() the gradient of Σ dlogits ⊙ logits for the batch of the last Forward.
  void Backward(const T* dlogits);

 private:
  // Activations of one batch (and, in a second arena of the same layout, their gradients).
  struct Acts {
    T *patches, *embed_pre, *embed, *normed, *mean, *rstd, *hidden_pre, *hidden, *features_pre,
        *features, *logits;
  };
  // Calls visit(name, elements, member) for every activation of a batch of B, in layout order.
  template <typename Visit>
  void VisitActivations(int B, Acts& acts, Visit&& visit) const;
  void EnsureActivations(int B);

  ClassifierConfig config_;
  TensorTable table_;
  Buffer<T> params_, grads_;
  // Offsets of the parameters in the arena.
  size_t patch_w_, patch_b_, fc1_w_, fc1_b_, fc2_w_, fc2_b_, head_w_, head_b_;

  int batch_ = 0;
  Buffer<T> act_buffer_, dact_buffer_;
  Acts acts_{}, dacts_{};
};

// The classifier file: a safetensors file of the parameters (F32, names and shapes of the
// parameter table) with metadata format = "difftrain-classifier", version = "1",
// config = ClassifierConfig::ToJson() and training = `training` (how it was made).
Status SaveClassifier(const Classifier<float>& classifier, const nlohmann::json& training,
                      const std::string& path);

struct LoadedClassifier {
  std::unique_ptr<Classifier<float>> classifier;
  nlohmann::json training;  // the metadata `training`, {} when absent
};
// Errors name the file: not safetensors, not a classifier file, a bad config, a tensor
// missing, of another shape or dtype, or one the architecture does not have.
Result<LoadedClassifier> LoadClassifier(const std::string& path);

}  // namespace difftrain::eval
