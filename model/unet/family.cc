#include "model/unet/family.h"

#include <yaml-cpp/yaml.h>

#include "common/check.h"
#include "common/json_read.h"
#include "model/io/ldm_checkpoint.h"
#include "model/train/gpu_step.h"
#include "model/unet/unet.h"
#ifdef DIFFTRAIN_HAVE_CUDA
#include "model/unet/cuda/gpu_step.h"
#endif

namespace difftrain {
namespace {

constexpr const char* kCustom = "unet";

// A YAML model section as JSON: scalars become numbers, booleans or strings, as diffusers'
// config.json would hold them.
nlohmann::json ToJson(const YAML::Node& node) {
  if (node.IsSequence()) {
    nlohmann::json a = nlohmann::json::array();
    for (const YAML::Node& item : node)
      a.push_back(ToJson(item));
    return a;
  }
  if (node.IsMap()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& kv : node)
      o[kv.first.as<std::string>()] = ToJson(kv.second);
    return o;
  }
  if (node.IsNull()) return nullptr;
  const std::string s = node.as<std::string>();
  if (node.Tag() != "!") {  // unquoted: a number or a boolean where it reads as one
    int64_t i;
    double d;
    bool b;
    if (YAML::convert<int64_t>::decode(node, i)) return i;
    if (YAML::convert<double>::decode(node, d)) return d;
    if (YAML::convert<bool>::decode(node, b)) return b;
  }
  return s;
}

// Overrides (the job's keys or the command line's) on top of a named or custom config.
Result<ModelSpec> Build(const std::string& name, const nlohmann::json& overrides) {
  nlohmann::json config;
  if (name == kCustom) {
    for (const char* required : {"block_out_channels", "down_block_types", "up_block_types"}) {
      if (!overrides.contains(required))
        return Errorf("model.{}: required when name is {}", required, kCustom);
    }
    config = UNetConfig().ToJson();
  } else {
    DT_ASSIGN_OR_RETURN(UNetConfig named, UNetConfigByName(name));
    config = named.ToJson();
  }
  for (const auto& [key, value] : overrides.items())
    config[key] = value;
  if (name != kCustom && !overrides.empty()) config["name"] = kCustom;
  DT_ASSIGN_OR_RETURN(UNetConfig c, UNetConfig::FromJson(config));
  DT_RETURN_IF_ERROR(c.Validate());
  return UNetSpec(c);
}

class UNetFamilyImpl final : public ModelFamily {
 public:
  std::string_view name() const override { return "unet"; }
  std::vector<std::string> ConfigNames() const override { return UNetConfigNames(); }
  std::string_view custom_name() const override { return kCustom; }

  Result<ModelSpec> FromYaml(YamlFields& fields) const override {
    std::string name;
    fields.String("name", name);
    nlohmann::json overrides = ToJson(fields.TakeAll());
    overrides.erase("name");
    Result<ModelSpec> spec = Build(name, overrides);
    if (!spec.ok()) return fields.ErrorAt("name", spec.status().message());
    return spec;
  }

  Result<ModelSpec> FromRequest(const ModelRequest& r) const override {
    nlohmann::json overrides = r.overrides;
    if (r.input_size) overrides["sample_size"] = *r.input_size;
    return Build(r.name, overrides);
  }

  Result<ModelSpec> FromJson(const nlohmann::json& config) const override {
    DT_ASSIGN_OR_RETURN(UNetConfig c, UNetConfig::FromJson(config));
    DT_RETURN_IF_ERROR(c.Validate());
    return UNetSpec(c);
  }

  Result<ModelSpec> Resized(const ModelSpec& spec, int height, int width) const override {
    nlohmann::json config = spec.config;
    config["sample_size"] =
        height == width ? nlohmann::json(height) : nlohmann::json(std::vector<int>{height, width});
    return FromJson(config);
  }

  // diffusers' UNet2DConditionModel config: the spec's keys without difftrain's own.
  Result<nlohmann::json> DiffusersConfig(const ModelSpec& spec) const override {
    nlohmann::json config = spec.config;
    for (const char* own : {"name", "text_length", "text_dropout", "requires_aesthetics_score"})
      config.erase(own);
    config["_class_name"] = "UNet2DConditionModel";
    config["_diffusers_version"] = "0.27.2";
    return config;
  }

  Result<std::optional<ModelSpec>> FromDiffusersConfig(
      const nlohmann::json& config) const override {
    if (JsonStringOr(config, "_class_name", "") != "UNet2DConditionModel")
      return std::optional<ModelSpec>();
    nlohmann::json unet = config;
    unet["name"] = "unet";
    DT_ASSIGN_OR_RETURN(ModelSpec spec, FromJson(unet));
    return std::optional<ModelSpec>(std::move(spec));
  }

  Result<std::vector<std::string>> SingleFileNames(
      const std::vector<std::string>& names) const override {
    return io::LdmUNetNames(names);
  }

