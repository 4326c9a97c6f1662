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
