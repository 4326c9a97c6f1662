// Checks SDXL's refiner against diffusers 0.27.2: a StableDiffusionXLImg2ImgPipeline of
// text_encoder_2 alone, whose UNet takes five time ids (the aesthetic score in place of the target
// size: requires_aesthetics_score in model_index.json) and whose unconditional text is the empty
// prompt's (force_zeros_for_empty_prompt false), made small by tests/reference/sd_pipeline.py
// make … refiner:
//   - `difftrain sample --pretrained` of the folder from an image samples what the pipeline
//     samples from the same noise: the default aesthetic scores (6, and 2.5 for the
//     unconditional half), others given, a negative prompt;
//   - a training step of its UNet (`debug-dump`) is diffusers' UNet's, forward and backward;
//   - --target-size, which the refiner's time ids have not, is refused;
//   - the base and the refiner as an ensemble of experts (denoising_end, denoising_start).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/testing/sd_pipeline.h"

namespace difftrain::testing {
namespace {

TEST_F(SdPipelineReferenceTest, SamplesAsSdxlsRefiner) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "refiner");
  ASSERT_FALSE(pipeline.empty());
  const std::string start = WriteStartLatents(pipeline, 2);
  struct Case {
    const char* name;
    nlohmann::json settings;  // beyond the common ones
    std::string flags;
  };
  for (const Case& c : {
           Case{"refiner", nlohmann::json::object(), ""},
           Case{"refiner_scores",
                {{"aesthetic_score", 7.5}, {"negative_aesthetic_score", 1.0}},
                "--aesthetic-score 7.5 --negative-aesthetic-score 1"},
           Case{"refiner_negative", {{"negative_prompt", "blurry"}}, "--negative-prompt blurry"},
       }) {
    nlohmann::json settings = {{"prompt", "a photo of a boat"},
                               {"negative_prompt", nullptr},
                               {"steps", 10},
                               {"guidance", 5.0},
                               {"spacing", nullptr},
                               {"scheduler", "euler"},
                               {"image", start},
                               {"strength", 0.6},
                               {"images", 2},
                               {"seed", 3}};
    settings.update(c.settings);
    const std::string flags = fmt::format(
        "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --sampler euler --steps 10 --image {} "
        "--strength 0.6 {}",
        ShellQuote(start), c.flags);
    const Compared compared = Compare(pipeline, settings, flags, c.name);
    EXPECT_TRUE(compared.got.has_value()) << c.name;
  }

