// DiT in diffusers' form (model/dit/diffusers.h, model/io/diffusers_dit.h): the config both ways,
// what diffusers' DiT cannot hold, the tensors' names against those diffusers 0.27.2 gives a
// Transformer2DModel of two blocks, and a file of them read back into the model's arena
// (model/train/initial_weights.h). tests/dit_diffusers_reference_test.cc checks the same
// against diffusers itself.
#include "model/dit/diffusers.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/dit/family.h"
#include "model/io/diffusers_dit.h"
#include "model/io/safetensors.h"
#include "model/train/initial_weights.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;

DiTConfig Tiny() {
  DiTConfig c;
  c.input_size = 8;
  c.patch_size = 2;
  c.hidden_size = 32;
  c.depth = 2;
  c.num_heads = 2;
  c.num_classes = 1000;
  return c;
}

TEST(DiffusersDitTest, XL2IsWhatDiTsConversionConfiguresAndReadsBackByName) {
  const DiTConfig xl = *DiTConfigByName("DiT-XL/2", 32);
  Result<nlohmann::json> config = DiffusersDitConfig(xl);
  ASSERT_TRUE(config.ok()) << config.status().message();
  // facebook/DiT-XL-2-256's transformer/config.json, with DiT's own LayerNorm eps.
  EXPECT_EQ((*config)["_class_name"], "Transformer2DModel");
  EXPECT_EQ((*config)["num_attention_heads"], 16);
  EXPECT_EQ((*config)["attention_head_dim"], 72);
  EXPECT_EQ((*config)["num_layers"], 28);
  EXPECT_EQ((*config)["in_channels"], 4);
  EXPECT_EQ((*config)["out_channels"], 8);
  EXPECT_EQ((*config)["patch_size"], 2);
  EXPECT_EQ((*config)["sample_size"], 32);
  EXPECT_EQ((*config)["num_embeds_ada_norm"], 1000);
  EXPECT_EQ((*config)["norm_type"], "ada_norm_zero");
  EXPECT_EQ((*config)["activation_fn"], "gelu-approximate");
  EXPECT_EQ((*config)["norm_eps"], 1e-6);

  Result<std::optional<DiTConfig>> back = DiTConfigFromDiffusers(*config);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ((*back)->ToJson(), xl.ToJson());
  // A shape no named config has is custom; one without a learned σ keeps that.
  DiTConfig tiny = Tiny();
  tiny.learn_sigma = false;
  back = DiTConfigFromDiffusers(*DiffusersDitConfig(tiny));
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->ToJson(), tiny.ToJson());
  // diffusers 0.30's class name for the same model.
  nlohmann::json renamed = *config;
  renamed["_class_name"] = "DiTTransformer2DModel";
  back = DiTConfigFromDiffusers(renamed);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->name, "DiT-XL/2");
}

