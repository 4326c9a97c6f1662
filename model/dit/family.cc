#include "model/dit/family.h"

#include <algorithm>

#include "common/check.h"
#include "model/dit/diffusers.h"
#include "model/dit/dit.h"
#include "model/dit/shard.h"
#include "model/io/diffusers_dit.h"
#include "model/train/gpu_step.h"
#ifdef DIFFTRAIN_HAVE_CUDA
#include "model/dit/cuda/gpu_step.h"
#endif

namespace difftrain {
namespace {

// The shape fields a job's model section and the command line's overrides may set.
Status ApplyFields(YamlFields& fields, DiTConfig& c) {
  if (c.video) fields.Int("num_frames", c.num_frames);
  fields.Int("patch_size", c.patch_size)
      .Int("in_channels", c.in_channels)
      .Int("hidden_size", c.hidden_size)
      .Int("depth", c.depth)
      .Int("num_heads", c.num_heads)
      .Double("mlp_ratio", c.mlp_ratio)
      .Int("num_classes", c.num_classes)
      .Double("class_dropout_prob", c.class_dropout_prob)
      .Bool("learn_sigma", c.learn_sigma);
  return fields.Finish();
}

constexpr const char* kRequiredCustom[] = {"patch_size", "hidden_size", "depth", "num_heads"};
// The fields that change a named config's shape, so that it is no longer the named one.
constexpr const char* kShapeFields[] = {"patch_size", "hidden_size", "depth", "num_heads",
                                        "mlp_ratio"};

class TransformerFamily final : public ModelFamily {
 public:
  explicit TransformerFamily(TransformerFamilyKind kind) : k_(std::move(kind)) {}

  std::string_view name() const override { return k_.name; }
  bool trains_fp8() const override { return true; }  // cuda::DiT::Options::fp8

  std::vector<std::string> ConfigNames() const override { return SizedConfigNames(k_.prefix); }
  std::string_view custom_name() const override { return k_.custom_name; }

  // A named config (`name: DiT-S/4`) with optional overrides, or the custom name with every
  // shape field given.
  Result<ModelSpec> FromYaml(YamlFields& fields) const override {
    std::string name = k_.default_name;
    int input_size = 32;
    fields.String("name", name).Int("input_size", input_size);
    DiTConfig c;
    if (name != k_.custom_name) {
      Result<DiTConfig> named = SizedConfigByName(k_.prefix, name, input_size);
      if (!named.ok()) return fields.ErrorAt("name", named.status().message());
      c = *named;
    } else {
      for (const char* required : kRequiredCustom) {
        if (!fields.Has(required))
          return fields.ErrorAt(required, fmt::format("required when name is {}", name));
      }
      c.name = k_.custom_name;
      c.input_size = input_size;
    }
    Init(c);
    DT_RETURN_IF_ERROR(ApplyFields(fields, c));
    DT_RETURN_IF_ERROR(c.Validate());
    return DiTSpec(c);
  }

  Result<ModelSpec> FromRequest(const ModelRequest& r) const override {
    const int input_size = r.input_size.value_or(32);
    DiTConfig c;
    if (r.name == k_.custom_name) {
      for (const char* required : kRequiredCustom) {
        if (!r.overrides.contains(required)) {
          return Errorf("model {} needs {} (and patch_size, hidden_size, depth, num_heads)",
                        k_.custom_name, required);
        }
      }
      c.input_size = input_size;
      c.name = k_.custom_name;
    } else {
      DT_ASSIGN_OR_RETURN(c, SizedConfigByName(k_.prefix, r.name, input_size));
    }
    // DiT calls any overridden config custom; a video model keeps its name while its
    // frames, classes or σ change, which leave the named shape as it is.
    for (const auto& item : r.overrides.items()) {
      const std::string field = item.key();
      const bool shape =
          std::find_if(std::begin(kShapeFields), std::end(kShapeFields),
                       [&field](const char* f) { return field == f; }) != std::end(kShapeFields);
      if (!k_.video || shape) c.name = k_.custom_name;
    }
    Init(c);
    // The overrides read as a model section, so that unknown fields are refused by name.
    YAML::Node node = YAML::Load(r.overrides.dump());
    YamlFields fields("the command line", node, "model");
    DT_RETURN_IF_ERROR(ApplyFields(fields, c));
    DT_RETURN_IF_ERROR(c.Validate());
    return DiTSpec(c);
  }

