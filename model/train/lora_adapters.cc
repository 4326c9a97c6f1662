#include "model/train/lora_adapters.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/cpu/low_rank.h"
#include "model/tensor/rng.h"

namespace difftrain {

Status LoraConfig::Validate() const {
  if (rank < 0) return Errorf("lora.rank must be positive (or 0: no LoRA), got {}", rank);
  if (!enabled()) {
    if (use_dora) return Status::Error("lora.use_dora: DoRA needs lora.rank (e.g. 4)");
    if (use_rslora) return Status::Error("lora.use_rslora: rsLoRA needs lora.rank (e.g. 4)");
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
  return Status::Ok();
}

nlohmann::json LoraConfig::ToJson() const {
  nlohmann::json json = {{"rank", rank}, {"alpha", alpha}, {"targets", targets}};
  // Only when set: a plain LoRA's JSON (a checkpoint's "lora" metadata) stays as it was.
  if (use_dora) json["use_dora"] = true;
  if (use_rslora) json["use_rslora"] = true;
  return json;
}

Result<std::vector<LoraModule>> LoraModulesOf(const LoraConfig& config, const TensorTable& table) {
  std::vector<LoraModule> modules;
  std::vector<std::string> seen;  // a few of the model's modules, for the error
  for (const TensorSpec& t : table.tensors()) {
    if (!t.name.ends_with(".weight") || t.shape.size() < 2) continue;
    const std::string name = t.name.substr(0, t.name.size() - 7);
    if (seen.size() < 8) seen.push_back(name);
    const bool targeted = std::any_of(
        config.targets.begin(), config.targets.end(),
        [&](const std::string& target) { return name == target || name.ends_with("." + target); });
    if (!targeted) continue;
    LoraModule m;
    m.name = name;
    m.shape = t.shape;
    m.weight = t.offset;
    m.out = t.shape[0];
    m.in = static_cast<int64_t>(t.numel) / m.out;
    modules.push_back(std::move(m));
  }
  if (modules.empty()) {
    return Errorf(
        "lora.targets [{}] match no module of the model (a target names a module or the end of "
        "its dotted name; the model's weights of two or more dimensions are of modules such as "
        "{})",
        fmt::join(config.targets, ", "), fmt::join(seen, ", "));
  }
  return modules;
}

Result<LoraElements> CountLoraElements(const LoraConfig& config, const TensorTable& table) {
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, LoraModulesOf(config, table));
  LoraElements n;
  for (const LoraModule& m : modules) {
    n.adapters += static_cast<size_t>(config.rank * (m.in + m.out) + (config.use_dora ? m.out : 0));
    n.frozen += static_cast<size_t>(m.in * m.out);
  }
  for (const TensorSpec& t : table.tensors())
    if (t.shape.size() < 2) n.vectors += t.numel;
  return n;
}

Result<LoraAdapters> LoraAdapters::Create(const LoraConfig& config, const TensorTable& table) {
  DT_RETURN_IF_ERROR(config.Validate());
  if (!config.enabled()) return Status::Error("LoRA adapters need lora.rank > 0");
  LoraAdapters adapters;
  adapters.config_ = config;
  DT_ASSIGN_OR_RETURN(adapters.modules_, LoraModulesOf(config, table));
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

void LoraAdapters::SetBase(const float* model_params) {
  for (const LoraModule& m : modules_) {
    std::memcpy(base_.data() + m.base, model_params + m.weight, m.out * m.in * sizeof(float));
  }
}

void LoraAdapters::Apply(const float* adapters, float* model_params) const {
  const float s = static_cast<float>(scale());
  for (const LoraModule& m : modules_) {
    float* w = model_params + m.weight;
    const int out = static_cast<int>(m.out), in = static_cast<int>(m.in);
    if (config_.use_dora) {
      cpu::DoraForward(w, base_.data() + m.base, adapters + m.a, adapters + m.b,
                       adapters + m.magnitude, out, config_.rank, in, s);
    } else {
      cpu::LowRankForward(w, base_.data() + m.base, adapters + m.a, adapters + m.b, out,
                          config_.rank, in, s);
    }
  }
}

void LoraAdapters::Gradients(const float* model_grads) {
  std::memset(grads_.data(), 0, grads_.bytes());
  const float s = static_cast<float>(scale());
  for (const LoraModule& m : modules_) {
    if (config_.use_dora) {
      cpu::DoraBackward(grads_.data() + m.a, grads_.data() + m.b, grads_.data() + m.magnitude,
                        model_grads + m.weight, base_.data() + m.base, params_.data() + m.a,
                        params_.data() + m.b, params_.data() + m.magnitude, static_cast<int>(m.out),
                        config_.rank, static_cast<int>(m.in), s);
      continue;
    }
    cpu::LowRankBackward(grads_.data() + m.a, grads_.data() + m.b, model_grads + m.weight,
                         params_.data() + m.a, params_.data() + m.b, static_cast<int>(m.out),
                         config_.rank, static_cast<int>(m.in), s);
  }
}

}  // namespace difftrain