  // Its UNet's training step: five time ids into add_embedding, forward and backward.
  nlohmann::json unet = nlohmann::json::parse(std::ifstream(pipeline + "/unet/config.json"));
  unet["name"] = "unet";
  unet["requires_aesthetics_score"] = true;
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "model: " << unet.dump() << "\n";
  const std::string dump = (dir_ / "dump.safetensors").string();
  const CommandResult dumped = RunCommand(fmt::format(
      "{} debug-dump --config {} --init-from {} --seed 1 --batch 2 --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job), ShellQuote(pipeline), ShellQuote(dump)));
  ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
  Result<io::SafetensorsFile> dumped_file = io::SafetensorsFile::Read(dump);
  ASSERT_TRUE(dumped_file.ok());
  // A whole 64 px picture at aesthetic score 6, as the pipeline's default.
  EXPECT_EQ(ReferenceTensor(*dumped_file, "input.time_ids"),
            (std::vector<float>{64, 64, 0, 0, 6, 64, 64, 0, 0, 6}));
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(dump));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;

  const CommandResult refused = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --image {} --target-size 64,64 --vae none --raw {} "
      "2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote(start),
      ShellQuote((dir_ / "refused.safetensors").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output,
              ::testing::HasSubstr("--target-size: SDXL's refiner has an aesthetic score"));
}

// SDXL's base and refiner as an ensemble of expert denoisers, diffusers' denoising_end and
// denoising_start: the base's Euler steps down to the cutoff of 0.7 (7 of 10), its latents left
// noisy there, and the refiner's steps from that cutoff on latents taken as they are; each
// against its diffusers pipeline given the same inputs. (The two small pipelines are made
// apart, so the refiner starts from latents of the kind, not from this base's.)
class SdxlExpertsTest : public SdPipelineReferenceTest {
 protected:
  // difftrain's `sample` of `pipeline` with `flags` into `name`.safetensors against the
  // latents of diffusers' run of `settings`; the relative L2.
  double Run(const std::string& pipeline, const nlohmann::json& settings, const std::string& flags,
             const std::string& name) {
    const std::string want = Reference(pipeline, settings, name + "_want");
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = RunCommand(
        fmt::format("{} sample --pretrained {} --prompt 'a photo of a boat' --cfg 5 --per-class 2 "
                    "--sampler euler --steps 10 {} --raw {} 2>&1",
                    ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), flags, ShellQuote(raw)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    Result<io::SafetensorsFile> got = io::SafetensorsFile::Read(raw);
    Result<io::SafetensorsFile> wanted = io::SafetensorsFile::Read(want);
    EXPECT_TRUE(got.ok() && wanted.ok());
    if (!got.ok() || !wanted.ok()) return 1;
    const double error =
        RelativeL2(ReferenceTensor(*got, "images"), ReferenceTensor(*wanted, "latents"));
    std::cout << name << ": relative L2 latents " << error << "\n";
    return error;
  }
  static nlohmann::json Settings() {
    return {{"prompt", "a photo of a boat"},
            {"negative_prompt", nullptr},
            {"steps", 10},
            {"guidance", 5.0},
            {"spacing", nullptr},
            {"scheduler", "euler"},
            {"images", 2},
            {"seed", 3}};
  }
};

TEST_F(SdxlExpertsTest, TheBaseStopsAtItsDenoisingEnd) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(pipeline.empty());
  nlohmann::json settings = Settings();
  settings["denoising_end"] = 0.7;
  const std::string want = Reference(pipeline, settings, "noise_source");
  EXPECT_LE(Run(pipeline, settings, "--denoising-end 0.7 --initial-noise " + ShellQuote(want),
                "base_end"),
            kBound);
  // A sampler other than Euler, and --out for latents left noisy, are refused.
  const CommandResult ddim = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --sampler ddim --denoising-end 0.7 --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline),
      ShellQuote((dir_ / "ddim.safetensors").string())));
  EXPECT_EQ(ddim.exit_code, 2) << ddim.output;
  EXPECT_THAT(ddim.output, ::testing::HasSubstr("is for the euler sampler (SDXL's), not DDIM"));
  const CommandResult png = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --denoising-end 0.7 --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.png").string())));
  EXPECT_EQ(png.exit_code, 2) << png.output;
  EXPECT_THAT(png.output, ::testing::HasSubstr("write them with --raw alone"));
}

TEST_F(SdxlExpertsTest, TheRefinerStartsAtItsDenoisingStart) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "refiner");
  ASSERT_FALSE(pipeline.empty());
  const std::string noisy = WriteStartLatents(pipeline, 2);
  nlohmann::json settings = Settings();
  settings["image"] = noisy;
  settings["strength"] = 0.3;  // the pipeline's; a denoising start overrides it
  settings["denoising_start"] = 0.7;
  EXPECT_LE(Run(pipeline, settings, "--denoising-start 0.7 --image " + ShellQuote(noisy),
                "refiner_start"),
            kBound);
  const CommandResult picture = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --denoising-start 0.7 --image {} --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.png").string()),
      ShellQuote((dir_ / "y.safetensors").string())));
  EXPECT_EQ(picture.exit_code, 2) << picture.output;
  EXPECT_THAT(picture.output, ::testing::HasSubstr("takes the noisy latents of a --denoising-end"));
}

}  // namespace
}  // namespace difftrain::testing
