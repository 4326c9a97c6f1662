// The model-family seam: names pick families, a spec survives every way it travels (job file,
// checkpoint JSON, the command line), and a family's partitions, costs and layouts are what
// its model allocates and refuses. DiT is the family under test; a new family adds its cases.
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

}  // namespace
}  // namespace difftrain
