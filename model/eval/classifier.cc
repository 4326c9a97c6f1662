#include "model/eval/classifier.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/embed.h"
#include "model/cpu/layernorm.h"
#include "model/cpu/linear.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"

namespace difftrain::eval {
namespace {

constexpr std::string_view kFormat = "difftrain-classifier";
constexpr std::string_view kVersion = "1";
constexpr double kLayerNormEps = 1e-6;

}  // namespace

Status ClassifierConfig::Validate() const {
  if (channels < 1 || image_size < 1 || patch < 1 || patch_dim < 1 || hidden < 1 || features < 1 ||
      num_classes < 2) {
    return Errorf("classifier config needs positive sizes and at least 2 classes, got {}",
                  ToJson().dump());
  }
  if (image_size % patch != 0) {
    return Errorf("classifier image size {} is not divisible by its patch {}", image_size, patch);
  }
  return Status::Ok();
}

nlohmann::json ClassifierConfig::ToJson() const {
  return {{"channels", channels},      {"image_size", image_size}, {"patch", patch},
          {"patch_dim", patch_dim},    {"hidden", hidden},         {"features", features},
          {"num_classes", num_classes}};
}

Result<ClassifierConfig> ClassifierConfig::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) return Errorf("classifier config is not a JSON object: {}", json.dump());
  ClassifierConfig c;
  const std::pair<const char*, int*> fields[] = {
      {"channels", &c.channels},      {"image_size", &c.image_size}, {"patch", &c.patch},
      {"patch_dim", &c.patch_dim},    {"hidden", &c.hidden},         {"features", &c.features},
      {"num_classes", &c.num_classes}};
  for (const auto& [name, value] : fields) {
    auto it = json.find(name);
    if (it == json.end() || !it->is_number_integer()) {
      return Errorf("classifier config lacks the integer '{}': {}", name, json.dump());
    }
    *value = it->get<int>();
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

template <typename T>
double SoftmaxCrossEntropy(T* dlogits, const T* logits, const int32_t* labels, int B, int K) {
  double loss = 0;
#pragma omp parallel for reduction(+ : loss) schedule(static)
  for (int b = 0; b < B; ++b) {
    const T* z = logits + static_cast<size_t>(b) * K;
    T* dz = dlogits + static_cast<size_t>(b) * K;
    DT_CHECK(labels[b] >= 0 && labels[b] < K, "label {} out of range [0, {})", labels[b], K);
    // Softmax after subtracting the largest logit, so that exp never overflows.
    const double top = *std::max_element(z, z + K);
    double sum = 0;
    for (int k = 0; k < K; ++k)
      sum += std::exp(static_cast<double>(z[k]) - top);
    loss += std::log(sum) + top - static_cast<double>(z[labels[b]]);
    for (int k = 0; k < K; ++k) {
      const double p = std::exp(static_cast<double>(z[k]) - top) / sum;
      dz[k] = static_cast<T>((p - (k == labels[b] ? 1.0 : 0.0)) / B);
    }
  }
  return loss / B;
}

template <typename T>
void Argmax(int32_t* out, const T* logits, int B, int K) {
  for (int b = 0; b < B; ++b) {
    const T* z = logits + static_cast<size_t>(b) * K;
    out[b] = static_cast<int32_t>(std::max_element(z, z + K) - z);
  }
}

template <typename T>
Classifier<T>::Classifier(const ClassifierConfig& config) : config_(config) {
  const Status valid = config.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  const ClassifierConfig& c = config_;
  const int64_t flat = int64_t{c.tokens()} * c.patch_dim;
  patch_w_ = table_.Add("patch_embed.weight", {c.patch_dim, c.patch_features()});
  patch_b_ = table_.Add("patch_embed.bias", {c.patch_dim});
  fc1_w_ = table_.Add("fc1.weight", {c.hidden, flat});
  fc1_b_ = table_.Add("fc1.bias", {c.hidden});
  fc2_w_ = table_.Add("fc2.weight", {c.features, c.hidden});
  fc2_b_ = table_.Add("fc2.bias", {c.features});
  head_w_ = table_.Add("head.weight", {c.num_classes, c.features});
  head_b_ = table_.Add("head.bias", {c.num_classes});
  params_ = Buffer<T>(table_.total());
  grads_ = Buffer<T>(table_.total());
}

template <typename T>
void Classifier<T>::InitializeRandom(uint64_t seed) {
  // A bias takes the fan-in of the weight before it in the table.
  int64_t fan_in = 1;
  const std::vector<TensorSpec>& tensors = table_.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.shape.size() == 2) fan_in = t.shape[1];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    Rng rng(seed, RngStream::kInit, i);
    T* w = params_.data() + t.offset;
    for (size_t k = 0; k < t.numel; ++k)
      w[k] = static_cast<T>((2 * rng.Uniform() - 1) * bound);
  }
}

