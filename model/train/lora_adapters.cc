#include "model/train/lora_adapters.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "model/cpu/low_rank.h"
#include "model/tensor/rng.h"

namespace difftrain {

Status LoraConfig::Validate() const {
  if (rank < 0) return Errorf("lora.rank must be positive (or 0: no LoRA), got {}", rank);
  if (!enabled()) {
    if (use_dora) return Status::Error("lora.use_dora: DoRA needs lora.rank (e.g. 4)");
    if (use_rslora) return Status::Error("lora.use_rslora: rsLoRA needs lora.rank (e.g. 4)");
    if (train_text_encoder) {
      return Status::Error("lora.train_text_encoder: the text encoder's adapters need lora.rank");
    }
    return Status::Ok();
  }
  if (!std::isfinite(alpha) || alpha < 0) {
    return Errorf("lora.alpha must be positive (or 0: the rank), got {}", alpha);
  }
  if (targets.empty()) return Status::Error("lora.targets: name at least one module");
  for (const std::string& t : targets) {
    if (t.empty() || t.front() == '.' || t.back() == '.') {
      return Errorf("lora.targets: '{}' is no module name (to_q, attn1.to_q, to_out.0, …)", t);
    }
  }
  if (!train_text_encoder) {
    if (!text_encoder.empty()) {
      return Errorf(
          "lora.text_encoder: '{}' is given but lora.train_text_encoder is not set (true adapts "
          "the text encoder too)",
          text_encoder);
    }
    return Status::Ok();
  }
  if (text_encoder_targets.empty()) {
    return Status::Error("lora.text_encoder_targets: name at least one module (q_proj, …)");
  }
  for (const std::string& t : text_encoder_targets) {
    if (t.empty() || t.front() == '.' || t.back() == '.') {
      return Errorf(
          "lora.text_encoder_targets: '{}' is no module name (q_proj, k_proj, v_proj, out_proj, "
          "fc1, fc2)",
          t);
    }
  }
  return Status::Ok();
}

nlohmann::json LoraConfig::ToJson() const {
  nlohmann::json json = {{"rank", rank}, {"alpha", alpha}, {"targets", targets}};
  // Only when set: a plain LoRA's JSON (a checkpoint's "lora" metadata) stays as it was.
  if (use_dora) json["use_dora"] = true;
  if (use_rslora) json["use_rslora"] = true;
  if (train_text_encoder) {
    json["train_text_encoder"] = true;
    json["text_encoder_targets"] = text_encoder_targets;
    json["text_encoder"] = text_encoder;
  }
  return json;
}

Result<LoraConfig> LoraConfig::FromJson(const nlohmann::json& json) {
  LoraConfig c;
  try {
    c.rank = json.at("rank").get<int>();
    c.alpha = json.at("alpha").get<double>();
    c.targets = json.at("targets").get<std::vector<std::string>>();
    c.use_dora = json.value("use_dora", false);
    c.use_rslora = json.value("use_rslora", false);
    c.train_text_encoder = json.value("train_text_encoder", false);
    if (c.train_text_encoder) {
      c.text_encoder_targets = json.at("text_encoder_targets").get<std::vector<std::string>>();
      c.text_encoder = json.value("text_encoder", std::string());
    }
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed LoRA config {}: {}", json.dump(), e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// The modules of `table` that `targets` adapt (of part `part`, named prefix + M); `what` and
// `model` name the targets' setting and the model in the error.
Result<std::vector<LoraModule>> MatchModules(const std::vector<std::string>& targets,
                                             const TensorTable& table, int part,
                                             const std::string& prefix, const char* what,
                                             const char* model) {
  std::vector<LoraModule> modules;
  std::vector<std::string> seen;  // a few of the model's modules, for the error
  for (const TensorSpec& t : table.tensors()) {
    if (!t.name.ends_with(".weight") || t.shape.size() < 2) continue;
    const std::string name = t.name.substr(0, t.name.size() - 7);
    if (seen.size() < 8) seen.push_back(name);
    const bool targeted = std::any_of(
        targets.begin(), targets.end(),
        [&](const std::string& target) { return name == target || name.ends_with("." + target); });
    if (!targeted) continue;
    LoraModule m;
    m.name = prefix + name;
    m.part = part;
    m.shape = t.shape;
    m.weight = t.offset;
    m.out = t.shape[0];
    m.in = static_cast<int64_t>(t.numel) / m.out;
    modules.push_back(std::move(m));
  }
  if (modules.empty()) {
    return Errorf(
        "{} [{}] match no module of {} (a target names a module or the end of its dotted name; "
        "its weights of two or more dimensions are of modules such as {})",
        what, fmt::join(targets, ", "), model, fmt::join(seen, ", "));
  }
  return modules;
}

}  // namespace

Result<std::vector<LoraModule>> LoraModulesOf(const LoraConfig& config, const TensorTable& table) {
  return MatchModules(config.targets, table, 0, "", "lora.targets", "the model");
}

Result<std::vector<LoraModule>> TextLoraModulesOf(const LoraConfig& config,
                                                  const TensorTable& table) {
  return MatchModules(config.text_encoder_targets, table, 1, kLoraTextPrefix,
                      "lora.text_encoder_targets", "the text encoder");
}

namespace {

LoraElements CountElements(const LoraConfig& config, const std::vector<LoraModule>& modules,
                           const TensorTable& table) {
  LoraElements n;
  for (const LoraModule& m : modules) {
    n.adapters += static_cast<size_t>(config.rank * (m.in + m.out) + (config.use_dora ? m.out : 0));
    n.frozen += static_cast<size_t>(m.in * m.out);
  }
  for (const TensorSpec& t : table.tensors())
    if (t.shape.size() < 2) n.vectors += t.numel;
  return n;
}

}  // namespace

Result<LoraElements> CountLoraElements(const LoraConfig& config, const TensorTable& table) {
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, LoraModulesOf(config, table));
  return CountElements(config, modules, table);
}

Result<LoraElements> CountTextLoraElements(const LoraConfig& config,
                                           const TensorTable& text_table) {
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, TextLoraModulesOf(config, text_table));
  return CountElements(config, modules, text_table);
}

