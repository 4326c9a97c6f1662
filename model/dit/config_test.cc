#include "model/dit/config.h"

#include <cmath>
#include <map>

#include <limits>

#include <gtest/gtest.h>

namespace difftrain {
namespace {

TEST(DiTConfigTest, XL2HasTheReferenceParameterCount) {
  const DiTConfig c = *DiTConfigByName("DiT-XL/2", 32);
  EXPECT_EQ(ParameterCount(c), 675129632);
  EXPECT_EQ(ParameterCount(c) - TrainableParameterCount(c), 256 * 1152);  // pos_embed
}

// Forward GMACs per sample at 256 px from the DiT paper (Table 1 / REFERENCE.md).
TEST(DiTConfigTest, ForwardMacsMatchThePaperTable) {
  const std::map<std::string, double> paper = {
      {"DiT-S/8", 0.36},  {"DiT-S/4", 1.41},  {"DiT-S/2", 6.06},   {"DiT-B/8", 1.42},
      {"DiT-B/4", 5.57},  {"DiT-B/2", 23.01}, {"DiT-L/8", 5.01},   {"DiT-L/4", 19.70},
      {"DiT-L/2", 80.70}, {"DiT-XL/8", 7.39}, {"DiT-XL/4", 29.04}, {"DiT-XL/2", 118.62}};
  for (const auto& [name, gmacs] : paper) {
    const double ours = ForwardMacsPerSample(*DiTConfigByName(name, 32)) / 1e9;
    // 0.5%, or half a unit of the table's last printed digit for the smallest entries.
    EXPECT_LE(std::abs(ours - gmacs), std::max(0.005 * gmacs, 0.005)) << name << ": " << ours;
  }
  // DiT-XL/2 at 512 px (64x64 latents).
  EXPECT_NEAR(ForwardMacsPerSample(*DiTConfigByName("DiT-XL/2", 64)) / 1e9, 524.6, 0.005 * 524.6);
  // Training FLOPs = 6 x forward MACs: about 712 GFLOP per DiT-XL/2 sample at 256 px.
  EXPECT_NEAR(TrainingFlopsPerSample(*DiTConfigByName("DiT-XL/2", 32)) / 1e9, 712, 1);
}

TEST(DiTConfigTest, RejectsBadNamesAndShapes) {
  EXPECT_FALSE(DiTConfigByName("DiT-M/2").ok());
  EXPECT_FALSE(DiTConfigByName("DiT-S/3").ok());
  DiTConfig c = *DiTConfigByName("DiT-S/2");
  c.num_heads = 5;
  const Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("num_heads"), std::string::npos) << s.message();
  c = *DiTConfigByName("DiT-S/2");
  c.input_size = 31;
  EXPECT_NE(c.Validate().message().find("patch_size"), std::string::npos);
  // A depth the fuzz target found: `parallel: auto` planned its billion blocks for minutes.
  c = *DiTConfigByName("DiT-S/2");
  c.depth = 1000010001;
  EXPECT_NE(c.Validate().message().find("model.depth 1000010001 exceeds 4096 blocks"),
            std::string::npos)
      << c.Validate().message();
  c.depth = 4096;
  EXPECT_TRUE(c.Validate().ok());
}

// Inputs that broke the job-spec fuzz target: the derived sizes are ints, and a shape whose
// tokens or MLP width overflow one was accepted (and overflowed where it was used).
TEST(DiTConfigTest, RejectsShapesWhoseDerivedSizesOverflowAnInt) {
  DiTConfig c = *DiTConfigByName("DiT-S/2");
  c.input_size = 50000;
  c.patch_size = 1;
  EXPECT_NE(c.Validate().message().find("tokens (input_size / patch_size)^2 = 2500000000"),
            std::string::npos)
      << c.Validate().message();
  for (double ratio :
       {1e300, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    c = *DiTConfigByName("DiT-S/2");
    c.mlp_ratio = ratio;
    EXPECT_NE(c.Validate().message().find("MLP width"), std::string::npos) << ratio;
  }
  c = *DiTConfigByName("DiT-S/2");
  c.in_channels = 1 << 30;
  EXPECT_FALSE(c.Validate().ok());
  c = *DiTConfigByName("DiT-S/2");
  c.num_classes = std::numeric_limits<int>::max();
  EXPECT_FALSE(c.Validate().ok());
  c = *DiTConfigByName("DiT-S/2");
  c.input_size = 46340;  // 46,340² tokens still fit
  c.patch_size = 1;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate().message();
}

TEST(DiTConfigTest, NullClassRowOnlyWithLabelDropout) {
  DiTConfig c = *DiTConfigByName("DiT-S/2");
  EXPECT_EQ(c.label_rows(), 1001);
  c.class_dropout_prob = 0;
  EXPECT_EQ(c.label_rows(), 1000);
}

TEST(DiTConfigTest, JsonRoundTrip) {
  const DiTConfig c = *DiTConfigByName("DiT-B/4", 16);
  Result<DiTConfig> back = DiTConfig::FromJson(c.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), c.ToJson());
}

}  // namespace
}  // namespace difftrain