  Result<ModelSpec> FromJson(const nlohmann::json& config) const override {
    DT_ASSIGN_OR_RETURN(DiTConfig c, DiTConfig::FromJson(config));
    if (c.video != k_.video) {
      return Errorf("a {} config {} num_frames", k_.name, k_.video ? "needs" : "has no");
    }
    return DiTSpec(c);
  }

  // DiT's diffusers form (model/dit/diffusers.h); Latte has none here (diffusers 0.27.2 has
  // no Latte).
  Result<nlohmann::json> DiffusersConfig(const ModelSpec& spec) const override {
    if (k_.video) return ModelFamily::DiffusersConfig(spec);
    return DiffusersDitConfig(DiTConfigOf(spec));
  }
  std::string_view diffusers_component() const override {
    return k_.video ? ModelFamily::diffusers_component() : "transformer";
  }
  Result<std::vector<DiffusersTensor>> DiffusersTensors(const TensorTable& global) const override {
    if (k_.video) return ModelFamily::DiffusersTensors(global);
    const int depth = io::DitDepth(global.Names());
    std::vector<DiffusersTensor> tensors;
    for (const TensorSpec& t : global.tensors()) {
      std::optional<io::DiffusersDitPlace> place =
          io::DiffusersDitTensor(t.name, t.shape.empty() ? 1 : t.shape[0], depth);
      if (!place) return Errorf("diffusers' DiT has no place for '{}'", t.name);
      for (const io::TensorRows& part : place->parts)
        tensors.push_back({part.name, t.name, part.first_row, part.rows});
      for (const std::string& copy : place->copies)
        tensors.push_back({copy, t.name});
    }
    return tensors;
  }
  Result<std::optional<ModelSpec>> FromDiffusersConfig(
      const nlohmann::json& config) const override {
    if (k_.video) return std::optional<ModelSpec>();
    DT_ASSIGN_OR_RETURN(std::optional<DiTConfig> c, DiTConfigFromDiffusers(config));
    if (!c) return std::optional<ModelSpec>();
    return std::optional<ModelSpec>(DiTSpec(*c));
  }

  ModelCost Cost(const ModelSpec& spec) const override {
    const DiTConfig c = DiTConfigOf(spec);
    return {ParameterCount(c), TrainableParameterCount(c), ForwardMacsPerSample(c)};
  }

  SampleSchema Samples(const ModelSpec& spec) const override {
    const DiTConfig c = DiTConfigOf(spec);
    SampleSchema s;
    s.frames = c.frames();
    s.video = c.video;
    s.channels = c.in_channels;
    s.height = s.width = c.input_size;
    s.out_channels = c.out_channels();
    s.num_classes = c.num_classes;
    s.label_dropout = c.has_labels() ? c.class_dropout_prob : 0;
    return s;
  }

  Status ValidateLayout(const ModelSpec& spec, const LayoutShape& l) const override {
    const DiTConfig c = DiTConfigOf(spec);
    if (l.tp > 0 && c.num_heads % l.tp != 0) {
      return Errorf("model.num_heads: expected a multiple of parallel.tp = {}, found {}", l.tp,
                    c.num_heads);
    }
    return ValidateParallelLayout(c, l.tp, l.cp, l.pp, l.stage_blocks);
  }