  ModelCost Cost(const ModelSpec& spec) const override {
    const UNetConfig c = UNetConfigOf(spec);
    const int64_t n = ParameterCount(c);
    return {n, n, ForwardMacs(c).total()};
  }

  SampleSchema Samples(const ModelSpec& spec) const override {
    const UNetConfig c = UNetConfigOf(spec);
    SampleSchema s;
    // A UNet of more input than output channels (not a learned σ's 2×) samples out_channels and
    // takes the rest as conditioning (an inpainting UNet's 9 = 4 + mask + masked image's 4).
    const bool conditioned = c.in_channels > c.out_channels;
    s.channels = conditioned ? c.out_channels : c.in_channels;
    s.conditioning_channels = conditioned ? c.in_channels - c.out_channels : 0;
    s.out_channels = c.out_channels;
    s.height = c.sample_size;
    s.width = c.width();
    s.context_length = c.text_length;
    s.context_dim = c.cross_attention_dim;
    s.context_dropout = c.text_dropout;
    s.guidance_embedding_dim = c.time_cond_proj_dim;
    if (c.text_time()) {
      // The pixels of an uncropped image whose latents are the model's size: Stable
      // Diffusion's VAE makes a latent of every 8×8 pixels.
      constexpr float kVaeScale = 8;
      const float h = kVaeScale * c.sample_size, w = kVaeScale * c.width();
      s.pooled_text_dim = c.pooled_text_dim();
      s.time_ids = {h, w, 0, 0, h, w};
      // The refiner's: the aesthetic score diffusers' pipeline gives by default.
      if (c.requires_aesthetics_score) s.time_ids = {h, w, 0, 0, UNetConfig::kAestheticScore};
      s.aesthetic_score = c.requires_aesthetics_score;
    }
    return s;
  }

  // NeMo and MosaicML train Stable Diffusion data-parallel; so does difftrain.
  Status ValidateLayout(const ModelSpec&, const LayoutShape& l) const override {
    for (auto [axis, size] : {std::pair{"tp", l.tp}, {"cp", l.cp}, {"pp", l.pp}}) {
      if (size != 1) {
        return Errorf(
            "parallel.{} = {}: the unet family trains data-parallel only (tp, cp and "
            "pp must be 1)",
            axis, size);
      }
    }
    return Status::Ok();
  }

  Result<ModelPartition> Partition(const ModelSpec& spec, const LayoutShape& l, int, int,
                                   int) const override {
    DT_RETURN_IF_ERROR(ValidateLayout(spec, l));
    const UNetPlan plan(UNetConfigOf(spec));
    ModelPartition p;
    p.end_block = 1;
    p.parameters.table = plan.table;
    p.parameters.fragments = {{0, 0, plan.table.total()}};
    p.parameters.split.assign(plan.table.tensors().size(), false);
    return p;
  }

  size_t ActivationBytes(const ModelSpec& spec, const LayoutShape&, int, int B, int slots,
                         bool recompute) const override {
    return UNet::ActivationBytes(UNetConfigOf(spec), B, slots, recompute);
  }

  Result<std::unique_ptr<Model>> Create(const ModelSpec& spec, const LayoutShape& l, int, int, int,
                                        const ModelComms&) const override {
    DT_RETURN_IF_ERROR(ValidateLayout(spec, l));
    return std::unique_ptr<Model>(std::make_unique<UNet>(UNetConfigOf(spec)));
  }
  Result<std::unique_ptr<Model>> CreateForInference(const ModelSpec& spec) const override {
    return std::unique_ptr<Model>(std::make_unique<UNet>(UNetConfigOf(spec), /*gradients=*/false));
  }

  // The bf16 step of model/unet/cuda (docs/cuda.md), where the CUDA backend was built.
  Result<std::unique_ptr<GpuStep>> CreateGpuStep(const TrainConfig& config,
                                                 int device) const override {
#ifdef DIFFTRAIN_HAVE_CUDA
    return CreateUNetGpuStep(config, device);
#else
    (void)config;
    (void)device;
    return NoCudaBackend();
#endif
  }

  std::optional<GpuStepMemory> GpuStepBytes(const ModelSpec& spec, int B,
                                            bool /*fp8: refused for the UNet*/) const override {
#ifdef DIFFTRAIN_HAVE_CUDA
    return UNetGpuStepBytes(UNetConfigOf(spec), B);
#else
    (void)spec;
    (void)B;
    return std::nullopt;
#endif
  }
};

}  // namespace

const ModelFamily& UNetFamily() {
  static const UNetFamilyImpl family;
  return family;
}

ModelSpec UNetSpec(const UNetConfig& config) {
  return {"unet", config.ToJson()};
}

UNetConfig UNetConfigOf(const ModelSpec& spec) {
  DT_CHECK(spec.family == "unet", "a {} model where a UNet was expected", spec.family);
  Result<UNetConfig> c = UNetConfig::FromJson(spec.config);
  DT_CHECK(c.ok(), "{}", c.status().message());
  return *c;
}

}  // namespace difftrain
