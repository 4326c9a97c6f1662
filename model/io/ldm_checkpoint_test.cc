// The original Stable Diffusion layout's names and configs (diffusers' reading of the same file
// is tests/sd_pipeline_reference_test.cc's SingleFileReferenceTest): a UNet's and a VAE's
// tensors written under their original names read back as the same config and, through
// Vae::Load and the initial-weights reader, the same weights.
#include "model/io/ldm_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/family/family.h"
#include "model/train/initial_weights.h"
#include "model/vae/vae.h"
#include "model/vae/vae_testing.h"

namespace difftrain::io {
namespace {

TEST(LdmCheckpointTest, NamesTheUNetsTensorsAsTheOriginal) {
  const std::vector<std::string> names = {
      "conv_in.weight",
      "time_embedding.linear_2.bias",
      "down_blocks.0.resnets.0.norm1.weight",  // two resnets a down level
      "down_blocks.0.resnets.1.time_emb_proj.weight",
      "down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k.weight",
      "down_blocks.0.downsamplers.0.conv.weight",
      "down_blocks.1.resnets.0.conv_shortcut.bias",
      "mid_block.resnets.1.norm2.weight",
      "mid_block.attentions.0.proj_out.bias",
      "up_blocks.0.resnets.2.conv1.weight",
      "up_blocks.0.upsamplers.0.conv.bias",
      "up_blocks.1.attentions.2.norm.weight",
      "up_blocks.1.upsamplers.0.conv.weight",
      "conv_norm_out.weight",
      "conv_out.bias"};
  Result<std::vector<std::string>> ldm = LdmUNetNames(names);
  ASSERT_TRUE(ldm.ok()) << ldm.status().message();
  const std::string p = kLdmUNetPrefix;
  EXPECT_EQ(*ldm, (std::vector<std::string>{
                      p + "input_blocks.0.0.weight", p + "time_embed.2.bias",
                      p + "input_blocks.1.0.in_layers.0.weight",
                      p + "input_blocks.2.0.emb_layers.1.weight",
                      p + "input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight",
                      p + "input_blocks.3.0.op.weight", p + "input_blocks.4.0.skip_connection.bias",
                      p + "middle_block.2.out_layers.0.weight", p + "middle_block.1.proj_out.bias",
                      p + "output_blocks.2.0.in_layers.2.weight",
                      p + "output_blocks.2.1.conv.bias",  // up block 0 has no attention
                      p + "output_blocks.5.1.norm.weight",
                      p + "output_blocks.5.2.conv.weight",  // after its attention
                      p + "out.0.weight", p + "out.2.bias"}));
  Result<std::vector<std::string>> lcm = LdmUNetNames({"time_embedding.cond_proj.weight"});
  ASSERT_FALSE(lcm.ok());
  EXPECT_NE(lcm.status().message().find("'time_embedding.cond_proj.weight' has no place"),
            std::string::npos)
      << lcm.status().message();
}

// OpenCLIP's text model (SD 2.x's, SDXL's second): q, k and v are thirds of each layer's
// in_proj, the projection is transposed.
TEST(LdmCheckpointTest, FindsTheClipTensorsInOpenClipsNames) {
  const auto part = [](const std::string& name) {
    std::optional<LdmTensorPart> p = LdmOpenClipTensor(name, 32);
    return p ? fmt::format("{} {} {}{}", p->name, p->first_row, p->rows,
                           p->transposed ? " transposed" : "")
             : std::string("none");
  };
  EXPECT_EQ(part("text_model.embeddings.token_embedding.weight"), "token_embedding.weight 0 -1");
  EXPECT_EQ(part("text_model.embeddings.position_embedding.weight"), "positional_embedding 0 -1");
  EXPECT_EQ(part("text_model.encoder.layers.3.self_attn.k_proj.weight"),
            "transformer.resblocks.3.attn.in_proj_weight 32 32");
  EXPECT_EQ(part("text_model.encoder.layers.0.self_attn.v_proj.bias"),
            "transformer.resblocks.0.attn.in_proj_bias 64 32");
  EXPECT_EQ(part("text_model.encoder.layers.1.self_attn.out_proj.bias"),
            "transformer.resblocks.1.attn.out_proj.bias 0 -1");
  EXPECT_EQ(part("text_model.encoder.layers.1.mlp.fc2.weight"),
            "transformer.resblocks.1.mlp.c_proj.weight 0 -1");
  EXPECT_EQ(part("text_model.encoder.layers.1.layer_norm1.weight"),
            "transformer.resblocks.1.ln_1.weight 0 -1");
  EXPECT_EQ(part("text_model.final_layer_norm.bias"), "ln_final.bias 0 -1");
  EXPECT_EQ(part("text_projection.weight"), "text_projection 0 -1 transposed");
  EXPECT_EQ(part("logit_scale"), "none");
}

// A file of zeros under the names `names`, shapes `shapes` (its header is what is read).
Result<SafetensorsFile> ZerosFile(const TempDir& dir, const std::vector<std::string>& names,
                                  const std::vector<std::vector<int64_t>>& shapes) {
  SafetensorsWriter writer;
  size_t most = 0;
  for (const std::vector<int64_t>& shape : shapes) {
    size_t n = 1;
    for (int64_t d : shape)
      n *= d;
    most = std::max(most, n);
  }
  const std::vector<float> zeros(most, 0.0f);
  for (size_t i = 0; i < names.size(); ++i)
    writer.AddF32(names[i], shapes[i], zeros.data());
  const std::string path = dir.path() + "/model.safetensors";
  DT_RETURN_IF_ERROR(writer.WriteAtomic(path));
  return SafetensorsFile::Read(path);
}

// A UNet's tensors under their original names (zeros) give back its config: SD 1.x's shape
// (convolutional projections, 8 heads), SD 2.x's (linear, heads of 64 channels) and SDXL's
// (a plain first level, transformers of several blocks, the text_time micro-conditioning whose
// time features are what the OpenCLIP model's pooled text leaves of label_emb.0.0's input) and
// SDXL's refiner's (five time ids, its OpenCLIP model first, a last level without attention whose
// depth is the mid block's); the initial-weights reader finds every tensor of the model in the
// file.
TEST(LdmCheckpointTest, ReadsTheUNetsConfigFromItsTensors) {
  enum Kind { kSd1, kSd2, kSdxl, kRefiner };
  // SD 1.x, SD 2.x, SD 1.x's inpainting UNet (sd-v1-5-inpainting: 9 input channels), SDXL and
  // its refiner.
  for (const auto& [kind, in_channels] :
       {std::pair{kSd1, 4}, {kSd2, 4}, {kSd1, 9}, {kSdxl, 4}, {kRefiner, 4}}) {
    SCOPED_TRACE(fmt::format("{} in_channels {}", int(kind), in_channels));
    const bool linear = kind != kSd1;
    nlohmann::json config = {
        {"name", "unet"},
        {"sample_size", 64},
        {"in_channels", in_channels},
        {"out_channels", 4},
        {"block_out_channels",
         linear ? std::vector<int>{64, 128, 128} : std::vector<int>{32, 64, 64}},
        {"layers_per_block", 2},
        {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}},
        {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
        {"cross_attention_dim", 24},
        {"attention_head_dim",
         linear ? nlohmann::json(std::vector<int>{1, 2, 2}) : nlohmann::json(8)},
        {"use_linear_projection", linear},
        {"transformer_layers_per_block", 1},
        {"norm_num_groups", 32}};
    constexpr int kPooled = 16;
    if (kind == kSdxl) {
      config["sample_size"] = 128;
      config["down_block_types"] = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
      config["up_block_types"] = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
      config["transformer_layers_per_block"] = {1, 2, 3};
      config["addition_embed_type"] = "text_time";
      config["addition_time_embed_dim"] = 8;
      config["projection_class_embeddings_input_dim"] = kPooled + 6 * 8;
    }
    if (kind == kRefiner) {
      config["sample_size"] = 128;
      config["down_block_types"] = {"DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
      config["up_block_types"] = {"UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
      config["transformer_layers_per_block"] = {1, 2, 2};  // the mid block's 2 last
      config["addition_embed_type"] = "text_time";
      config["addition_time_embed_dim"] = 8;
      config["projection_class_embeddings_input_dim"] = kPooled + 5 * 8;
      config["requires_aesthetics_score"] = true;
    }
    Result<ModelSpec> spec = ModelSpecFromJson("unet", config);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    Result<ModelPartition> whole = FamilyOf(*spec).Partition(*spec, LayoutShape{}, 0, 0, 0);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    const TensorTable& table = whole->parameters.table;
    std::vector<std::string> names;
    for (const TensorSpec& t : table.tensors())
      names.push_back(t.name);
    Result<std::vector<std::string>> ldm = LdmUNetNames(names);
    ASSERT_TRUE(ldm.ok()) << ldm.status().message();
    std::vector<std::vector<int64_t>> shapes;
    for (const TensorSpec& t : table.tensors())
      shapes.push_back(t.shape);
    if (kind == kSdxl) {  // the pooled text's width is its projection's
      ldm->push_back(std::string(kSgmOpenClipPrefix) + "text_projection");
      shapes.push_back({24, kPooled});
    }
    if (kind == kRefiner) {  // its one text model, first
      ldm->push_back(std::string(kSgmRefinerOpenClipPrefix) + "text_projection");
      shapes.push_back({24, kPooled});
      ldm->push_back(std::string(kSgmRefinerOpenClipPrefix) +
                     "transformer.resblocks.0.attn.in_proj_weight");
      shapes.push_back({72, 24});
    }
    TempDir dir("ldm_unet");
    Result<SafetensorsFile> file = ZerosFile(dir, *ldm, shapes);
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_TRUE(IsLdmCheckpoint(*file));
    EXPECT_FALSE(HasLdmVae(*file));
    EXPECT_EQ(IsSdxlCheckpoint(*file), kind == kSdxl || kind == kRefiner);
    EXPECT_EQ(IsSdxlRefinerCheckpoint(*file), kind == kRefiner);
    Result<nlohmann::json> read = LdmUNetConfig(*file);
    ASSERT_TRUE(read.ok()) << read.status().message();
    for (const char* key :
         {"in_channels", "out_channels", "block_out_channels", "layers_per_block",
          "down_block_types", "up_block_types", "cross_attention_dim", "attention_head_dim",
          "use_linear_projection", "transformer_layers_per_block", "sample_size",
          "addition_embed_type", "addition_time_embed_dim", "projection_class_embeddings_input_dim",
          "requires_aesthetics_score"}) {
      EXPECT_EQ(read->value(key, nlohmann::json()), config.value(key, nlohmann::json())) << key;
    }
    Result<ModelSpec> read_spec = ModelSpecFromJson("unet", *read);
    ASSERT_TRUE(read_spec.ok()) << read_spec.status().message();
    EXPECT_EQ(FamilyOf(*read_spec).Samples(*read_spec).conditioning_channels, in_channels - 4);
    Result<std::vector<std::string>> unused = CheckInitialWeights(*file, table);
    ASSERT_TRUE(unused.ok()) << unused.status().message();
    // The text model's projection (and the refiner's layer).
    EXPECT_EQ(unused->size(), kind == kSdxl ? 1u : kind == kRefiner ? 2u : 0u);
    if (kind == kSd1 && in_channels == 4) {
      // A block numbered past the layout's four digits is none of it (INT_MAX's would have
      // overflowed the count of blocks): the same config (found writing single_file_fuzz).
      std::vector<std::string> past = *ldm;
      std::vector<std::vector<int64_t>> past_shapes = shapes;
      past.push_back(std::string(kLdmUNetPrefix) + "input_blocks.2147483647.0.in_layers.0.weight");
      past_shapes.push_back({32});
      TempDir past_dir("ldm_unet_past");
      Result<SafetensorsFile> past_file = ZerosFile(past_dir, past, past_shapes);
      ASSERT_TRUE(past_file.ok());
      Result<nlohmann::json> past_config = LdmUNetConfig(*past_file);
      ASSERT_TRUE(past_config.ok()) << past_config.status().message();
      EXPECT_EQ(*past_config, *read);
      Result<std::vector<std::string>> no_place =
          LdmUNetNames({"down_blocks.10000.resnets.0.norm1.weight"});
      ASSERT_FALSE(no_place.ok());
      EXPECT_NE(no_place.status().message().find("has no place"), std::string::npos);
      // A convolution of one dimension (it read its second, past the shape's end) is refused
      // naming it.
      std::vector<std::vector<int64_t>> flat = shapes;
      const size_t conv_in = std::find(ldm->begin(), ldm->end(),
                                       std::string(kLdmUNetPrefix) + "input_blocks.0.0.weight") -
                             ldm->begin();
      ASSERT_LT(conv_in, flat.size());
      flat[conv_in] = {32};
      TempDir flat_dir("ldm_unet_flat");
      Result<SafetensorsFile> flat_file = ZerosFile(flat_dir, *ldm, flat);
      ASSERT_TRUE(flat_file.ok());
      Result<nlohmann::json> refused = LdmUNetConfig(*flat_file);
      ASSERT_FALSE(refused.ok());
      EXPECT_NE(refused.status().message().find(
                    "input_blocks.0.0.weight' has shape [32], not one of 4 dimensions"),
                std::string::npos)
          << refused.status().message();
    }
    if (kind != kSdxl) continue;
    // Without its text models the time features are SDXL's 256: label_emb.0.0's 64 inputs
    // leave no pooled text, and the config says so.
    ldm->pop_back();
    shapes.pop_back();
    TempDir bare_dir("ldm_unet_bare");
    Result<SafetensorsFile> bare = ZerosFile(bare_dir, *ldm, shapes);
    ASSERT_TRUE(bare.ok());
    Result<nlohmann::json> bare_config = LdmUNetConfig(*bare);
    ASSERT_TRUE(bare_config.ok()) << bare_config.status().message();
    EXPECT_EQ((*bare_config)["addition_time_embed_dim"], 256);
    EXPECT_FALSE(ModelSpecFromJson("unet", *bare_config).ok());
    // A projection of a width that leaves no 6 time ids' features is refused.
    ldm->push_back(std::string(kSgmOpenClipPrefix) + "text_projection");
    shapes.push_back({24, kPooled + 3});
    TempDir uneven_dir("ldm_unet_uneven");
    Result<SafetensorsFile> uneven = ZerosFile(uneven_dir, *ldm, shapes);
    ASSERT_TRUE(uneven.ok());
    Result<nlohmann::json> refused = LdmUNetConfig(*uneven);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("6 time ids' sinusoids"), std::string::npos)
        << refused.status().message();
    // A mid block shallower than the last level, which attends: diffusers builds the mid
    // block of the last level's depth, so no config says this UNet.
    std::vector<std::string> shallow_names;
    std::vector<std::vector<int64_t>> shallow_shapes;
    for (size_t i = 0; i + 1 < ldm->size(); ++i) {  // less the uneven projection
      if ((*ldm)[i].find("middle_block.1.transformer_blocks.2.") != std::string::npos) continue;
      shallow_names.push_back((*ldm)[i]);
      shallow_shapes.push_back(shapes[i]);
    }
    TempDir shallow_dir("ldm_unet_shallow_mid");
    Result<SafetensorsFile> shallow = ZerosFile(shallow_dir, shallow_names, shallow_shapes);
    ASSERT_TRUE(shallow.ok());
    Result<nlohmann::json> shallow_config = LdmUNetConfig(*shallow);
    ASSERT_FALSE(shallow_config.ok());
    EXPECT_NE(shallow_config.status().message().find(
                  "the mid block's 2 transformer blocks are not its last level's 3"),
              std::string::npos)
        << shallow_config.status().message();
  }
  // The upscaler's class embedding is refused by name.
  const std::string p = kLdmUNetPrefix;
  const std::vector<int64_t> one = {1};
  for (const auto& [names, shapes, message] :
       {std::tuple{std::vector<std::string>{p + "label_emb.weight"},
                   std::vector<std::vector<int64_t>>{one}, "class embeddings"}}) {
    std::vector<std::string> all = names;
    all.push_back(p + "input_blocks.0.0.weight");
    std::vector<std::vector<int64_t>> all_shapes = shapes;
    all_shapes.push_back(one);
    TempDir dir("ldm_refused");
    Result<SafetensorsFile> file = ZerosFile(dir, all, all_shapes);
    ASSERT_TRUE(file.ok());
    Result<nlohmann::json> refused = LdmUNetConfig(*file);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find(message), std::string::npos)
        << refused.status().message();
  }
}

// A VAE's tensors under their original names, its attention as 1×1 convolutions: Vae::Load
// reads the config from them and decodes as the same VAE from diffusers' names does.
TEST(LdmCheckpointTest, LoadsTheVaeOfAnOriginalCheckpoint) {
  const nlohmann::json config = {{"block_out_channels", {32, 64}},
                                 {"layers_per_block", 2},
                                 {"latent_channels", 4},
                                 {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                                 {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}}};
  Result<VaeConfig> c = VaeConfig::FromJson(config);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const TensorTable table = Vae::Tensors(*c);
  const std::vector<float> weights = testing::RandomVaeWeights(table, 3);
  std::vector<std::string> names;
  for (const TensorSpec& t : table.tensors())
    names.push_back(t.name);
  const std::vector<std::string> ldm = LdmVaeNames(names);
  SafetensorsWriter writer;
  const std::vector<float> zeros(8, 0.0f);
  writer.AddF32(std::string(kLdmUNetPrefix) + "input_blocks.0.0.weight", {8}, zeros.data());
  int convolutions = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorSpec& t = table.tensors()[i];
    std::vector<int64_t> shape = t.shape;
    if (ldm[i].find(".mid.attn_1.") != std::string::npos && shape.size() == 2) {
      shape.insert(shape.end(), {1, 1});
      ++convolutions;
    }
    writer.AddF32(ldm[i], shape, weights.data() + t.offset);
  }
  EXPECT_EQ(convolutions, 8);  // q, k, v, proj_out of the encoder's and the decoder's
  TempDir dir("ldm_vae");
  ASSERT_TRUE(writer.WriteAtomic(dir.path() + "/model.safetensors").ok());
  Result<Vae> loaded = Vae::Load(dir.path() + "/model.safetensors");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->config().block_out_channels, (std::vector<int>{32, 64}));
  EXPECT_EQ(loaded->config().layers_per_block, 2);
  EXPECT_DOUBLE_EQ(loaded->config().scaling_factor, 0.18215);
  // A level's convolution without dimensions is refused naming it (its size was read from
  // an empty shape: found writing single_file_fuzz).
  SafetensorsWriter flat;
  for (size_t i = 0; i < names.size(); ++i) {
    const bool conv1 = ldm[i].ends_with("encoder.down.1.block.0.conv1.weight");
    flat.AddF32(ldm[i], conv1 ? std::vector<int64_t>{} : table.tensors()[i].shape,
                weights.data() + table.tensors()[i].offset);
  }
  ASSERT_TRUE(flat.WriteAtomic(dir.path() + "/flat.safetensors").ok());
  Result<SafetensorsFile> flat_file = SafetensorsFile::Read(dir.path() + "/flat.safetensors");
  ASSERT_TRUE(flat_file.ok()) << flat_file.status().message();
  Result<nlohmann::json> refused = LdmVaeConfig(*flat_file);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "encoder.down.1.block.0.conv1.weight' has shape [], not one of 4 dimensions"),
            std::string::npos)
      << refused.status().message();
  const Vae direct(*c, weights);
  std::vector<float> latents(4 * 4 * 4), a(3 * 8 * 8), b(a.size());
  for (size_t i = 0; i < latents.size(); ++i)
    latents[i] = static_cast<float>(std::sin(0.7 * i));
  ASSERT_TRUE(loaded->Decode(latents.data(), 1, 4, 4, a.data()).ok());
  ASSERT_TRUE(direct.Decode(latents.data(), 1, 4, 4, b.data()).ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace difftrain::io