TEST(DiffusersDitTest, RefusesWhatDiffusersDiTCannotHoldAndPassesOverOtherModels) {
  DiTConfig c = Tiny();
  c.mlp_ratio = 2;
  EXPECT_THAT(DiffusersDitConfig(c).status().message(), HasSubstr("model.mlp_ratio 2"));
  c = Tiny();
  c.class_dropout_prob = 0;
  EXPECT_THAT(DiffusersDitConfig(c).status().message(), HasSubstr("class_dropout_prob > 0"));
  c = Tiny();
  c.video = true;
  c.num_frames = 4;
  EXPECT_FALSE(DiffusersDitConfig(c).ok());

  // Not a DiT: another class, or a Transformer2DModel without adaLN-Zero over patches.
  for (const nlohmann::json& other :
       {nlohmann::json{{"_class_name", "UNet2DConditionModel"}, {"in_channels", 4}},
        nlohmann::json{{"_class_name", "Transformer2DModel"},
                       {"norm_type", "layer_norm"},
                       {"in_channels", 4},
                       {"patch_size", 2}},
        nlohmann::json{{"_class_name", "Transformer2DModel"}, {"norm_type", "ada_norm_zero"}},
        // Kinds of another type are no class's (config_fuzz: this one threw out of the reader).
        nlohmann::json{{"_class_name", 4}, {"norm_type", "ada_norm_zero"}, {"patch_size", 2}},
        nlohmann::json{{"_class_name", "Transformer2DModel"}, {"norm_type", nullptr}}}) {
    Result<std::optional<DiTConfig>> read = DiTConfigFromDiffusers(other);
    ASSERT_TRUE(read.ok()) << other.dump();
    EXPECT_FALSE(read->has_value()) << other.dump();
  }
  // A DiT that differs from difftrain's is named by its key.
  const nlohmann::json dit = *DiffusersDitConfig(Tiny());
  nlohmann::json geglu = dit;
  geglu["activation_fn"] = "geglu";
  EXPECT_THAT(DiTConfigFromDiffusers(geglu).status().message(),
              HasSubstr("'activation_fn' is \"geglu\""));
  nlohmann::json odd = dit;
  odd["out_channels"] = 5;
  EXPECT_THAT(DiTConfigFromDiffusers(odd).status().message(), HasSubstr("out_channels 5"));
  nlohmann::json heads = dit;
  heads["num_attention_heads"] = "2";
  EXPECT_THAT(DiTConfigFromDiffusers(heads).status().message(),
              HasSubstr("'num_attention_heads' is no integer"));
  // Integers past int's range, and a width past it (tests/fuzz/config_fuzz).
  heads["num_attention_heads"] = int64_t{1} << 32;
  EXPECT_THAT(DiTConfigFromDiffusers(heads).status().message(),
              HasSubstr("num_attention_heads: 4294967296 is not an integer"));
  heads["num_attention_heads"] = 1 << 20;
  heads["attention_head_dim"] = 1 << 12;
  EXPECT_THAT(DiTConfigFromDiffusers(heads).status().message(),
              HasSubstr("num_attention_heads 1048576 × attention_head_dim 4096 is no width"));
  nlohmann::json big = dit;
  big["sample_size"] = 1e300;
  EXPECT_THAT(DiTConfigFromDiffusers(big).status().message(),
              HasSubstr("'sample_size' is no integer"));
}

// The state dict diffusers 0.27.2 gives Transformer2DModel(num_layers=2, norm_type=
// "ada_norm_zero", …): every name once, each of its shape.
TEST(DiffusersDitTest, TheModelsTensorsAreDiffusersStateDict) {
  const ModelSpec spec = DiTSpec(Tiny());
  const ModelFamily& family = FamilyOf(spec);
  EXPECT_EQ(family.diffusers_component(), "transformer");
  Result<std::unique_ptr<Model>> model = family.Create(spec);
  ASSERT_TRUE(model.ok());
  const TensorTable& global = (*model)->global_parameter_table();
  Result<std::vector<ModelFamily::DiffusersTensor>> tensors = family.DiffusersTensors(global);
  ASSERT_TRUE(tensors.ok()) << tensors.status().message();
  std::vector<std::string> block = {"norm1.emb.timestep_embedder.linear_1.weight",
                                    "norm1.emb.timestep_embedder.linear_1.bias",
                                    "norm1.emb.timestep_embedder.linear_2.weight",
                                    "norm1.emb.timestep_embedder.linear_2.bias",
                                    "norm1.emb.class_embedder.embedding_table.weight",
                                    "norm1.linear.weight",
                                    "norm1.linear.bias",
                                    "attn1.to_q.weight",
                                    "attn1.to_q.bias",
                                    "attn1.to_k.weight",
                                    "attn1.to_k.bias",
                                    "attn1.to_v.weight",
                                    "attn1.to_v.bias",
                                    "attn1.to_out.0.weight",
                                    "attn1.to_out.0.bias",
                                    "ff.net.0.proj.weight",
                                    "ff.net.0.proj.bias",
                                    "ff.net.2.weight",
                                    "ff.net.2.bias"};
  std::set<std::string> want = {"pos_embed.proj.weight", "pos_embed.proj.bias", "proj_out_1.weight",
                                "proj_out_1.bias",       "proj_out_2.weight",   "proj_out_2.bias"};
  for (int i = 0; i < 2; ++i) {
    for (const std::string& name : block)
      want.insert(fmt::format("transformer_blocks.{}.{}", i, name));
  }
  std::set<std::string> got;
  for (const ModelFamily::DiffusersTensor& t : *tensors)
    EXPECT_TRUE(got.insert(t.name).second) << t.name << " twice";
  EXPECT_EQ(got, want);
  // qkv in thirds; the embedders whole in both blocks.
  auto find = [&](const std::string& name) {
    return *std::find_if(tensors->begin(), tensors->end(),
                         [&](const ModelFamily::DiffusersTensor& t) { return t.name == name; });
  };
  const ModelFamily::DiffusersTensor k = find("transformer_blocks.1.attn1.to_k.weight");
  EXPECT_EQ(k.source, "blocks.1.attn.qkv.weight");
  EXPECT_EQ(k.first_row, 32);
  EXPECT_EQ(k.rows, 32);
  const ModelFamily::DiffusersTensor table =
      find("transformer_blocks.1.norm1.emb.class_embedder.embedding_table.weight");
  EXPECT_EQ(table.source, "y_embedder.embedding_table.weight");
  EXPECT_EQ(table.rows, -1);
  EXPECT_EQ(find("proj_out_1.bias").source, "final_layer.adaLN_modulation.1.bias");
  EXPECT_EQ(find("transformer_blocks.0.ff.net.2.weight").source, "blocks.0.mlp.fc2.weight");
}

