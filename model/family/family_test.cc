// The model-family seam: names pick families, a spec survives every way it travels (job file,
// checkpoint JSON, the command line), and a family's partitions, costs and layouts are what
// its model allocates and refuses. DiT and Latte are the families under test; a new family
// adds its cases.
#include "model/family/family.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "model/dit/dit.h"
#include "model/dit/family.h"

namespace difftrain {
namespace {

ModelSpec Named(const std::string& name, nlohmann::json overrides = nlohmann::json::object()) {
  Result<ModelSpec> spec = ModelSpecFromRequest({name, 8, std::move(overrides)});
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return *spec;
}

TEST(ModelFamilyTest, ANamePicksItsFamily) {
  Result<const ModelFamily*> dit = FamilyForConfigName("DiT-XL/2");
  ASSERT_TRUE(dit.ok());
  EXPECT_EQ((*dit)->name(), "dit");
  EXPECT_TRUE((*dit)->Knows("custom"));
  Result<const ModelFamily*> unknown = FamilyForConfigName("SD9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown model 'SD9' (known: DiT-S/2"),
            std::string::npos)
      << unknown.status().message();
  EXPECT_FALSE(FindModelFamily("unet-of-the-future").ok());
}

TEST(ModelFamilyTest, OverridesAreConfigFieldsAndUnknownOnesAreRefusedByName) {
  const ModelSpec spec = Named("DiT-S/4", {{"depth", 2}, {"num_classes", 10}});
  EXPECT_EQ(spec.name(), "custom");
  EXPECT_EQ(spec.config["depth"], 2);
  EXPECT_EQ(spec.config["hidden_size"], 384);
  Result<ModelSpec> bad = ModelSpecFromRequest({"DiT-S/4", 8, {{"num_frames", 16}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_frames"), std::string::npos) << bad.status().message();
}

// Checkpoints hold the config JSON; `difftrain bench` writes it as a job's model section.
TEST(ModelFamilyTest, TheConfigJsonIsTheSameSpecAsJsonAndAsAModelSection) {
  const ModelSpec spec = Named("DiT-B/8", {{"learn_sigma", false}, {"class_dropout_prob", 0.0}});
  Result<ModelSpec> from_json = ModelSpecFromJson("dit", spec.config);
  ASSERT_TRUE(from_json.ok());
  EXPECT_EQ(*from_json, spec);
  Result<ModelSpec> old_checkpoint = ModelSpecFromJson("", spec.config);  // no "family"
  ASSERT_TRUE(old_checkpoint.ok());
  EXPECT_EQ(*old_checkpoint, spec);
  YAML::Node section = YAML::Load(spec.config.dump());
  Result<ModelSpec> from_yaml = ModelSpecFromYaml(YamlFields("job.yaml", section, "model"));
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().message();
  EXPECT_EQ(*from_yaml, spec);
}

TEST(ModelFamilyTest, CostIsTheFamilysCount) {
  const ModelSpec spec = Named("DiT-XL/2", {});
  const DiTConfig c = DiTConfigOf(spec);
  const ModelCost cost = FamilyOf(spec).Cost(spec);
  EXPECT_EQ(cost.parameters, ParameterCount(c));
  EXPECT_EQ(cost.trainable, TrainableParameterCount(c));
  EXPECT_DOUBLE_EQ(cost.training_flops_per_sample(), TrainingFlopsPerSample(c));
}

TEST(ModelFamilyTest, ALayoutTheModelCannotSplitNamesTheAxis) {
  const ModelSpec spec = Named("DiT-S/4", {{"num_heads", 6}, {"depth", 2}});
  const ModelFamily& f = FamilyOf(spec);
  Status heads = f.ValidateLayout(spec, {4, 1, 1, {}});
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.message().find("model.num_heads: expected a multiple of parallel.tp = 4"),
            std::string::npos)
      << heads.message();
  Status stages = f.ValidateLayout(spec, {1, 1, 3, {}});
  EXPECT_FALSE(stages.ok());
  EXPECT_TRUE(f.ValidateLayout(spec, {2, 2, 2, {}}).ok());
}

// The fragments of every rank of a layout cover the whole model's arena: split tensors once
// over the tp ranks, replicated ones by every tp rank, each stage its own tensors.
TEST(ModelFamilyTest, PartitionsCoverTheWholeModel) {
  const ModelSpec spec = Named("DiT-S/4", {{"depth", 4}, {"num_classes", 10}});
  const ModelFamily& f = FamilyOf(spec);
  const LayoutShape layout{2, 1, 2, {}};
  Result<ModelPartition> whole = f.Partition(spec, {}, 0, 0, 0);
  ASSERT_TRUE(whole.ok());
  const size_t n = whole->parameters.table.total();
  EXPECT_EQ(n, static_cast<size_t>(FamilyOf(spec).Cost(spec).trainable));
  std::vector<int> covered(n, 0);
  for (int stage = 0; stage < 2; ++stage) {
    for (int tp = 0; tp < 2; ++tp) {
      Result<ModelPartition> p = f.Partition(spec, layout, tp, 0, stage);
      ASSERT_TRUE(p.ok()) << p.status().message();
      EXPECT_EQ(p->fixed_elements > 0, stage == 0) << "pos_embed lives on the first stage";
      for (const Fragment& fr : p->parameters.fragments)
        for (size_t i = 0; i < fr.length; ++i)
          ++covered[fr.global + i];
    }
  }
  EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int k) { return k == 1 || k == 2; }));
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 0), 0);
}