Result<LoraAdapters> LoraAdapters::Create(const LoraConfig& config, const TensorTable& table,
                                          const TensorTable* text_table) {
  DT_RETURN_IF_ERROR(config.Validate());
  if (!config.enabled()) return Status::Error("LoRA adapters need lora.rank > 0");
  DT_CHECK(config.train_text_encoder == (text_table != nullptr),
           "lora.train_text_encoder {} with{} the text encoder's table", config.train_text_encoder,
           text_table ? "" : "out");
  DT_ASSIGN_OR_RETURN(std::vector<LoraModule> modules, LoraModulesOf(config, table));
  if (text_table != nullptr) {
    DT_ASSIGN_OR_RETURN(std::vector<LoraModule> text, TextLoraModulesOf(config, *text_table));
    modules.insert(modules.end(), text.begin(), text.end());
  }
  return Make(config, std::move(modules));
}

Result<LoraAdapters> LoraAdapters::OfTextEncoder(const LoraConfig& config,
                                                 const TensorTable& text_table) {
  DT_RETURN_IF_ERROR(config.Validate());
  if (!config.enabled() || !config.train_text_encoder) {
    return Status::Error("the text encoder's LoRA adapters need lora.train_text_encoder");
  }
  DT_ASSIGN_OR_RETURN(std::vector<LoraModule> modules, TextLoraModulesOf(config, text_table));
  return Make(config, std::move(modules));
}

LoraAdapters LoraAdapters::Make(const LoraConfig& config, std::vector<LoraModule> modules) {
  LoraAdapters adapters;
  adapters.config_ = config;
  adapters.modules_ = std::move(modules);
  size_t base = 0;
  for (LoraModule& m : adapters.modules_) {
    const int64_t r = config.rank;
    // peft's shapes: a Linear's A [r, in] and B [out, r]; a convolution's A has its kernel,
    // [r, in, kh, kw], and B is a 1×1 convolution, [out, r, 1, 1].
    std::vector<int64_t> a_shape = m.shape, b_shape(m.shape.size(), 1);
    a_shape[0] = r;
    b_shape[0] = m.out;
    b_shape[1] = r;
    m.a = adapters.table_.Add(m.name + ".lora_A.weight", a_shape);
    m.b = adapters.table_.Add(m.name + ".lora_B.weight", b_shape);
    if (config.use_dora) {
      // peft 0.10's: a Linear's norms [out]; a convolution's keep their dimensions, [1, out, 1, 1].
      std::vector<int64_t> m_shape = {m.out};
      if (m.shape.size() == 4) m_shape = {1, m.out, 1, 1};
      m.magnitude = adapters.table_.Add(m.name + ".lora_magnitude_vector", m_shape);
    }
    m.base = base;
    base += static_cast<size_t>(m.out * m.in);
  }
  adapters.params_ = Buffer<float>(adapters.table_.total());
  adapters.grads_ = Buffer<float>(adapters.table_.total());
  adapters.base_ = Buffer<float>(base);
  return adapters;
}

void LoraAdapters::Initialize(uint64_t seed) {
  std::memset(params_.data(), 0, params_.bytes());
  for (size_t k = 0; k < modules_.size(); ++k) {
    const LoraModule& m = modules_[k];
    Rng rng(seed, RngStream::kLora, k);
    float* a = params_.data() + m.a;
    for (int64_t i = 0; i < config_.rank * m.in; ++i)
      a[i] = static_cast<float>(rng.Normal() / config_.rank);
  }
  SetMagnitudesToNorms();
}

