// The model families difftrain knows: one line each (docs/architecture.md, "Adding a model
// family").
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "model/dit/family.h"
#include "model/family/family.h"
#include "model/latte/family.h"
#include "model/train/gpu_step.h"
#include "model/unet/family.h"

namespace difftrain {

const std::vector<const ModelFamily*>& ModelFamilies() {
  static const std::vector<const ModelFamily*> families = {
      &DiTFamily(),
      &LatteFamily(),
      &UNetFamily(),
  };
  return families;
}

std::string ModelSpec::name() const {
  return config.is_object() && config.contains("name") && config["name"].is_string()
             ? config["name"].get<std::string>()
             : family;
}

bool ModelFamily::Knows(const std::string& config_name) const {
  if (config_name == custom_name()) return true;
  const std::vector<std::string> names = ConfigNames();
  return std::find(names.begin(), names.end(), config_name) != names.end();
}

Result<ModelSpec> ModelFamily::Resized(const ModelSpec& spec, int, int) const {
  const SampleSchema s = Samples(spec);
  return Errorf("the {} family runs at its model's size only ({}x{} latents)", name(), s.height,
                s.width);
}

Result<nlohmann::json> ModelFamily::DiffusersConfig(const ModelSpec&) const {
  return Errorf(
      "the {} family has no diffusers form here (the unet family's is UNet2DConditionModel): "
      "export its state dict",
      name());
}

Result<std::vector<ModelFamily::DiffusersTensor>> ModelFamily::DiffusersTensors(
    const TensorTable& global) const {
  std::vector<DiffusersTensor> tensors;
  for (const TensorSpec& t : global.tensors())
    tensors.push_back({t.name, t.name});
  return tensors;
}

Result<std::vector<std::string>> ModelFamily::SingleFileNames(
    const std::vector<std::string>&) const {
  return Errorf(
      "the {} family has no original single-file form (Stable Diffusion's UNet has): export its "
      "state dict",
      name());
}

Result<std::unique_ptr<GpuStep>> ModelFamily::CreateGpuStep(const TrainConfig&, int) const {
  return Errorf("train.device cuda: the {} family has no GPU step yet (train it on the cpu)",
                name());
}

Result<const ModelFamily*> FindModelFamily(std::string_view name) {
  std::vector<std::string> names;
  for (const ModelFamily* f : ModelFamilies()) {
    if (f->name() == name) return f;
    names.emplace_back(f->name());
  }
  return Errorf("unknown model family '{}' (known: {})", name, fmt::join(names, ", "));
}

const ModelFamily& FamilyOf(const ModelSpec& spec) {
  Result<const ModelFamily*> f = FindModelFamily(spec.family);
  DT_CHECK(f.ok(), "{}", f.status().message());
  return **f;
}

Result<const ModelFamily*> FamilyForConfigName(const std::string& config_name) {
  std::vector<std::string> names;
  for (const ModelFamily* f : ModelFamilies()) {
    if (f->Knows(config_name)) return f;
    for (const std::string& n : f->ConfigNames())
      names.push_back(n);
    names.emplace_back(f->custom_name());
  }
  return Errorf("unknown model '{}' (known: {})", config_name, fmt::join(names, ", "));
}

Result<ModelSpec> ModelSpecFromYaml(YamlFields fields) {
  std::string name = "DiT-S/2";
  if (fields.Has("name")) fields.String("name", name);
  Result<const ModelFamily*> family = FamilyForConfigName(name);
  if (!family.ok()) return fields.ErrorAt("name", family.status().message());
  return (*family)->FromYaml(fields);
}

Result<ModelSpec> ModelSpecFromJson(const std::string& family, const nlohmann::json& config) {
  DT_ASSIGN_OR_RETURN(const ModelFamily* f, FindModelFamily(family.empty() ? "dit" : family));
  return f->FromJson(config);
}

Result<ModelSpec> ModelSpecFromRequest(const ModelRequest& request) {
  DT_ASSIGN_OR_RETURN(const ModelFamily* f, FamilyForConfigName(request.name));
  return f->FromRequest(request);
}

}  // namespace difftrain
