// Checks difftrain's VAE (model/vae/vae.h) against diffusers' AutoencoderKL (0.27.2):
// tests/reference/vae.py builds a small one with random weights, saves it as diffusers does
// (and again under the older attention names) and computes, in float64, the posterior of two
// images and the decoding of two latents; the C++ model, loaded from those folders, must give
// them within fp32's rounding (relative L2 ≤ 3e-6; a wrong layer is off by far more).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/io/safetensors.h"
#include "model/vae/vae.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

struct VaeCase {
  const char* name;
  const char* config;  // AutoencoderKL(**config)
  int seed;
};

void PrintTo(const VaeCase& c, std::ostream* os) {
  *os << c.name;
}

// fp32's rounding through these models measures 4–9e-7; normalising with GroupNorm's eps at
// 1e-5 instead of the VAE's 1e-6 gives 1.6–2.1e-5.
constexpr double kBound = 3e-6;

class VaeReferenceTest : public DiffusersReference,
                         public ::testing::WithParamInterface<VaeCase> {};

TEST_P(VaeReferenceTest, EncodesAndDecodesAsDiffusers) {
  const CommandResult made =
      RunScript("vae.py", fmt::format("make {} {} {}", ShellQuote(dir_.string()),
                                      ShellQuote(GetParam().config), GetParam().seed));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Result<io::SafetensorsFile> expected =
      io::SafetensorsFile::Read((dir_ / "expected.safetensors").string());
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  std::vector<int64_t> image_shape, latent_shape;
  const std::vector<float> images = ReferenceTensor(*expected, "images", &image_shape);
  const std::vector<float> latents = ReferenceTensor(*expected, "latents", &latent_shape);
  const std::vector<float> mean = ReferenceTensor(*expected, "mean");
  const std::vector<float> logvar = ReferenceTensor(*expected, "logvar");
  const std::vector<float> decoded = ReferenceTensor(*expected, "decoded");

  std::vector<float> first_decoded;
  for (const char* folder : {"vae", "old"}) {
    SCOPED_TRACE(folder);
    Result<Vae> vae = Vae::Load((dir_ / folder).string());
    ASSERT_TRUE(vae.ok()) << vae.status().message();
    const int N = static_cast<int>(image_shape[0]);
    std::vector<float> got_mean(mean.size()), got_logvar(logvar.size());
    ASSERT_TRUE(vae->EncodeMoments(images.data(), N, static_cast<int>(image_shape[2]),
                                   static_cast<int>(image_shape[3]), got_mean.data(),
                                   got_logvar.data())
                    .ok());
    EXPECT_LE(RelativeL2(got_mean, mean), kBound);
    EXPECT_LE(RelativeL2(got_logvar, logvar), kBound);
    std::vector<float> got(decoded.size());
    ASSERT_TRUE(vae->Decode(latents.data(), static_cast<int>(latent_shape[0]),
                            static_cast<int>(latent_shape[2]), static_cast<int>(latent_shape[3]),
                            got.data())
                    .ok());
    EXPECT_LE(RelativeL2(got, decoded), kBound);
    if (first_decoded.empty()) {
      first_decoded = got;
    } else {
      EXPECT_EQ(got, first_decoded) << "the older names read other weights";
    }
  }
}

// Two levels with one resnet each (the decoder two), a conv shortcut where the channels
// change; three levels, two resnets each, grey images and three latent channels.
INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, VaeReferenceTest,
    ::testing::Values(
        VaeCase{"TwoLevels",
                R"({"block_out_channels": [8, 16], "norm_num_groups": 4,
                    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
                    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"]})",
                1},
        VaeCase{"ThreeLevelsGrey",
                R"({"block_out_channels": [8, 8, 16], "norm_num_groups": 4, "layers_per_block": 2,
                    "in_channels": 1, "out_channels": 1, "latent_channels": 3,
                    "scaling_factor": 0.5,
                    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D",
                                         "DownEncoderBlock2D"],
                    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D",
                                       "UpDecoderBlock2D"]})",
                2}),
    [](const ::testing::TestParamInfo<VaeCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace difftrain::testing