TEST(ModelFamilyTest, AModelAllocatesWhatItsFamilyPredicts) {
  const ModelSpec spec = Named("DiT-S/4", {{"depth", 2}, {"num_classes", 10}});
  const ModelFamily& f = FamilyOf(spec);
  Result<std::unique_ptr<Model>> model = f.Create(spec);
  ASSERT_TRUE(model.ok());
  (*model)->Reserve(3, 2, /*recompute=*/true);
  EXPECT_EQ((*model)->activation_bytes(), f.ActivationBytes(spec, {}, 0, 3, 2, true));
  Result<ModelPartition> p = f.Partition(spec, {}, 0, 0, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*model)->num_params(), p->parameters.table.total());
  EXPECT_EQ((*model)->fixed_bytes(), p->fixed_elements * sizeof(float));
  EXPECT_EQ((*model)->fixed_tensors().at(0).name, "pos_embed");
}

// Latte: the configs the paper and the seed name (MODELS.md), counted without the fixed
// embeddings; a class-conditional model adds its label table.
TEST(LatteFamilyTest, NamedConfigsHaveTheReferenceParameterCounts) {
  Result<const ModelFamily*> latte = FamilyForConfigName("Latte-XL/2");
  ASSERT_TRUE(latte.ok());
  EXPECT_EQ((*latte)->name(), "latte");
  EXPECT_TRUE((*latte)->Knows("latte"));
  const struct {
    const char* name;
    int64_t trainable;
  } sizes[] = {{"Latte-S/2", 32480672},
               {"Latte-B/2", 129547040},
               {"Latte-L/2", 456815648},
               {"Latte-XL/2", 673681568}};
  for (const auto& [name, trainable] : sizes) {
    Result<ModelSpec> spec = ModelSpecFromRequest({name, 32, {{"num_classes", 0}}});
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(spec->name(), name) << "frames and classes keep the named shape";
    const ModelCost cost = FamilyOf(*spec).Cost(*spec);
    EXPECT_EQ(cost.trainable, trainable) << name;
    // pos_embed [1, 256, D] and temp_embed [1, 16, D].
    const int64_t D = spec->config["hidden_size"].get<int64_t>();
    EXPECT_EQ(cost.parameters - cost.trainable, (256 + 16) * D) << name;
  }
  Result<ModelSpec> classes = ModelSpecFromRequest({"Latte-XL/2", 32, {{"num_classes", 101}}});
  ASSERT_TRUE(classes.ok());
  EXPECT_EQ(FamilyOf(*classes).Cost(*classes).trainable, 673681568 + 102 * 1152);
}

