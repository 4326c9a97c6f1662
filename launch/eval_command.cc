// `difftrain eval`: the quality of generated Fashion-MNIST samples (docs/eval.md).
//   eval --classifier C --samples S   conditional accuracy and Fréchet distance of S
//   eval train-classifier --out C     trains the classifier those metrics use
//   eval video --classifier C --samples S   a video model's moving garments: per-frame
//                                     accuracy, path residual, agreement, beside real videos
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "launch/command.h"
#include "model/data/dataset.h"
#include "model/eval/classifier.h"
#include "model/eval/classifier_training.h"
#include "model/eval/sample_metrics.h"
#include "model/eval/video_metrics.h"

namespace difftrain::launch {
namespace {

using eval::Classifier;
using eval::ClassifierConfig;

Result<std::unique_ptr<Dataset>> OpenFashionMnist(const std::string& dir,
                                                  const std::string& split) {
  DatasetSpec spec;
  spec.kind = "fashion_mnist";
  spec.path = dir;
  spec.split = split;
  return OpenDataset(spec);
}

// Writes a report's JSON; exit 0, or 1 when it cannot be written.
int WriteJson(const char* command, const std::string& path, const nlohmann::json& json) {
  std::ofstream out(path, std::ios::trunc);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) {
    std::fprintf(stderr, "difftrain %s: cannot write '%s'\n", command, path.c_str());
    return kExitJobFailed;
  }
  return kExitOk;
}

// The classifier must read the dataset's images as they are.
Status CheckShape(const Dataset& data, const ClassifierConfig& c) {
  if (data.channels() != c.channels || data.height() != c.image_size ||
      data.width() != c.image_size || data.num_classes() > c.num_classes) {
    return Errorf("the dataset's {}×{}×{} images of {} classes do not fit the classifier's {}",
                  data.channels(), data.height(), data.width(), data.num_classes(),
                  c.ToJson().dump());
  }
  return Status::Ok();
}

// --- eval train-classifier ---

struct TrainClassifierOptions {
  eval::ClassifierTrainOptions train;
  std::string out;
  std::string data_dir;
  int64_t limit = 0;  // 0: the whole training split
};

int RunTrainClassifier(const TrainClassifierOptions& o) {
  constexpr const char* kCommand = "eval train-classifier";
  if (Status valid = o.train.Validate(); !valid.ok())
    return ReportBadInput(kCommand, valid.message());
  if (o.limit < 0) return ReportBadInput(kCommand, "--limit must not be negative");
  Result<std::unique_ptr<Dataset>> train = OpenFashionMnist(o.data_dir, "train");
  if (!train.ok()) return ReportBadInput(kCommand, train.status().message());
  Result<std::unique_ptr<Dataset>> test = OpenFashionMnist(o.data_dir, "test");
  if (!test.ok()) return ReportBadInput(kCommand, test.status().message());
  const int64_t count = o.limit > 0 ? std::min(o.limit, (*train)->size()) : (*train)->size();
  const PrefixDataset train_set(**train, count);
  Result<eval::LabelledImages> test_images = eval::ReadImages(**test, (*test)->size(), false, 0);
  if (!test_images.ok()) return ReportBadInput(kCommand, test_images.status().message());

  const ClassifierConfig config;
  Classifier<float> net(config);
  spdlog::info("training a {}-parameter classifier on {} images for {} epochs ({} threads)",
               net.num_params(), count, o.train.epochs, omp_get_max_threads());
  const auto start = std::chrono::steady_clock::now();
  double test_accuracy = 0;
  const Status trained =
      eval::TrainClassifier(net, train_set, o.train, [&](int epoch, double loss) {
        const eval::Classification out =
            eval::Classify(net, test_images->images.data(), test_images->count);
        test_accuracy = eval::Accuracy(out.predictions, test_images->labels);
        spdlog::info("epoch {}/{}: train loss {:.4f}, test accuracy {:.2f}%", epoch, o.train.epochs,
                     loss, 100 * test_accuracy);
      });
  if (!trained.ok()) return ReportBadInput(kCommand, trained.message());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  nlohmann::json training = o.train.ToJson();
  training["dataset"] = "fashion_mnist";
  training["train_samples"] = count;
  training["test_samples"] = test_images->count;
  training["test_accuracy"] = test_accuracy;
  training["seconds"] = seconds;
  training["threads"] = omp_get_max_threads();
  if (Status saved = eval::SaveClassifier(net, training, o.out); !saved.ok()) {
    std::fprintf(stderr, "difftrain %s: %s\n", kCommand, saved.message().c_str());
    return kExitJobFailed;
  }
  std::printf("test accuracy %.4f on %lld images; trained in %.1f s; wrote %s\n", test_accuracy,
              static_cast<long long>(test_images->count), seconds, o.out.c_str());
  return kExitOk;
}

// --- eval ---

struct EvalOptions {
  std::string classifier;
  std::string samples;
  std::string real_split = "test";
  std::string data_dir;
  bool floor = false;
  uint64_t seed = 0;
  std::string json;
};

std::string Percent(const std::optional<double>& fraction) {
  return fraction ? fmt::format("{:.1f}%", 100 * *fraction) : "-";
}

void PrintReport(const EvalOptions& o, const eval::EvalReport& r) {
  std::printf("samples               %lld from %s\n", static_cast<long long>(r.samples),
              o.samples.c_str());
  std::printf("conditional accuracy  %.4f (the classifier on real %s: %.4f)\n",
              r.conditional_accuracy, o.real_split.c_str(), r.real_accuracy);
  std::string per_class;
  for (size_t k = 0; k < r.class_accuracy.size(); ++k)
    per_class += fmt::format(" {}:{}", k, Percent(r.class_accuracy[k]));
  std::printf("  per class          %s\n", per_class.c_str());
  std::printf("FD                    %.4f (%d features, vs %lld real %s images)\n", r.fd,
              r.feature_dim, static_cast<long long>(r.real_count), o.real_split.c_str());
  if (r.floor_fd) {
    std::printf("floor FD              %.4f (%lld real train images, seed %llu)\n", *r.floor_fd,
                static_cast<long long>(r.floor_count), static_cast<unsigned long long>(o.seed));
  }
}

int RunEval(const EvalOptions& o) {
  constexpr const char* kCommand = "eval";
  if (o.classifier.empty() || o.samples.empty()) {
    return ReportBadInput(kCommand,
                          "give --classifier and --samples (or the train-classifier subcommand)");
  }
  if (o.real_split != "test" && o.real_split != "train") {
    return ReportBadInput(kCommand,
                          fmt::format("--real-split '{}' is not test or train", o.real_split));
  }
  Result<eval::LoadedClassifier> loaded = eval::LoadClassifier(o.classifier);
  if (!loaded.ok()) return ReportBadInput(kCommand, loaded.status().message());
  Classifier<float>& net = *loaded->classifier;
  Result<eval::LabelledImages> samples = eval::ReadSampleFile(o.samples, net.config());
  if (!samples.ok()) return ReportBadInput(kCommand, samples.status().message());

  Result<std::unique_ptr<Dataset>> real = OpenFashionMnist(o.data_dir, o.real_split);
  if (!real.ok()) return ReportBadInput(kCommand, real.status().message());
  if (Status fits = CheckShape(**real, net.config()); !fits.ok()) {
    return ReportBadInput(kCommand, fits.message());
  }
  std::unique_ptr<Dataset> floor_source;
  if (o.floor) {
    Result<std::unique_ptr<Dataset>> train = OpenFashionMnist(o.data_dir, "train");
    if (!train.ok()) return ReportBadInput(kCommand, train.status().message());
    floor_source = std::move(train).value();
  }

  Result<eval::EvalReport> report =
      eval::EvaluateSamples(net, *samples, **real, floor_source.get(), o.seed);
  if (!report.ok()) return ReportBadInput(kCommand, report.status().message());
  PrintReport(o, *report);

  if (!o.json.empty()) {
    nlohmann::json json = report->ToJson();
    json["samples_file"] = o.samples;
    json["classifier_file"] = o.classifier;
    json["real_split"] = o.real_split;
    json["floor_seed"] = o.seed;
    return WriteJson("eval", o.json, json);
  }
  return kExitOk;
}

// --- eval video ---

struct VideoEvalOptions {
  std::string classifier, samples, json, data_dir;
  std::string real_split = "test";
  int garment = 14;
};

int RunVideoEval(const VideoEvalOptions& o) {
  constexpr const char* kCommand = "eval video";
  if (o.classifier.empty() || o.samples.empty())
    return ReportBadInput(kCommand, "give --classifier and --samples");
  Result<eval::LoadedClassifier> loaded = eval::LoadClassifier(o.classifier);
  if (!loaded.ok()) return ReportBadInput(kCommand, loaded.status().message());
  Classifier<float>& net = *loaded->classifier;
  Result<eval::Videos> samples = eval::ReadVideoSampleFile(o.samples);
  if (!samples.ok()) return ReportBadInput(kCommand, samples.status().message());
  if (o.garment < 1 || o.garment > samples->size)
    return ReportBadInput(kCommand, "--garment must be between 1 and the canvas side");
  // The floor: as many real videos of the same shape, processed the same way.
  DatasetSpec spec;
  spec.kind = "moving_fashion_mnist";
  spec.path = o.data_dir;
  spec.split = o.real_split;
  spec.frames = samples->frames;
  spec.image_size = samples->size;
  Result<std::unique_ptr<Dataset>> real_data = OpenDataset(spec);
  if (!real_data.ok()) return ReportBadInput(kCommand, real_data.status().message());
  Result<eval::Videos> real = eval::ReadVideos(**real_data, samples->count);
  if (!real.ok()) return ReportBadInput(kCommand, real.status().message());

  const eval::VideoReport generated = eval::EvaluateVideos(net, *samples, o.garment);
  const eval::VideoReport floor = eval::EvaluateVideos(net, *real, o.garment);
  const double accuracy_ratio = generated.frame_accuracy / floor.frame_accuracy;
  const double residual_ratio = generated.track_residual / floor.track_residual;
  std::printf("%-16s %10s %10s %s\n", "", "generated", "real", "target");
  std::printf("%-16s %10.3f %10.3f ratio %.2f (>= 0.7 of real: %s)\n", "frame accuracy",
              generated.frame_accuracy, floor.frame_accuracy, accuracy_ratio,
              accuracy_ratio >= 0.7 ? "met" : "not met");
  std::printf("%-16s %10.3f %10.3f ratio %.2f (<= 2x real: %s)\n", "track residual px",
              generated.track_residual, floor.track_residual, residual_ratio,
              residual_ratio <= 2 ? "met" : "not met");
  std::printf("%-16s %10.3f %10.3f (>= 0.8: %s)\n", "agreement", generated.agreement,
              floor.agreement, generated.agreement >= 0.8 ? "met" : "not met");
  std::printf("%-16s %10.3f %10.3f\n", "missing frames", generated.missing_frames,
              floor.missing_frames);
  std::printf(
      "\nby label: videos, frame accuracy, agreement, track residual px (generated | real)\n");
  for (size_t label = 0; label < generated.per_label.size(); ++label) {
    const eval::VideoMeasures& g = generated.per_label[label];
    if (g.videos == 0) continue;
    const eval::VideoMeasures r =
        label < floor.per_label.size() ? floor.per_label[label] : eval::VideoMeasures{};
    std::printf("%5zu %6lld %6.3f %6.3f %6.3f | %6lld %6.3f %6.3f %6.3f\n", label,
                static_cast<long long>(g.videos), g.frame_accuracy, g.agreement, g.track_residual,
                static_cast<long long>(r.videos), r.frame_accuracy, r.agreement, r.track_residual);
  }
  if (!o.json.empty()) {
    nlohmann::json json = {{"generated", generated.ToJson()},
                           {"real", floor.ToJson()},
                           {"samples_file", o.samples},
                           {"classifier_file", o.classifier},
                           {"real_split", o.real_split}};
    return WriteJson("eval video", o.json, json);
  }
  return kExitOk;
}

std::function<int()> SetupEval(CLI::App& app) {
  app.require_subcommand(0, 1);
  auto eval_options = std::make_shared<EvalOptions>();
  EvalOptions& e = *eval_options;
  app.add_option("--classifier", e.classifier, "classifier file (eval train-classifier --out)");
  app.add_option("--samples", e.samples,
                 "samples file: images F32 [N,1,32,32] in [-1,1], labels I64 [N]");
  app.add_option("--real-split", e.real_split, "the real Fashion-MNIST split to compare with")
      ->capture_default_str();
  app.add_flag("--floor", e.floor,
               "also the FD of N real train images (the first N of a seeded shuffle)");
  app.add_option("--seed", e.seed, "seed of the floor's shuffle")->capture_default_str();
  app.add_option("--json", e.json, "also write the metrics as JSON to this file");
  app.add_option("--data-dir", e.data_dir,
                 "directory of the Fashion-MNIST IDX files (default Debian's)");
  app.footer(
      "Example: difftrain eval --classifier classifier.safetensors --samples samples.safetensors "
      "--floor");

  auto train_options = std::make_shared<TrainClassifierOptions>();
  TrainClassifierOptions& t = *train_options;
  CLI::App* train = app.add_subcommand(
      "train-classifier", "train the evaluation classifier on Fashion-MNIST's training split");
  train->add_option("--out", t.out, "the classifier file to write")->required();
  train->add_option("--epochs", t.train.epochs, "passes over the training images")
      ->capture_default_str();
  train->add_option("--seed", t.train.seed, "seed of initialisation and shuffling")
      ->capture_default_str();
  train->add_option("--limit", t.limit, "train on the first N training images, 0 all")
      ->capture_default_str();
  train->add_option("--batch", t.train.batch_size, "images per step")->capture_default_str();
  train->add_option("--lr", t.train.lr, "peak learning rate")->capture_default_str();
  train->add_option("--weight-decay", t.train.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  train->footer("Example: difftrain eval train-classifier --out classifier.safetensors");
  train->add_flag("--flip", t.train.horizontal_flip, "flip training images left-right at random");
  train->add_option("--data-dir", t.data_dir,
                    "directory of the Fashion-MNIST IDX files (default Debian's)");

  auto video_options = std::make_shared<VideoEvalOptions>();
  VideoEvalOptions& v = *video_options;
  CLI::App* video = app.add_subcommand(
      "video", "measure a video model's moving garments beside real moving_fashion_mnist videos");
  video->add_option("--classifier", v.classifier, "classifier file (eval train-classifier --out)")
      ->required();
  video
      ->add_option("--samples", v.samples,
                   "samples file: images F32 [N,F,1,S,S] in [-1,1], labels I64 [N]")
      ->required();
  video->add_option("--real-split", v.real_split, "the real split whose videos are the floor")
      ->capture_default_str();
  video->add_option("--garment", v.garment, "the garment's side on the canvas")
      ->capture_default_str();
  video->add_option("--json", v.json, "also write the metrics as JSON to this file");
  video->add_option("--data-dir", v.data_dir,
                    "directory of the Fashion-MNIST IDX files (default Debian's)");

  return [eval_options, train_options, train, video_options, video] {
    if (video->parsed()) return RunVideoEval(*video_options);
    return train->parsed() ? RunTrainClassifier(*train_options) : RunEval(*eval_options);
  };
}

DIFFTRAIN_COMMAND(kEvalCommand,
                  {"eval",
                   "measure generated samples with a Fashion-MNIST classifier: conditional "
                   "accuracy, Fréchet distance (and train that classifier)",
                   SetupEval});

}  // namespace
}  // namespace difftrain::launch