template <typename T>
template <typename Visit>
void Classifier<T>::VisitActivations(int B, Acts& a, Visit&& visit) const {
  const ClassifierConfig& c = config_;
  const size_t tokens = static_cast<size_t>(B) * c.tokens();
  visit("patches", tokens * c.patch_features(), a.patches);
  visit("embed_pre", tokens * c.patch_dim, a.embed_pre);
  visit("embed", tokens * c.patch_dim, a.embed);
  visit("normed", tokens * c.patch_dim, a.normed);
  visit("mean", static_cast<size_t>(B), a.mean);
  visit("rstd", static_cast<size_t>(B), a.rstd);
  visit("hidden_pre", static_cast<size_t>(B) * c.hidden, a.hidden_pre);
  visit("hidden", static_cast<size_t>(B) * c.hidden, a.hidden);
  visit("features_pre", static_cast<size_t>(B) * c.features, a.features_pre);
  visit("features", static_cast<size_t>(B) * c.features, a.features);
  visit("logits", static_cast<size_t>(B) * c.num_classes, a.logits);
}

template <typename T>
void Classifier<T>::EnsureActivations(int B) {
  if (B == batch_) return;
  size_t total = 0;
  VisitActivations(B, acts_, [&](const char*, size_t n, T*&) { total += n; });
  act_buffer_ = Buffer<T>(total);
  dact_buffer_ = Buffer<T>(total);
  size_t offset = 0;
  VisitActivations(B, acts_, [&](const char*, size_t n, T*& member) {
    member = act_buffer_.data() + offset;
    offset += n;
  });
  offset = 0;
  VisitActivations(B, dacts_, [&](const char*, size_t n, T*& member) {
    member = dact_buffer_.data() + offset;
    offset += n;
  });
  batch_ = B;
}

template <typename T>
void Classifier<T>::Forward(const T* images, int B) {
  DT_CHECK(B > 0, "batch must be positive, got {}", B);
  EnsureActivations(B);
  const ClassifierConfig& c = config_;
  const int BT = B * c.tokens(), flat = c.tokens() * c.patch_dim;
  const T* p = params_.data();
  Acts& a = acts_;

  // Patch embedding: a p×p convolution of stride p is a Linear over each patch's pixels.
  cpu::Patchify(a.patches, images, B, c.channels, c.image_size, c.image_size, c.patch);
  cpu::LinearForward(a.embed_pre, a.patches, p + patch_w_, p + patch_b_, BT, c.patch_features(),
                     c.patch_dim);
  cpu::GeluForward(a.embed, a.embed_pre, static_cast<size_t>(BT) * c.patch_dim);

  // The tokens of an image side by side, normalised together.
  cpu::LayerNormForward(a.normed, a.mean, a.rstd, a.embed, B, flat, static_cast<T>(kLayerNormEps));

  // MLP to the features, then the classification head.
  cpu::LinearForward(a.hidden_pre, a.normed, p + fc1_w_, p + fc1_b_, B, flat, c.hidden);
  cpu::GeluForward(a.hidden, a.hidden_pre, static_cast<size_t>(B) * c.hidden);
  cpu::LinearForward(a.features_pre, a.hidden, p + fc2_w_, p + fc2_b_, B, c.hidden, c.features);
  cpu::GeluForward(a.features, a.features_pre, static_cast<size_t>(B) * c.features);
  cpu::LinearForward(a.logits, a.features, p + head_w_, p + head_b_, B, c.features, c.num_classes);
}

