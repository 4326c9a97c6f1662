#include "model/io/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "model/cpu/low_rank.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"

namespace difftrain::io {
namespace {

enum class Part { kDown, kUp, kAlpha, kMagnitude };

// What a key names: its component, the module it adapts there, and which tensor it is.
struct LoraKey {
  std::string component, module;
  Part part;
};

// One adapted module's tensors, by their keys in the file.
struct LoraModule {
  std::string down, up, alpha, magnitude;
};

// Each component's key prefixes: diffusers' and kohya's.
struct Component {
  const char* name;
  const char* prefix;
  std::vector<const char*> kohya;
};
const std::vector<Component>& Components() {
  static const std::vector<Component> components = {
      {kLoraUNet, "unet.", {"lora_unet_"}},
      {kLoraTextEncoder, "text_encoder.", {"lora_te_", "lora_te1_"}},
      {kLoraTextEncoder2, "text_encoder_2.", {"lora_te2_"}},
  };
  return components;
}

// The suffixes of the diffusers and peft forms, and the part each names.
constexpr std::pair<const char*, Part> kSuffixes[] = {
    {".lora_A.weight", Part::kDown},
    {".lora_B.weight", Part::kUp},
    {".lora.down.weight", Part::kDown},
    {".lora.up.weight", Part::kUp},
    {".lora_linear_layer.down.weight", Part::kDown},
    {".lora_linear_layer.up.weight", Part::kUp},
    {".alpha", Part::kAlpha},
    {".lora_magnitude_vector", Part::kMagnitude},
};

// An attention processor's name as its module's: the UNet's …attn1.processor.to_q_lora is
// …attn1.to_q (to_out_lora: to_out.0), the text encoder's …self_attn.to_q_lora …self_attn.q_proj
// (to_out_lora: out_proj). Empty when `name` is not one.
std::string ProcessorModule(const std::string& component, const std::string& name) {
  static const std::map<std::string, std::pair<std::string, std::string>> kProjections = {
      {"to_q_lora", {"to_q", "q_proj"}},
      {"to_k_lora", {"to_k", "k_proj"}},
      {"to_v_lora", {"to_v", "v_proj"}},
      {"to_out_lora", {"to_out.0", "out_proj"}}};
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return "";
  const auto projection = kProjections.find(name.substr(dot + 1));
  if (projection == kProjections.end()) return "";
  std::string parent = name.substr(0, dot);
  if (component == kLoraUNet) {
    if (!parent.ends_with(".processor")) return "";
    parent.resize(parent.size() - std::string(".processor").size());
    return parent + "." + projection->second.first;
  }
  return parent + "." + projection->second.second;
}

// What `key` names; `kohya` maps each target's kohya base names (lora_unet_…) to their modules.
Result<LoraKey> Classify(const std::string& key,
                         const std::unordered_map<std::string, std::string>& kohya) {
  for (const Component& c : Components()) {
    for (const char* prefix : c.kohya) {
      if (!key.starts_with(prefix)) continue;
      const size_t dot = key.find('.');
      const std::string base = key.substr(0, dot);
      const std::string suffix = dot == std::string::npos ? "" : key.substr(dot);
      const std::optional<Part> part = suffix == ".lora_down.weight" ? std::optional(Part::kDown)
                                       : suffix == ".lora_up.weight" ? std::optional(Part::kUp)
                                       : suffix == ".alpha"          ? std::optional(Part::kAlpha)
                                                                     : std::nullopt;
      if (!part) {
        return Errorf("'{}': not a kohya LoRA key (lora_down.weight, lora_up.weight, alpha)", key);
      }
      const auto module = kohya.find(base);
      return LoraKey{c.name, module == kohya.end() ? base : module->second, *part};
    }
  }
  std::string component = kLoraUNet, name = key;
  for (const Component& c : Components()) {
    if (key.starts_with(c.prefix)) {
      component = c.name;
      name = key.substr(std::string(c.prefix).size());
    }
  }
  for (const auto& [suffix, part] : kSuffixes) {
    if (name.ends_with(suffix))
      return LoraKey{component, name.substr(0, name.size() - std::string(suffix).size()), part};
  }
  // The attention processors' form: ….to_q_lora.down.weight.
  for (const auto& [suffix, part] :
       {std::pair{".down.weight", Part::kDown}, std::pair{".up.weight", Part::kUp}}) {
    if (!name.ends_with(suffix)) continue;
    const std::string module =
        ProcessorModule(component, name.substr(0, name.size() - std::string(suffix).size()));
    if (!module.empty()) return LoraKey{component, module, part};
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

// W += factor · up·down over `out` rows of `in` (the flattened input and kernel), in float32 on
// BLAS as peft's merge computes it (a float64 loop took 28 times as long: docs/benchmarks.md):
// the low-rank weight LoRA training computes (model/cpu/low_rank.h), in place.
void AddProduct(float* W, const std::vector<float>& up, const std::vector<float>& down, int64_t out,
                int64_t rank, int64_t in, double factor) {
  cpu::LowRankForward(W, W, down.data(), up.data(), static_cast<int>(out), static_cast<int>(rank),
                      static_cast<int>(in), static_cast<float>(factor));
}

}  // namespace

Result<LoraFused> FuseLora(const std::string& path, double scale,
                           const std::vector<LoraTarget>& targets,
                           const std::vector<std::string>& skipped, const std::string& elsewhere) {
  if (!std::isfinite(scale)) return Errorf("the LoRA scale must be finite, got {}", scale);
  DT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  const auto error = [&](const std::string& message) {
    return Errorf("LoRA file '{}': {}", path, message);
  };
  // Each target's kohya names: lora_unet_ (lora_te_, lora_te1_, lora_te2_) + the module, '.'
  // as '_'; a UNet's modules also by their names in SDXL's original layout (kohya's SDXL LoRAs:
  // lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q, …_in_layers_2).
  std::unordered_map<std::string, std::string> kohya;
  const auto flat = [](std::string name) {
    std::replace(name.begin(), name.end(), '.', '_');
    return name;
  };
  for (const LoraTarget& t : targets) {
    for (const Component& c : Components()) {
      if (c.name != t.component) continue;
      std::vector<std::string> names;
      for (const TensorSpec& spec : t.table->tensors())
        names.push_back(spec.name);
      const std::vector<std::optional<std::string>> sgm =
          c.name == kLoraUNet ? SgmUNetNames(names)
                              : std::vector<std::optional<std::string>>(names.size());
      for (size_t i = 0; i < names.size(); ++i) {
        if (!names[i].ends_with(".weight")) continue;
        const std::string module = names[i].substr(0, names[i].size() - 7);
        for (const char* prefix : c.kohya) {
          kohya.emplace(prefix + flat(module), module);
          if (sgm[i] && sgm[i]->ends_with(".weight"))
            kohya.emplace(prefix + flat(sgm[i]->substr(0, sgm[i]->size() - 7)), module);
        }
      }
    }
  }
  // Per target, its modules in name order (a deterministic fusing order).
  std::map<std::string, std::map<std::string, LoraModule>> modules;
  for (const std::string& key : file.Names()) {
    Result<LoraKey> named = Classify(key, kohya);
    if (!named.ok()) return error(named.status().message());
    if (std::find(skipped.begin(), skipped.end(), named->component) != skipped.end()) continue;
    const bool targeted = std::any_of(targets.begin(), targets.end(), [&](const LoraTarget& t) {
      return t.component == named->component;
    });
    if (!targeted) {
      return error(fmt::format("'{}' adapts the {}, which {}", key,
                               named->component == kLoraUNet ? "UNet" : named->component,
                               elsewhere.empty() ? "is not fused here" : elsewhere));
    }
    LoraModule& m = modules[named->component][named->module];
    std::string& slot = named->part == Part::kDown        ? m.down
                        : named->part == Part::kUp        ? m.up
                        : named->part == Part::kMagnitude ? m.magnitude
                                                          : m.alpha;
    if (!slot.empty()) return error(fmt::format("'{}' and '{}' name the same tensor", slot, key));
    slot = key;
  }
  if (file.Names().empty()) return error("holds no tensors");
  LoraFused fused;
  for (const LoraTarget& target : targets) {
    for (const auto& [module, m] : modules[target.component]) {
      if (m.down.empty() || m.up.empty()) {
        const std::string& held = !m.down.empty()    ? m.down
                                  : !m.up.empty()    ? m.up
                                  : !m.alpha.empty() ? m.alpha
                                                     : m.magnitude;
        return error(fmt::format("module '{}' has '{}' without {}", module, held,
                                 m.down.empty() ? "its down (A) matrix" : "its up (B) matrix"));
      }
      const TensorSpec* w = target.table->Find(module + ".weight");
      if (w == nullptr) {
        return error(fmt::format("'{}': the {} has no module '{}' (no parameter '{}.weight')",
                                 m.down, target.component, module, module));
      }
      const TensorView& down = *file.Find(m.down);
      const TensorView& up = *file.Find(m.up);
      const int64_t rank = down.shape.empty() ? 0 : down.shape[0];
      const int64_t out = w->shape[0];
      const int64_t in = static_cast<int64_t>(w->numel) / std::max<int64_t>(out, 1);
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
      std::vector<float> magnitude;
      if (!m.magnitude.empty()) {
        const TensorView& view = *file.Find(m.magnitude);
        if (Numel(view.shape) != out) {
          return error(fmt::format("'{}' is {}, expected one magnitude per output row of '{}' ({})",
                                   m.magnitude, ShapeString(view.shape), module, out));
        }
        magnitude.resize(out);
        DT_RETURN_IF_ERROR(file.CopyAsF32(m.magnitude, view.shape, magnitude.data()));
      }
      float* weight = target.params + w->offset;
      if (magnitude.empty()) {
        AddProduct(weight, b, a, out, rank, in, scale * alpha / rank);
      } else {
        // DoRA, as peft merges it and training computes it: each row of
        // W0 + scale·(alpha/rank)·up·down scaled to its magnitude.
        cpu::DoraForward(weight, weight, a.data(), b.data(), magnitude.data(),
                         static_cast<int>(out), static_cast<int>(rank), static_cast<int>(in),
                         static_cast<float>(scale * alpha / rank));
      }
      ++fused.modules;
      fused.rank = std::max<int>(fused.rank, static_cast<int>(rank));
    }
  }
  return fused;
}

}  // namespace difftrain::io