// A file in diffusers' names, as export writes it, read into another model's arena: the same
// weights; a block's embedder that differs from block 0's is refused by name.
TEST(DiffusersDitTest, AFileOfDiffusersNamesReadsBackAndCopiesMustAgree) {
  const ModelSpec spec = DiTSpec(Tiny());
  const ModelFamily& family = FamilyOf(spec);
  std::unique_ptr<Model> model = std::move(family.Create(spec)).value();
  model->InitializeRandom(7);
  const TensorTable& global = model->global_parameter_table();
  const std::vector<ModelFamily::DiffusersTensor> tensors =
      std::move(family.DiffusersTensors(global)).value();
  std::vector<std::vector<float>> data;
  data.reserve(tensors.size());
  auto write = [&](const std::string& path, const std::string& changed) {
    io::SafetensorsWriter file;
    for (const ModelFamily::DiffusersTensor& d : tensors) {
      const TensorSpec* t = global.Find(d.source);
      std::vector<int64_t> shape = t->shape;
      const size_t row = t->numel / size_t(shape[0]);
      const size_t first = d.rows < 0 ? 0 : size_t(d.first_row) * row;
      if (d.rows >= 0) shape[0] = d.rows;
      const float* from = model->params() + t->offset + first;
      data.emplace_back(from, from + (d.rows < 0 ? t->numel : size_t(d.rows) * row));
      if (d.name == changed) data.back()[3] += 1e-3f;
      file.AddF32(d.name, shape, data.back().data());
    }
    ASSERT_TRUE(file.WriteAtomic(path).ok());
  };
  TempDir dir("diffusers_dit");
  const std::string same = dir.path() + "/same.safetensors";
  write(same, "");
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(same);
  ASSERT_TRUE(file.ok());
  Result<std::vector<std::string>> unused = CheckInitialWeights(*file, global, {"pos_embed"});
  ASSERT_TRUE(unused.ok()) << unused.status().message();
  EXPECT_TRUE(unused->empty());
  std::vector<float> read(global.total(), 0.0f);
  ASSERT_TRUE(ReadPretrainedWeights(*file, global, /*ema=*/false, read.data()).ok());
  EXPECT_TRUE(std::equal(read.begin(), read.end(), model->params()));

  const std::string apart = dir.path() + "/apart.safetensors";
  write(apart, "transformer_blocks.1.norm1.emb.timestep_embedder.linear_2.weight");
  file = io::SafetensorsFile::Read(apart);
  ASSERT_TRUE(file.ok());
  const Status s = ReadPretrainedWeights(*file, global, false, read.data());
  EXPECT_THAT(s.message(),
              HasSubstr("'transformer_blocks.1.norm1.emb.timestep_embedder.linear_2.weight' "
                        "differs from "
                        "'transformer_blocks.0.norm1.emb.timestep_embedder.linear_2.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("the model has one 't_embedder.mlp.2.weight'"));
}

}  // namespace
}  // namespace difftrain