template <typename T>
void Classifier<T>::Backward(const T* dlogits) {
  DT_CHECK(batch_ > 0, "Backward before Forward");
  const ClassifierConfig& c = config_;
  const int B = batch_, BT = B * c.tokens(), flat = c.tokens() * c.patch_dim;
  const T* p = params_.data();
  T* g = grads_.data();
  const Acts& a = acts_;
  Acts& d = dacts_;
  // The ops add into activation gradients, so these start from zero.
  dact_buffer_.Zero();

  cpu::LinearBackward(d.features, g + head_w_, g + head_b_, dlogits, a.features, p + head_w_, B,
                      c.features, c.num_classes);
  cpu::GeluBackward(d.features_pre, d.features, a.features_pre,
                    static_cast<size_t>(B) * c.features);
  cpu::LinearBackward(d.hidden, g + fc2_w_, g + fc2_b_, d.features_pre, a.hidden, p + fc2_w_, B,
                      c.hidden, c.features);
  cpu::GeluBackward(d.hidden_pre, d.hidden, a.hidden_pre, static_cast<size_t>(B) * c.hidden);
  cpu::LinearBackward(d.normed, g + fc1_w_, g + fc1_b_, d.hidden_pre, a.normed, p + fc1_w_, B, flat,
                      c.hidden);
  cpu::LayerNormBackward(d.embed, d.normed, a.embed, a.mean, a.rstd, B, flat);
  cpu::GeluBackward(d.embed_pre, d.embed, a.embed_pre, static_cast<size_t>(BT) * c.patch_dim);
  // The images are data: no gradient flows past the patch embedding.
  cpu::LinearBackward<T>(nullptr, g + patch_w_, g + patch_b_, d.embed_pre, a.patches, p + patch_w_,
                         BT, c.patch_features(), c.patch_dim);
}

Status SaveClassifier(const Classifier<float>& classifier, const nlohmann::json& training,
                      const std::string& path) {
  io::SafetensorsWriter file;
  for (const TensorSpec& t : classifier.parameter_table().tensors()) {
    file.AddF32(t.name, t.shape, classifier.params() + t.offset);
  }
  file.SetMetadata("format", std::string(kFormat));
  file.SetMetadata("version", std::string(kVersion));
  file.SetMetadata("config", classifier.config().ToJson().dump());
  file.SetMetadata("training", training.dump());
  return file.WriteAtomic(path).WithContext(fmt::format("writing classifier '{}'", path));
}

namespace {

// The config of a file read as a classifier file, from its metadata.
Result<ClassifierConfig> ConfigOf(const io::SafetensorsFile& file) {
  const auto& meta = file.metadata();
  auto format = meta.find("format");
  if (format == meta.end() || format->second != kFormat) {
    return Errorf("metadata 'format' is not '{}' (not written by difftrain eval train-classifier)",
                  kFormat);
  }
  auto version = meta.find("version");
  if (version == meta.end() || version->second != kVersion) {
    return Errorf("classifier file version '{}' is not the supported '{}'",
                  version == meta.end() ? "" : version->second, kVersion);
  }
  auto config = meta.find("config");
  if (config == meta.end()) return Status::Error("metadata has no 'config'");
  const nlohmann::json json = nlohmann::json::parse(config->second, nullptr, false);
  if (json.is_discarded()) return Status::Error("metadata 'config' is not JSON");
  return ClassifierConfig::FromJson(json);
}

}  // namespace

Result<LoadedClassifier> LoadClassifier(const std::string& path) {
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  const std::string context = fmt::format("classifier '{}'", path);
  Result<ClassifierConfig> config = ConfigOf(file);
  if (!config.ok()) return config.status().WithContext(context);

  LoadedClassifier loaded{std::make_unique<Classifier<float>>(*config), nlohmann::json::object()};
  Classifier<float>& net = *loaded.classifier;
  for (const TensorSpec& t : net.parameter_table().tensors()) {
    DT_RETURN_IF_ERROR(file.CopyF32(t.name, t.shape, net.params() + t.offset));
  }
  for (const std::string& name : file.Names()) {
    if (net.parameter_table().Find(name) == nullptr) {
      return Errorf("{}: tensor '{}' is not a parameter of the architecture in its metadata",
                    context, name);
    }
  }
  auto training = file.metadata().find("training");
  if (training != file.metadata().end()) {
    loaded.training = nlohmann::json::parse(training->second, nullptr, false);
    if (loaded.training.is_discarded()) {
      return Errorf("{}: metadata 'training' is not JSON", context);
    }
  }
  return loaded;
}

#define DIFFTRAIN_INSTANTIATE(T)                                                  \
  template double SoftmaxCrossEntropy<T>(T*, const T*, const int32_t*, int, int); \
  template void Argmax<T>(int32_t*, const T*, int, int);                          \
  template class Classifier<T>;
DIFFTRAIN_INSTANTIATE(float)
DIFFTRAIN_INSTANTIATE(double)
#undef DIFFTRAIN_INSTANTIATE

}  // namespace difftrain::eval