TEST(LatteFamilyTest, SpecTravelsAndKeepsItsFrames) {
  const ModelSpec spec = Named("Latte-S/4", {{"num_frames", 8}, {"num_classes", 0}});
  EXPECT_EQ(spec.family, "latte");
  EXPECT_EQ(spec.config["num_frames"], 8);
  const SampleSchema x = FamilyOf(spec).Samples(spec);
  EXPECT_EQ(x.frames, 8);
  EXPECT_TRUE(x.video);
  EXPECT_EQ(x.num_classes, 0);
  EXPECT_EQ(x.label_dropout, 0);
  Result<ModelSpec> from_json = ModelSpecFromJson("latte", spec.config);
  ASSERT_TRUE(from_json.ok()) << from_json.status().message();
  EXPECT_EQ(*from_json, spec);
  YAML::Node section = YAML::Load(spec.config.dump());
  Result<ModelSpec> from_yaml = ModelSpecFromYaml(YamlFields("job.yaml", section, "model"));
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().message();
  EXPECT_EQ(*from_yaml, spec);
  // A Latte config is not a DiT's, and the other way round.
  EXPECT_FALSE(ModelSpecFromJson("dit", spec.config).ok());
  EXPECT_FALSE(ModelSpecFromJson("latte", Named("DiT-S/4").config).ok());
}

TEST(LatteFamilyTest, BadShapesAreRefusedByField) {
  auto error = [](const std::string& yaml) {
    YAML::Node section = YAML::Load(yaml);
    Result<ModelSpec> spec = ModelSpecFromYaml(YamlFields("job.yaml", section, "model"));
    EXPECT_FALSE(spec.ok()) << yaml;
    return spec.ok() ? std::string() : spec.status().message();
  };
  EXPECT_NE(error("{name: latte, patch_size: 2, hidden_size: 32, depth: 3, num_heads: 4}")
                .find("model.depth 3 must be even"),
            std::string::npos);
  EXPECT_NE(error("{name: Latte-S/2, num_frames: 0}").find("model.num_frames must be positive"),
            std::string::npos);
  EXPECT_NE(error("{name: latte, patch_size: 2, depth: 2, num_heads: 4}").find("hidden_size"),
            std::string::npos);
  EXPECT_NE(error("{name: Latte-S/2, frames: 8}").find("frames"), std::string::npos);
  EXPECT_NE(error("{name: Latte-Q/2}").find("unknown model 'Latte-Q/2'"), std::string::npos);
}

// Context parallelism splits each frame's tokens; a temporal block gathers nothing.
TEST(LatteFamilyTest, AModelAllocatesWhatItsFamilyPredicts) {
  const ModelSpec spec = Named("Latte-S/4", {{"depth", 4}, {"num_frames", 3}});
  const ModelFamily& f = FamilyOf(spec);
  for (bool recompute : {false, true}) {
    Result<std::unique_ptr<Model>> model = f.Create(spec);
    ASSERT_TRUE(model.ok());
    (*model)->Reserve(2, 2, recompute);
    EXPECT_EQ((*model)->activation_bytes(), f.ActivationBytes(spec, {}, 0, 2, 2, recompute));
    Result<ModelPartition> p = f.Partition(spec, {}, 0, 0, 0);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ((*model)->fixed_bytes(), p->fixed_elements * sizeof(float));
    const std::vector<FixedTensor> fixed = (*model)->fixed_tensors();
    ASSERT_EQ(fixed.size(), 2u);
    EXPECT_EQ(fixed[1].name, "temp_embed");
    EXPECT_EQ(fixed[1].shape, (std::vector<int64_t>{1, 3, 384}));
  }
  Status cp = f.ValidateLayout(spec, {1, 3, 1, {}});
  ASSERT_FALSE(cp.ok());
  EXPECT_NE(cp.message().find("2x2 patches per frame"), std::string::npos) << cp.message();
}

}  // namespace
}  // namespace difftrain
