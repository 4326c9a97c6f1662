#include "model/eval/sample_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/eval/frechet.h"
#include "model/io/safetensors.h"

namespace difftrain::eval {
namespace {

Result<const io::TensorView*> FindTensor(const io::SafetensorsFile& file, const std::string& name,
                                         io::DType dtype) {
  const io::TensorView* view = file.Find(name);
  if (view == nullptr) return Errorf("has no tensor '{}'", name);
  if (view->dtype != dtype) {
    return Errorf("tensor '{}' is {}, expected {}", name, io::DTypeName(view->dtype),
                  io::DTypeName(dtype));
  }
  return view;
}

Result<LabelledImages> ReadSamples(const io::SafetensorsFile& file, const ClassifierConfig& c) {
  DT_ASSIGN_OR_RETURN(const io::TensorView* images, FindTensor(file, "images", io::DType::kF32));
  DT_ASSIGN_OR_RETURN(const io::TensorView* labels, FindTensor(file, "labels", io::DType::kI64));
  const std::vector<int64_t> image_shape = {c.channels, c.image_size, c.image_size};
  if (images->shape.size() != 4 ||
      !std::equal(image_shape.begin(), image_shape.end(), images->shape.begin() + 1)) {
    return Errorf("tensor 'images' has shape {}, expected [N, {}, {}, {}] (the classifier's)",
                  ShapeString(images->shape), c.channels, c.image_size, c.image_size);
  }
  const int64_t N = images->shape[0];
  if (N < 2) return Errorf("holds {} samples; a covariance needs at least 2", N);
  if (labels->shape != std::vector<int64_t>{N}) {
    return Errorf("tensor 'labels' has shape {}, expected [{}] (one per image)",
                  ShapeString(labels->shape), N);
  }

  LabelledImages out{N, std::vector<float>(N * c.image_floats()), std::vector<int32_t>(N)};
  // Views may be unaligned: copy out rather than dereference.
  std::memcpy(out.images.data(), images->data, images->bytes);
  std::vector<int64_t> wide(N);
  std::memcpy(wide.data(), labels->data, labels->bytes);
  for (int64_t n = 0; n < N; ++n) {
    if (wide[n] < 0 || wide[n] >= c.num_classes) {
      return Errorf("label {} of sample {} is not in [0, {})", wide[n], n, c.num_classes);
    }
    out.labels[n] = static_cast<int32_t>(wide[n]);
  }
  auto bad =
      std::find_if(out.images.begin(), out.images.end(), [](float v) { return !std::isfinite(v); });
  if (bad != out.images.end()) {
    return Errorf("image {} holds a non-finite value ({})",
                  (bad - out.images.begin()) / c.image_floats(), *bad);
  }
  return out;
}

}  // namespace

Result<LabelledImages> ReadSampleFile(const std::string& path, const ClassifierConfig& config) {
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  Result<LabelledImages> samples = ReadSamples(file, config);
  if (!samples.ok()) return samples.status().WithContext(fmt::format("samples '{}'", path));
  return samples;
}

nlohmann::json EvalReport::ToJson() const {
  nlohmann::json per_class = nlohmann::json::array();
  for (const std::optional<double>& a : class_accuracy)
    per_class.push_back(a ? nlohmann::json(*a) : nlohmann::json(nullptr));
  return {{"samples", samples},
          {"feature_dim", feature_dim},
          {"conditional_accuracy", conditional_accuracy},
          {"class_accuracy", per_class},
          {"fd", fd},
          {"real_count", real_count},
          {"real_accuracy", real_accuracy},
          {"floor_fd", floor_fd ? nlohmann::json(*floor_fd) : nlohmann::json(nullptr)},
          {"floor_count", floor_count}};
}

Result<EvalReport> EvaluateSamples(Classifier<float>& net, const LabelledImages& samples,
                                   const Dataset& real, const Dataset* floor_source,
                                   uint64_t seed) {
  const ClassifierConfig& c = net.config();
  EvalReport report;
  report.samples = samples.count;
  report.feature_dim = c.features;

  const Classification generated = Classify(net, samples.images.data(), samples.count);
  report.conditional_accuracy = Accuracy(generated.predictions, samples.labels);
  std::vector<int64_t> correct(c.num_classes, 0), total(c.num_classes, 0);
  for (int64_t n = 0; n < samples.count; ++n) {
    ++total[samples.labels[n]];
    correct[samples.labels[n]] += generated.predictions[n] == samples.labels[n];
  }
  for (int k = 0; k < c.num_classes; ++k) {
    report.class_accuracy.push_back(
        total[k] > 0 ? std::optional<double>(static_cast<double>(correct[k]) / total[k])
                     : std::nullopt);
  }

  DT_ASSIGN_OR_RETURN(LabelledImages reference, ReadImages(real, real.size(), false, 0));
  const Classification real_out = Classify(net, reference.images.data(), reference.count);
  report.real_count = reference.count;
  report.real_accuracy = Accuracy(real_out.predictions, reference.labels);
  const Gaussian real_gaussian = FitGaussian(real_out.features.data(), reference.count, c.features);
  report.fd = FrechetDistance(FitGaussian(generated.features.data(), samples.count, c.features),
                              real_gaussian);

  if (floor_source != nullptr) {
    const int64_t count = std::min(samples.count, floor_source->size());
    if (count < 2) return Errorf("the floor needs at least 2 training images, there are {}", count);
    report.floor_count = count;
    DT_ASSIGN_OR_RETURN(LabelledImages floor_images, ReadImages(*floor_source, count, true, seed));
    const Classification floor_out = Classify(net, floor_images.images.data(), count);
    report.floor_fd =
        FrechetDistance(FitGaussian(floor_out.features.data(), count, c.features), real_gaussian);
  }
  return report;
}

}  // namespace difftrain::eval
