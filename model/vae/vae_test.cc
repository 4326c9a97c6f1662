// The VAE without its reference (tests/vae_reference_test.cc compares it with diffusers): the
// config's checks, Stable Diffusion's VAE's tensors, loading errors and the posterior's draws.
#include "model/vae/vae.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/temp_dir.h"
#include "model/tensor/rng.h"
#include "model/vae/vae_testing.h"

namespace difftrain {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// sd-vae-ft-mse's config.json (and every Stable Diffusion pipeline's vae/).
json StableDiffusionVae() {
  return json::parse(R"({
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.4.2", "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",
                         "DownEncoderBlock2D"],
    "in_channels": 3, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,
    "out_channels": 3, "sample_size": 256,
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
                       "UpDecoderBlock2D"]})");
}

json Tiny() {
  return json::parse(R"({"block_out_channels": [4, 8], "norm_num_groups": 2,
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"]})");
}

Vae RandomVae(const VaeConfig& config, uint64_t seed) {
  return Vae(config, testing::RandomVaeWeights(Vae::Tensors(config), seed));
}

TEST(VaeConfigTest, StableDiffusionsVaeHasDiffusersTensors) {
  Result<VaeConfig> c = VaeConfig::FromJson(StableDiffusionVae());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->downscale(), 8);
  EXPECT_DOUBLE_EQ(c->scaling_factor, 0.18215);
  const TensorTable t = Vae::Tensors(*c);
  // AutoencoderKL(**config): sum(p.numel() for p in parameters()), len(state_dict()).
  EXPECT_EQ(t.total(), 83'653'863u);
  EXPECT_EQ(t.tensors().size(), 248u);
  ASSERT_NE(t.Find("decoder.up_blocks.3.resnets.0.conv_shortcut.weight"), nullptr);
  EXPECT_EQ(t.Find("decoder.up_blocks.3.resnets.0.conv_shortcut.weight")->shape,
            (std::vector<int64_t>{128, 256, 1, 1}));
  EXPECT_EQ(t.Find("encoder.mid_block.attentions.0.to_q.weight")->shape,
            (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(t.Find("quant_conv.weight")->shape, (std::vector<int64_t>{8, 8, 1, 1}));
  EXPECT_EQ(t.Find("encoder.down_blocks.2.downsamplers.0.conv.weight")->shape,
            (std::vector<int64_t>{512, 512, 3, 3}));
  EXPECT_EQ(t.Find("encoder.down_blocks.3.downsamplers.0.conv.weight"), nullptr);
}

TEST(VaeConfigTest, RefusesWhatItDoesNotImplementByName) {
  const auto refused = [](const char* key, json value) {
    json j = Tiny();
    j[key] = value;
    Result<VaeConfig> c = VaeConfig::FromJson(j);
    return c.ok() ? std::string("accepted") : c.status().message();
  };
  EXPECT_THAT(refused("use_tiling", true), HasSubstr("use_tiling: not an AutoencoderKL key"));
  EXPECT_THAT(refused("act_fn", "gelu"), HasSubstr("act_fn: only \"silu\" is supported"));
  EXPECT_THAT(refused("latents_mean", json::array({0.1, 0.2})), HasSubstr("latents_mean"));
  EXPECT_THAT(
      refused("down_block_types", json::array({"DownEncoderBlock2D", "AttnDownEncoderBlock2D"})),
      HasSubstr("down_block_types[1]: 'AttnDownEncoderBlock2D' is not supported"));
  EXPECT_THAT(refused("up_block_types", json::array({"UpDecoderBlock2D"})),
              HasSubstr("up_block_types has 1 blocks but block_out_channels 2"));
  EXPECT_THAT(refused("norm_num_groups", 3), HasSubstr("block_out_channels[0] = 4"));
  EXPECT_THAT(refused("_class_name", "VQModel"), HasSubstr("not AutoencoderKL"));
  EXPECT_THAT(refused("layers_per_block", "two"), HasSubstr("malformed AutoencoderKL config"));
  EXPECT_THAT(refused("latent_channels", 1e300),
              HasSubstr("latent_channels: 1e+300 is not an integer"));
  EXPECT_THAT(refused("block_out_channels", json::array({4, int64_t{1} << 40})),
              HasSubstr("block_out_channels: 1099511627776 is not an integer"));
  EXPECT_EQ(refused("force_upcast", false), "accepted");
}

class VaeLoadTest : public ::testing::Test {
 protected:
  // A diffusers folder of Tiny() with every tensor but `leave_out`.
  std::string Folder(const std::string& leave_out = "") {
    const std::filesystem::path dir = root() / "vae";
    EXPECT_EQ(testing::WriteVaeFolder(dir, Tiny(), 1, leave_out), "");
    return dir.string();
  }
  std::filesystem::path root() const { return temp_.path(); }
  TempDir temp_{"vae_load"};
};

TEST_F(VaeLoadTest, LoadsAFolderAPipelinesVaeAndTheFileItself) {
  const std::string dir = Folder();
  for (const std::string& path :
       {dir, temp_.path(), dir + "/diffusion_pytorch_model.safetensors"}) {
    Result<Vae> vae = Vae::Load(path);
    ASSERT_TRUE(vae.ok()) << path << ": " << vae.status().message();
    EXPECT_EQ(vae->source(), dir + "/diffusion_pytorch_model.safetensors");
    EXPECT_EQ(vae->tensors().total(), Vae::Tensors(vae->config()).total());
  }
}

TEST_F(VaeLoadTest, ErrorsNameTheFileAndWhatIsWrong) {
  const std::string dir = Folder("decoder.conv_out.bias");
  Result<Vae> vae = Vae::Load(dir);
  ASSERT_FALSE(vae.ok());
  EXPECT_THAT(vae.status().message(), HasSubstr("diffusion_pytorch_model.safetensors"));
  EXPECT_THAT(vae.status().message(), HasSubstr("'decoder.conv_out.bias' missing"));

  std::filesystem::remove(dir + "/config.json");
  EXPECT_THAT(Vae::Load(dir).status().message(), HasSubstr("cannot read its config"));
  EXPECT_THAT(Vae::Load((root() / "nothing").string()).status().message(),
              HasSubstr("no such file or directory"));
  std::filesystem::create_directories(root() / "empty");
  EXPECT_THAT(Vae::Load((root() / "empty").string()).status().message(),
              HasSubstr("no diffusion_pytorch_model.safetensors"));
}

TEST(VaeTest, RefusesImagesItsLevelsCannotHalve) {
  const Vae vae = RandomVae(*VaeConfig::FromJson(Tiny()), 2);
  std::vector<float> images(3 * 6 * 5), latents(100);
  const Status s = vae.Encode(images.data(), 1, 6, 5, VaePosterior::kMode, 0, 0, latents.data());
  EXPECT_THAT(s.message(),
              HasSubstr("images of 6×5: height and width must be positive multiples of 2"));
  EXPECT_FALSE(vae.Decode(latents.data(), 1, 0, 3, images.data()).ok());
}

// A posterior draw is mean + std · z with z ~ N(0, 1) from (seed, image index): the same
// bits for the same seed and index, whatever the batch; another seed draws other noise.
TEST(VaeTest, PosteriorDrawsAreAddressedBySeedAndImage) {
  const Vae vae = RandomVae(*VaeConfig::FromJson(Tiny()), 3);
  const int N = 3, H = 16, W = 16;
  std::vector<float> images(N * 3 * H * W);
  Rng rng(7, RngStream::kData);
  for (float& v : images)
    v = static_cast<float>(2 * rng.Uniform() - 1);
  const size_t per = 4 * (H / 2) * (W / 2);
  std::vector<float> mean(N * per), logvar(N * per), mode(N * per), a(N * per), b(N * per),
      c(N * per), last(per);
  ASSERT_TRUE(vae.EncodeMoments(images.data(), N, H, W, mean.data(), logvar.data()).ok());
  ASSERT_TRUE(vae.Encode(images.data(), N, H, W, VaePosterior::kMode, 5, 0, mode.data()).ok());
  ASSERT_TRUE(vae.Encode(images.data(), N, H, W, VaePosterior::kSample, 5, 0, a.data()).ok());
  ASSERT_TRUE(vae.Encode(images.data(), N, H, W, VaePosterior::kSample, 5, 0, b.data()).ok());
  ASSERT_TRUE(vae.Encode(images.data(), N, H, W, VaePosterior::kSample, 6, 0, c.data()).ok());
  ASSERT_TRUE(
      vae.Encode(images.data() + 2 * 3 * H * W, 1, H, W, VaePosterior::kSample, 5, 2, last.data())
          .ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(std::equal(last.begin(), last.end(), a.begin() + 2 * per));
  double sum = 0, squares = 0;
  for (size_t i = 0; i < mode.size(); ++i) {
    EXPECT_FLOAT_EQ(mode[i], mean[i] * 0.18215f);
    const double z = (a[i] / 0.18215 - mean[i]) / std::exp(0.5 * logvar[i]);
    sum += z;
    squares += z * z;
  }
  const double n = static_cast<double>(mode.size());  // 768 draws
  EXPECT_NEAR(sum / n, 0.0, 0.15);
  EXPECT_NEAR(squares / n, 1.0, 0.15);
}

}  // namespace
}  // namespace difftrain
