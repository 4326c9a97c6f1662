#include "model/dit/family.h"

#include "common/check.h"
#include "model/dit/dit.h"
#include "model/dit/shard.h"
#include "model/train/gpu_step.h"
#ifdef DIFFTRAIN_HAVE_CUDA
#include "model/dit/cuda/gpu_step.h"
#endif

namespace difftrain {
namespace {

constexpr const char* kCustom = "custom";

// The shape fields a job's model section and the command line's overrides may set.
Status ApplyFields(YamlFields& fields, DiTConfig& c) {
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

class DiTFamilyImpl final : public ModelFamily {
 public:
  std::string_view name() const override { return "dit"; }

  std::vector<std::string> ConfigNames() const override { return DiTConfigNames(); }
  std::string_view custom_name() const override { return kCustom; }

  // A named config (`name: DiT-S/4`) with optional overrides, or `name: custom` with every
  // shape field given.
  Result<ModelSpec> FromYaml(YamlFields& fields) const override {
    std::string name = "DiT-S/2";
    int input_size = 32;
    fields.String("name", name).Int("input_size", input_size);
    DiTConfig c;
    if (name != kCustom) {
      Result<DiTConfig> named = DiTConfigByName(name, input_size);
      if (!named.ok()) return fields.ErrorAt("name", named.status().message());
      c = *named;
    } else {
      for (const char* required : {"patch_size", "hidden_size", "depth", "num_heads"}) {
        if (!fields.Has(required)) return fields.ErrorAt(required, "required when name is custom");
      }
      c.name = kCustom;
      c.input_size = input_size;
    }
    DT_RETURN_IF_ERROR(ApplyFields(fields, c));
    DT_RETURN_IF_ERROR(c.Validate());
    return DiTSpec(c);
  }

  Result<ModelSpec> FromRequest(const ModelRequest& r) const override {
    const int input_size = r.input_size.value_or(32);
    DiTConfig c;
    if (r.name == kCustom) {
      for (const char* required : {"patch_size", "hidden_size", "depth", "num_heads"}) {
        if (!r.overrides.contains(required)) {
          return Errorf("model custom needs {} (and patch_size, hidden_size, depth, num_heads)",
                        required);
        }
      }
      c.input_size = input_size;
    } else {
      DT_ASSIGN_OR_RETURN(c, DiTConfigByName(r.name, input_size));
    }
    if (!r.overrides.empty()) c.name = kCustom;
    // The overrides read as a model section, so that unknown fields are refused by name.
    YAML::Node node = YAML::Load(r.overrides.dump());
    YamlFields fields("the command line", node, "model");
    DT_RETURN_IF_ERROR(ApplyFields(fields, c));
    DT_RETURN_IF_ERROR(c.Validate());
    return DiTSpec(c);
  }

  Result<ModelSpec> FromJson(const nlohmann::json& config) const override {
    DT_ASSIGN_OR_RETURN(DiTConfig c, DiTConfig::FromJson(config));
    DT_RETURN_IF_ERROR(c.Validate());
    return DiTSpec(c);
  }

  ModelCost Cost(const ModelSpec& spec) const override {
    const DiTConfig c = DiTConfigOf(spec);
    return {ParameterCount(c), TrainableParameterCount(c), ForwardMacsPerSample(c)};
  }

  SampleSchema Samples(const ModelSpec& spec) const override {
    const DiTConfig c = DiTConfigOf(spec);
    SampleSchema s;
    s.channels = c.in_channels;
    s.height = s.width = c.input_size;
    s.out_channels = c.out_channels();
    s.num_classes = c.num_classes;
    s.label_dropout = c.class_dropout_prob;
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
    p.fixed_elements = shard.first_stage() ? size_t(c.tokens()) * c.hidden_size : 0;
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

  Result<std::unique_ptr<GpuStep>> CreateGpuStep(const TrainConfig& config,
                                                 int device) const override {
#ifdef DIFFTRAIN_HAVE_CUDA
    return CreateDiTGpuStep(config, device);
#else
    (void)config;
    (void)device;
    return Status::Error(
        "train.device cuda: this difftrain was built without the CUDA backend (no nvcc when it "
        "was built; see docs/cuda.md)");
#endif
  }
};

}  // namespace

const ModelFamily& DiTFamily() {
  static const DiTFamilyImpl family;
  return family;
}

ModelSpec DiTSpec(const DiTConfig& config) {
  return {"dit", config.ToJson()};
}

DiTConfig DiTConfigOf(const ModelSpec& spec) {
  DT_CHECK(spec.family == "dit", "a {} model where a DiT was expected", spec.family);
  Result<DiTConfig> c = DiTConfig::FromJson(spec.config);
  DT_CHECK(c.ok(), "{}", c.status().message());
  return *c;
}

}  // namespace difftrain