void LoraAdapters::InitializeRandom(uint64_t seed) {
  Initialize(seed);
  for (size_t k = 0; k < modules_.size(); ++k) {
    const LoraModule& m = modules_[k];
    Rng rng(seed, RngStream::kLora, modules_.size() + k);
    float* b = params_.data() + m.b;
    for (int64_t i = 0; i < m.out * config_.rank; ++i)
      b[i] = static_cast<float>(rng.Normal() / std::sqrt(double(m.out)));
  }
  SetMagnitudesToNorms();
  if (!config_.use_dora) return;
  for (size_t k = 0; k < modules_.size(); ++k) {
    const LoraModule& m = modules_[k];
    Rng rng(seed, RngStream::kLora, 2 * modules_.size() + k);
    float* magnitude = params_.data() + m.magnitude;
    for (int64_t o = 0; o < m.out; ++o)
      magnitude[o] = static_cast<float>(magnitude[o] * (1 + 0.1 * rng.Normal()));
  }
}

void LoraAdapters::SetMagnitudesToNorms() {
  if (!config_.use_dora) return;
  const float s = static_cast<float>(scale());
  for (const LoraModule& m : modules_) {
    cpu::DoraNorms(params_.data() + m.magnitude, base_.data() + m.base, params_.data() + m.a,
                   params_.data() + m.b, static_cast<int>(m.out), config_.rank,
                   static_cast<int>(m.in), s);
  }
}

void LoraAdapters::SetBase(const float* model_params, const float* text_params) {
  DT_CHECK(adapts_text_encoder() || text_params == nullptr,
           "LoraAdapters::SetBase: the text encoder's weights are given but not adapted");
  for (const LoraModule& m : modules_) {
    const float* arena = m.part == 0 ? model_params : text_params;
    if (arena == nullptr) continue;
    const float* w = arena + m.weight;
    std::memcpy(base_.data() + m.base, w, m.out * m.in * sizeof(float));
  }
}

void LoraAdapters::Fuse(const LoraModule& m, const float* adapters, float* w) const {
  const float s = static_cast<float>(scale());
  const int out = static_cast<int>(m.out), in = static_cast<int>(m.in);
  if (config_.use_dora) {
    cpu::DoraForward(w, base_.data() + m.base, adapters + m.a, adapters + m.b,
                     adapters + m.magnitude, out, config_.rank, in, s);
  } else {
    cpu::LowRankForward(w, base_.data() + m.base, adapters + m.a, adapters + m.b, out, config_.rank,
                        in, s);
  }
}

void LoraAdapters::Apply(const float* adapters, float* model_params, float* text_params) const {
  for (const LoraModule& m : modules_) {
    float* arena = m.part == 0 ? model_params : text_params;
    if (arena != nullptr) Fuse(m, adapters, arena + m.weight);
  }
}

void LoraAdapters::ApplyToBase(const float* adapters, float* out) const {
  for (const LoraModule& m : modules_) {
    if (m.part == 0) Fuse(m, adapters, out + m.base);
  }
}

size_t LoraAdapters::model_base_size() const {
  size_t end = 0;
  for (const LoraModule& m : modules_) {
    if (m.part == 0) end = std::max(end, m.base + static_cast<size_t>(m.out * m.in));
  }
  return end;
}

void LoraAdapters::Gradients(const float* model_grads, const float* text_grads) {
  DT_CHECK(adapts_text_encoder() == (text_grads != nullptr),
           "LoraAdapters::Gradients: the text encoder's gradients are {}",
           text_grads ? "given but not adapted" : "adapted but not given");
  std::memset(grads_.data(), 0, grads_.bytes());
  const float s = static_cast<float>(scale());
  for (const LoraModule& m : modules_) {
    const float* dw = (m.part == 0 ? model_grads : text_grads) + m.weight;
    if (config_.use_dora) {
      cpu::DoraBackward(grads_.data() + m.a, grads_.data() + m.b, grads_.data() + m.magnitude, dw,
                        base_.data() + m.base, params_.data() + m.a, params_.data() + m.b,
                        params_.data() + m.magnitude, static_cast<int>(m.out), config_.rank,
                        static_cast<int>(m.in), s);
      continue;
    }
    cpu::LowRankBackward(grads_.data() + m.a, grads_.data() + m.b, dw, params_.data() + m.a,
                         params_.data() + m.b, static_cast<int>(m.out), config_.rank,
                         static_cast<int>(m.in), s);
  }
}

}  // namespace difftrain
