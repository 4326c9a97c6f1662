#include "model/io/lora.h"

#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "model/io/safetensors.h"

namespace difftrain::io {
namespace {

// One adapted module's tensors, by their keys in the file.
struct LoraModule {
  std::string down, up, alpha;
};

enum class Part { kDown, kUp, kAlpha };

// The suffixes of the diffusers and peft forms, and the part each names.
constexpr std::pair<const char*, Part> kSuffixes[] = {
    {".lora_A.weight", Part::kDown},
    {".lora_B.weight", Part::kUp},
    {".lora.down.weight", Part::kDown},
    {".lora.up.weight", Part::kUp},
    {".lora_linear_layer.down.weight", Part::kDown},
    {".lora_linear_layer.up.weight", Part::kUp},
    {".alpha", Part::kAlpha},
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// An attention processor's name (…attn1.processor.to_q_lora) as its module's (…attn1.to_q).
std::string ProcessorModule(std::string name) {
  const std::string processor = ".processor.";
  const size_t at = name.find(processor);
  if (at == std::string::npos) return name;
  name.replace(at, processor.size(), ".");
  name.resize(name.size() - std::string("_lora").size());
  if (EndsWith(name, ".to_out")) name += ".0";
  return name;
}

// The module and part key `key` names, or an error naming it. `kohya` maps a kohya base name
// (lora_unet_…) to its module.
Result<std::pair<std::string, Part>> Classify(
    const std::string& key, const std::unordered_map<std::string, std::string>& kohya) {
  for (const char* text :
       {"lora_te_", "lora_te1_", "lora_te2_", "text_encoder.", "text_encoder_2."}) {
    if (key.starts_with(text)) {
      return Errorf(
          "'{}' adapts the text encoder, and difftrain applies a LoRA to the UNet only (use a "
          "LoRA without its text encoder part)",
          key);
    }
  }
  if (key.starts_with("lora_unet_")) {
    const size_t dot = key.find('.');
    const std::string base = key.substr(0, dot),
                      suffix = dot == std::string::npos ? "" : key.substr(dot);
    const std::optional<Part> part = suffix == ".lora_down.weight" ? std::optional(Part::kDown)
                                     : suffix == ".lora_up.weight" ? std::optional(Part::kUp)
                                     : suffix == ".alpha"          ? std::optional(Part::kAlpha)
                                                                   : std::nullopt;
    if (!part)
      return Errorf("'{}': not a kohya LoRA key (lora_down.weight, lora_up.weight, alpha)", key);
    const auto module = kohya.find(base);
    if (module == kohya.end()) {
      return Errorf(
          "'{}': the model has no module '{}' (kohya's name of a diffusers module, '.' as '_')",
          key, base.substr(std::string("lora_unet_").size()));
    }
    return std::pair{module->second, *part};
  }
  std::string name = key.starts_with("unet.") ? key.substr(5) : key;
  for (const auto& [suffix, part] : kSuffixes) {
    if (EndsWith(name, suffix))
      return std::pair{name.substr(0, name.size() - std::string(suffix).size()), part};
  }
  // The attention processors' form: …processor.to_q_lora.down.weight.
  for (const auto& [suffix, part] :
       {std::pair{".down.weight", Part::kDown}, {".up.weight", Part::kUp}}) {
    if (EndsWith(name, suffix) && name.find(".processor.") != std::string::npos) {
      const std::string module = name.substr(0, name.size() - std::string(suffix).size());
      if (EndsWith(module, "_lora")) return std::pair{ProcessorModule(module), part};
    }
  }
  return Errorf(
      "'{}': not a LoRA key difftrain reads (MODULE.lora_A.weight/lora_B.weight, "
      "MODULE.lora.down.weight/lora.up.weight, kohya's lora_unet_….lora_down.weight)",
      key);
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

}  // namespace

Result<LoraFused> FuseLora(const std::string& path, double scale, const TensorTable& table,
                           float* params) {
  if (!std::isfinite(scale)) return Errorf("the LoRA scale must be finite, got {}", scale);
  DT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  const auto error = [&](const std::string& message) {
    return Errorf("LoRA file '{}': {}", path, message);
  };
  std::unordered_map<std::string, std::string> kohya;
  for (const TensorSpec& t : table.tensors()) {
    if (!EndsWith(t.name, ".weight")) continue;
    std::string module = t.name.substr(0, t.name.size() - 7), flat = module;
    for (char& c : flat)
      if (c == '.') c = '_';
    kohya.emplace("lora_unet_" + flat, module);
  }
  std::map<std::string, LoraModule> modules;  // in name order: a deterministic fusing order
  for (const std::string& key : file.Names()) {
    Result<std::pair<std::string, Part>> named = Classify(key, kohya);
    if (!named.ok()) return error(named.status().message());
    LoraModule& m = modules[named->first];
    std::string& slot = named->second == Part::kDown ? m.down
                        : named->second == Part::kUp ? m.up
                                                     : m.alpha;
    if (!slot.empty()) return error(fmt::format("'{}' and '{}' name the same tensor", slot, key));
    slot = key;
  }
  if (modules.empty()) return error("holds no tensors");
  LoraFused fused;
  for (const auto& [module, m] : modules) {
    if (m.down.empty() || m.up.empty()) {
      return error(fmt::format("module '{}' has {} without {}", module,
                               m.down.empty() ? m.up : m.down,
                               m.down.empty() ? "its down (A) matrix" : "its up (B) matrix"));
    }
    const TensorSpec* w = table.Find(module + ".weight");
    if (w == nullptr) {
      return error(fmt::format("'{}': the model has no module '{}' (no parameter '{}.weight')",
                               m.down, module, module));
    }
    const TensorView& down = *file.Find(m.down);
    const TensorView& up = *file.Find(m.up);
    const int64_t rank = down.shape.empty() ? 0 : down.shape[0];
    const int64_t out = w->shape[0],
                  in = static_cast<int64_t>(w->numel) / std::max<int64_t>(out, 1);
    if (rank < 1 || Numel(down.shape) != rank * in || up.shape.size() < 2 || up.shape[0] != out ||
        up.shape[1] != rank || Numel(up.shape) != out * rank) {
      return error(fmt::format("module '{}': down {} and up {} do not make its weight {}", module,
                               ShapeString(down.shape), ShapeString(up.shape),
                               ShapeString(w->shape)));
    }
    std::vector<float> a(rank * in), b(out * rank);
    DT_RETURN_IF_ERROR(file.CopyAsF32(m.down, down.shape, a.data()));
    DT_RETURN_IF_ERROR(file.CopyAsF32(m.up, up.shape, b.data()));
    double alpha = static_cast<double>(rank);
    if (!m.alpha.empty()) {
      const TensorView& view = *file.Find(m.alpha);
      if (Numel(view.shape) != 1) {
        return error(
            fmt::format("'{}' is {}, expected one number", m.alpha, ShapeString(view.shape)));
      }
      float value = 0;
      DT_RETURN_IF_ERROR(file.CopyAsF32(m.alpha, view.shape, &value));
      alpha = value;
    }
    const double factor = scale * alpha / static_cast<double>(rank);
    float* W = params + w->offset;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t j = 0; j < in; ++j) {
        double delta = 0;
        for (int64_t r = 0; r < rank; ++r)
          delta += double(b[o * rank + r]) * a[r * in + j];
        W[o * in + j] = static_cast<float>(W[o * in + j] + factor * delta);
      }
    }
    ++fused.modules;
    fused.rank = std::max<int>(fused.rank, static_cast<int>(rank));
  }
  return fused;
}

}  // namespace difftrain::io