  Result<ModelPartition> Partition(const ModelSpec& spec, const LayoutShape& l, int tp_rank,
                                   int cp_rank, int stage) const override {
    const DiTConfig c = DiTConfigOf(spec);
    DT_ASSIGN_OR_RETURN(DiTShard shard, DiTShard::Create(c, l.tp, tp_rank, l.cp, cp_rank, l.pp,
                                                         stage, l.stage_blocks));
    ModelPartition p;
    p.shard = shard;
    p.first_block = shard.first_block;
    p.end_block = shard.end_block;
    p.parameters = ShardParameters(c, shard);
    p.fixed_elements =
        shard.first_stage() ? size_t(c.tokens() + (c.video ? c.num_frames : 0)) * c.hidden_size : 0;
    return p;
  }

  size_t ActivationBytes(const ModelSpec& spec, const LayoutShape& l, int stage, int B, int slots,
                         bool recompute) const override {
    const DiTConfig c = DiTConfigOf(spec);
    Result<DiTShard> shard = DiTShard::Create(c, l.tp, 0, l.cp, 0, l.pp, stage, l.stage_blocks);
    DT_CHECK(shard.ok(), "{}", shard.status().message());
    return DiT::ActivationBytes(c, *shard, B, slots, recompute);
  }

  Result<std::unique_ptr<Model>> Create(const ModelSpec& spec, const LayoutShape& l, int tp_rank,
                                        int cp_rank, int stage,
                                        const ModelComms& comms) const override {
    const DiTConfig c = DiTConfigOf(spec);
    DT_ASSIGN_OR_RETURN(DiTShard shard, DiTShard::Create(c, l.tp, tp_rank, l.cp, cp_rank, l.pp,
                                                         stage, l.stage_blocks));
    return std::unique_ptr<Model>(std::make_unique<DiT>(c, shard, comms));
  }
  Result<std::unique_ptr<Model>> CreateForInference(const ModelSpec& spec) const override {
    const DiTConfig c = DiTConfigOf(spec);
    return std::unique_ptr<Model>(
        std::make_unique<DiT>(c, DiTShard::Whole(c), DiTComms{}, /*gradients=*/false));
  }

  Result<std::unique_ptr<GpuStep>> CreateGpuStep(const TrainConfig& config,
                                                 int device) const override {
#ifdef DIFFTRAIN_HAVE_CUDA
    return CreateDiTGpuStep(config, device);
#else
    (void)config;
    (void)device;
    return NoCudaBackend();
#endif
  }

  std::optional<GpuStepMemory> GpuStepBytes(const ModelSpec& spec, int B, bool fp8) const override {
#ifdef DIFFTRAIN_HAVE_CUDA
    return DiTGpuStepBytes(DiTConfigOf(spec), B, fp8);
#else
    (void)spec;
    (void)B;
    (void)fp8;
    return std::nullopt;
#endif
  }

 private:
  // A fresh config of this family: a video model's frames (16, Latte's default) and kind.
  void Init(DiTConfig& c) const {
    c.video = k_.video;
    if (k_.video && c.num_frames == 1) c.num_frames = 16;
  }

  TransformerFamilyKind k_;
};

}  // namespace

std::unique_ptr<ModelFamily> MakeTransformerFamily(TransformerFamilyKind kind) {
  return std::make_unique<TransformerFamily>(std::move(kind));
}

const ModelFamily& DiTFamily() {
  static const std::unique_ptr<ModelFamily> family =
      MakeTransformerFamily({"dit", "DiT", "custom", "DiT-S/2", /*video=*/false});
  return *family;
}

ModelSpec DiTSpec(const DiTConfig& config) {
  return {config.video ? "latte" : "dit", config.ToJson()};
}

DiTConfig DiTConfigOf(const ModelSpec& spec) {
  DT_CHECK(spec.family == "dit" || spec.family == "latte",
           "a {} model where a DiT or Latte was expected", spec.family);
  Result<DiTConfig> c = DiTConfig::FromJson(spec.config);
  DT_CHECK(c.ok(), "{}", c.status().message());
  return *c;
}

}  // namespace difftrain
