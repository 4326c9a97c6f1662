// Checks FuseLora (model/io/lora.h) against diffusers' (0.27.2) reading of LoRA files
// (tests/reference/lora.py): a small UNet2DConditionModel, random LoRAs of every Linear and
// Conv2d of its blocks in kohya's form (F16, alphas 1, 2 and 8, LoCon 3×3 convolutions),
// in diffusers' older form (converted by diffusers' own kohya conversion: attention processors'
// to_q_lora …) and in peft's (plus conv_in and the time embedding), each fused by diffusers'
// naming (lora_state_dict, convert_unet_state_dict_to_peft) and peft's delta weight in float64.
// difftrain fuses the same files into the UNet's parameter table: every weight within float32's
// rounding of the reference (relative L2 ≤ 1e-6, measured below 1e-7), and the LoRA moves the
// weights by far more.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/lora.h"
#include "model/io/safetensors.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

class LoraReferenceTest : public DiffusersReference {};

TEST_F(LoraReferenceTest, FusesAsDiffusersReadsEachForm) {
  const std::string unet_dir = (dir_ / "unet").string();
  const CommandResult unet = RunScript("lora.py", "unet " + ShellQuote(unet_dir) + " 4");
  ASSERT_EQ(unet.exit_code, 0) << unet.output;
  const CommandResult made = RunScript(
      "lora.py", fmt::format("make {} {} 5", ShellQuote(unet_dir), ShellQuote(dir_.string())));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Result<UNetConfig> config =
      UNetConfig::FromJson(nlohmann::json::parse(std::ifstream(unet_dir + "/config.json")));
  ASSERT_TRUE(config.ok()) << config.status().message();
  const UNetPlan plan(*config);
  Result<io::SafetensorsFile> base =
      io::SafetensorsFile::Read(unet_dir + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(base.ok()) << base.status().message();
  std::vector<float> weights(plan.table.total());
  for (const TensorSpec& t : plan.table.tensors())
    ASSERT_TRUE(base->CopyAsF32(t.name, t.shape, weights.data() + t.offset).ok()) << t.name;

  for (const auto& [form, modules] :
       std::vector<std::pair<std::string, int>>{{"kohya", 79}, {"diffusers", 79}, {"peft", 83}}) {
    SCOPED_TRACE(form);
    const std::string lora = (dir_ / (form + ".safetensors")).string();
    const std::string want_path = (dir_ / ("fused_" + form + ".safetensors")).string();
    const CommandResult fused_reference =
        RunScript("lora.py", fmt::format("fuse {} {} 0.8 {}", ShellQuote(unet_dir),
                                         ShellQuote(lora), ShellQuote(want_path)));
    ASSERT_EQ(fused_reference.exit_code, 0) << fused_reference.output;
    Result<io::SafetensorsFile> want = io::SafetensorsFile::Read(want_path);
    ASSERT_TRUE(want.ok()) << want.status().message();
    std::vector<float> got = weights;
    Result<io::LoraFused> fused =
        io::FuseLora(lora, 0.8, {{io::kLoraUNet, &plan.table, got.data()}});
    ASSERT_TRUE(fused.ok()) << fused.status().message();
    EXPECT_EQ(fused->modules, modules);
    EXPECT_EQ(fused->rank, 4);
    double worst = 0, moved = 0;
    for (const TensorSpec& t : plan.table.tensors()) {
      const std::vector<float> g(got.begin() + t.offset, got.begin() + t.offset + t.numel);
      const std::vector<float> w = ReferenceTensor(*want, t.name);
      const std::vector<float> before(weights.begin() + t.offset,
                                      weights.begin() + t.offset + t.numel);
      const double error = RelativeL2(g, w);
      EXPECT_LE(error, 1e-6) << t.name;
      worst = std::max(worst, error);
      if (t.name.ends_with(".weight")) moved = std::max(moved, RelativeL2(before, w));
    }
    std::cout << form << ": " << fused->modules << " modules, worst relative L2 " << worst
              << ", the LoRA moves a weight by up to " << moved << "\n";
    EXPECT_GT(moved, 0.1);
  }
}

}  // namespace
}  // namespace difftrain::testing
