#include "model/eval/classifier_training.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "model/data/loader.h"
#include "model/optim/adamw.h"

namespace difftrain::eval {

Result<LabelledImages> ReadImages(const Dataset& dataset, int64_t count, bool shuffle,
                                  uint64_t seed) {
  DT_CHECK(count >= 1 && count <= dataset.size(), "reading {} of {} samples", count,
           dataset.size());
  DataLoaderOptions options;
  options.seed = seed;
  options.shuffle = shuffle;
  options.prefetch = false;
  DataLoader loader(dataset, options);
  LabelledImages out{count, std::vector<float>(count * dataset.sample_floats()),
                     std::vector<int32_t>(count)};
  DT_RETURN_IF_ERROR(loader.Fill(0, static_cast<int>(count), out.images.data(), out.labels.data()));
  return out;
}

Classification Classify(Classifier<float>& net, const float* images, int64_t N, int batch) {
  const ClassifierConfig& c = net.config();
  Classification out{c.features, std::vector<float>(N * c.features), std::vector<int32_t>(N)};
  for (int64_t first = 0; first < N; first += batch) {
    const int B = static_cast<int>(std::min<int64_t>(batch, N - first));
    net.Forward(images + first * c.image_floats(), B);
    std::copy_n(net.features(), static_cast<size_t>(B) * c.features,
                out.features.begin() + first * c.features);
    Argmax(out.predictions.data() + first, net.logits(), B, c.num_classes);
  }
  return out;
}

double Accuracy(const std::vector<int32_t>& predictions, const std::vector<int32_t>& labels) {
  DT_CHECK(!labels.empty() && predictions.size() == labels.size(), "{} predictions for {} labels",
           predictions.size(), labels.size());
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i)
    correct += predictions[i] == labels[i];
  return static_cast<double>(correct) / static_cast<double>(labels.size());
}

Status ClassifierTrainOptions::Validate() const {
  if (epochs < 1) return Errorf("epochs must be positive, got {}", epochs);
  if (batch_size < 1) return Errorf("batch size must be positive, got {}", batch_size);
  if (!(lr > 0)) return Errorf("learning rate must be positive, got {}", lr);
  if (!(warmup_fraction >= 0 && warmup_fraction < 1)) {
    return Errorf("warm-up fraction must be in [0, 1), got {}", warmup_fraction);
  }
  if (weight_decay < 0) return Errorf("weight decay must be >= 0, got {}", weight_decay);
  return Status::Ok();
}

nlohmann::json ClassifierTrainOptions::ToJson() const {
  return {{"epochs", epochs},
          {"batch_size", batch_size},
          {"lr", lr},
          {"warmup_fraction", warmup_fraction},
          {"weight_decay", weight_decay},
          {"seed", seed},
          {"horizontal_flip", horizontal_flip}};
}

double ClassifierLearningRate(const ClassifierTrainOptions& options, int64_t step,
                              int64_t total_steps) {
  return ScheduledLearningRate(options.lr,
                               options.warmup_fraction * static_cast<double>(total_steps),
                               /*cosine=*/true, step, total_steps);
}

Status TrainClassifier(Classifier<float>& net, const Dataset& train,
                       const ClassifierTrainOptions& options, const EpochCallback& on_epoch) {
  const Status valid = options.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  DT_CHECK(train.size() >= 1 && !train.unbounded(), "training set of {} samples", train.size());
  const ClassifierConfig& c = net.config();
  DT_CHECK(train.sample_floats() == c.image_floats() && train.num_classes() <= c.num_classes,
           "dataset of {}×{}×{} images and {} classes for a classifier of {}", train.channels(),
           train.height(), train.width(), train.num_classes(), c.ToJson().dump());
  net.InitializeRandom(options.seed);

  DataLoaderOptions loader_options;
  loader_options.seed = options.seed;
  loader_options.batch_size = options.batch_size;
  loader_options.horizontal_flip = options.horizontal_flip;
  DataLoader loader(train, loader_options);

  const size_t n = net.num_params();
  std::vector<float> exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  OptimizerConfig adamw;
  adamw.weight_decay = options.weight_decay;
  const int B = options.batch_size;
  const int64_t steps_per_epoch = std::max<int64_t>(1, train.size() / B);
  const int64_t total_steps = steps_per_epoch * options.epochs;
  std::vector<float> images(B * c.image_floats()), dlogits(static_cast<size_t>(B) * c.num_classes);
  std::vector<int32_t> labels(B);

  double epoch_loss = 0;
  for (int64_t step = 0; step < total_steps; ++step) {
    DT_RETURN_IF_ERROR(loader.FillRankBatch(step * B, images.data(), labels.data()));
    net.Forward(images.data(), B);
    epoch_loss +=
        SoftmaxCrossEntropy(dlogits.data(), net.logits(), labels.data(), B, c.num_classes);
    std::fill_n(net.grads(), n, 0.0f);
    net.Backward(dlogits.data());
    AdamWUpdate(net.params(), net.grads(), exp_avg.data(), exp_avg_sq.data(), n,
                ClassifierLearningRate(options, step, total_steps), 1.0, step + 1, adamw);
    if ((step + 1) % steps_per_epoch == 0) {
      if (on_epoch)
        on_epoch(static_cast<int>((step + 1) / steps_per_epoch),
                 epoch_loss / static_cast<double>(steps_per_epoch));
      epoch_loss = 0;
    }
  }
  return Status::Ok();
}

}  // namespace difftrain::eval
