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
//   - the base and the refiner as an ensemble of experts (denoising_end, denoising_start);
//   - the refiner's original single file (its OpenCLIP model as conditioner.embedders.0, its
//     UNet shaped as the refiner's: a last level without attention, deeper mid block), which
//     samples as the pipeline it was written of and fine-tunes from it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/testing/sd_pipeline.h"

namespace difftrain::testing {
namespace {

// The settings of sd_pipeline.py's run from the latents `start`: 10 Euler steps at strength 0.6,
// guidance 5, 2 images; difftrain's flags of the same (the sampler the pipeline's, Euler),
// `extra` after them.
nlohmann::json RefinerSettings(const std::string& start) {
  return {{"prompt", "a photo of a boat"},
          {"negative_prompt", nullptr},
          {"steps", 10},
          {"guidance", 5.0},
          {"spacing", nullptr},
          {"scheduler", "euler"},
          {"image", start},
          {"strength", 0.6},
          {"images", 2},
          {"seed", 3}};
}
std::string RefinerFlags(const std::string& start, const std::string& extra) {
  return fmt::format(
      "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 10 --image {} --strength 0.6 "
      "{}",
      ShellQuote(start), extra);
}

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
    nlohmann::json settings = RefinerSettings(start);
    settings.update(c.settings);
    const Compared compared = Compare(pipeline, settings, RefinerFlags(start, c.flags), c.name);
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

// SDXL's refiner as its original single file (sd_xl_refiner_1.0.safetensors' layout), written of
// a refiner pipeline by tests/reference/ldm_checkpoint.py and read back by diffusers' own
// conversions: `sample --pretrained` of the file, its text model read with the config and
// tokenizer of another pipeline's text_encoder_2/ (of other weights: the file's own must win),
// samples from an image as the pipeline does, and as the folder itself does bit for bit; the
// UNet config read from its tensors takes five time ids and the mid block's depth; fine-tuning
// starts from it.
TEST_F(SdPipelineReferenceTest, SamplesSdxlsRefinerFromItsOriginalFile) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "ldmxl_refiner");
  ASSERT_FALSE(pipeline.empty());
  const std::string single = (dir_ / "refiner.safetensors").string();
  const CommandResult written = RunScript(
      "ldm_checkpoint.py", "write " + ShellQuote(pipeline) + " " + ShellQuote(single) + " refiner");
  ASSERT_EQ(written.exit_code, 0) << written.output;
  // An SDXL base's text half of the same configs and tokenizers, other weights.
  const std::string other_dir = (dir_ / "other").string();
  const CommandResult other = RunCommand(fmt::format(
      "{} {} sdxl {} '[\"x\"]' 9 2>&1", ShellQuote(text_python),
      ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/text_encoder.py"), ShellQuote(other_dir)));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::string other_encoder = other_dir + "/pipeline";
  const std::string start = WriteStartLatents(pipeline, 2);
  const std::string flags = RefinerFlags(start, "--input-size 8");
  const Compared compared = Compare(pipeline, RefinerSettings(start),
                                    "--text-encoder " + ShellQuote(other_encoder) + " " + flags,
                                    "refiner_single_file", single);
  ASSERT_TRUE(compared.got.has_value());
  const nlohmann::json how = nlohmann::json::parse(compared.got->metadata().at("sampling"));
  EXPECT_EQ(how["sampler"], "euler");
  const nlohmann::json config = nlohmann::json::parse(compared.got->metadata().at("config"));
  EXPECT_EQ(config["requires_aesthetics_score"], true);
  EXPECT_EQ(config["transformer_layers_per_block"], nlohmann::json({1, 2, 2}));
  // The same weights and scheduler as the pipeline's folder: its samples, bit for bit.
  Result<io::SafetensorsFile> folder =
      Sample(pipeline, compared.reference, flags, "refiner_single_file_folder");
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  EXPECT_EQ(ReferenceTensor(*folder, "decoded"), ReferenceTensor(*compared.got, "decoded"));
  // The refiner pipeline's own folder gives its text model's config and tokenizer too.
  Result<io::SafetensorsFile> own =
      Sample(single, compared.reference, "--text-encoder " + ShellQuote(pipeline) + " " + flags,
             "refiner_single_file_own");
  ASSERT_TRUE(own.ok()) << own.status().message();
  EXPECT_EQ(ReferenceTensor(*own, "decoded"), ReferenceTensor(*compared.got, "decoded"));

  // Fine-tuning starts from it.
  ExpectInitFromHoldsItsUNet(compared.got->metadata().at("config"), single, pipeline);
}

// SDXL's base and refiner as an ensemble of expert denoisers, diffusers' denoising_end and
// denoising_start: the base's steps down to the cutoff of 0.7 (7 of 10), its latents left
// noisy there, and the refiner's steps from that cutoff on latents taken as they are (a
// multistep solver's orders warming up again there, as from set_begin_index); each against its
// diffusers pipeline given the same inputs, with SDXL's Euler and with DDIM (unclipped),
// DPM-Solver++, DEIS and UniPC from its config. (The two small pipelines are made apart, so the
// refiner starts from latents of the kind, not from this base's.)
class SdxlExpertsTest : public SdPipelineReferenceTest {
 protected:
  // The samplers cut so, and difftrain's flags for each (DDIM unclipped, as its settings say).
  static std::vector<std::pair<std::string, std::string>> Samplers() {
    return {{"euler", "--sampler euler"},
            {"ddim", "--sampler ddim --clip-denoised false"},
            {"dpmsolver", "--sampler dpmsolver"},
            {"deis", "--sampler deis"},
            {"unipc", "--sampler unipc"}};
  }
  // difftrain's `sample` of `pipeline` with `flags` (the sampler's among them) into
  // `name`.safetensors against the latents of diffusers' run of `settings`; the relative L2.
  double Run(const std::string& pipeline, const nlohmann::json& settings, const std::string& flags,
             const std::string& name) {
    const std::string want = Reference(pipeline, settings, name + "_want");
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = RunCommand(
        fmt::format("{} sample --pretrained {} --prompt 'a photo of a boat' --cfg 5 --per-class 2 "
                    "--steps 10 {} --raw {} 2>&1",
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
  static nlohmann::json Settings(const std::string& scheduler = "euler") {
    return {{"prompt", "a photo of a boat"},
            {"negative_prompt", nullptr},
            {"steps", 10},
            {"guidance", 5.0},
            {"spacing", nullptr},
            {"scheduler", scheduler},
            {"clip_sample", scheduler == "ddim" ? nlohmann::json(false) : nlohmann::json()},
            {"images", 2},
            {"seed", 3}};
  }
};

TEST_F(SdxlExpertsTest, TheBaseStopsAtItsDenoisingEnd) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(pipeline.empty());
  for (const auto& [sampler, flags] : Samplers()) {
    SCOPED_TRACE(sampler);
    nlohmann::json settings = Settings(sampler);
    settings["denoising_end"] = 0.7;
    const std::string want = Reference(pipeline, settings, sampler + "_noise_source");
    EXPECT_LE(
        Run(pipeline, settings, flags + " --denoising-end 0.7 --initial-noise " + ShellQuote(want),
            sampler + "_base_end"),
        kBound);
  }
  // A sampler of two calls a step, and --out for latents left noisy, are refused.
  const CommandResult heun = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --sampler heun --denoising-end 0.7 --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline),
      ShellQuote((dir_ / "heun.safetensors").string())));
  EXPECT_EQ(heun.exit_code, 2) << heun.output;
  EXPECT_THAT(heun.output, ::testing::HasSubstr("and unipc samplers, not Heun"));
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
  for (const auto& [sampler, flags] : Samplers()) {
    SCOPED_TRACE(sampler);
    nlohmann::json settings = Settings(sampler);
    settings["image"] = noisy;
    settings["strength"] = 0.3;  // the pipeline's; a denoising start overrides it
    settings["denoising_start"] = 0.7;
    EXPECT_LE(Run(pipeline, settings, flags + " --denoising-start 0.7 --image " + ShellQuote(noisy),
                  sampler + "_refiner_start"),
              kBound);
  }
  const CommandResult picture = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --denoising-start 0.7 --image {} --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.png").string()),
      ShellQuote((dir_ / "y.safetensors").string())));
  EXPECT_EQ(picture.exit_code, 2) << picture.output;
  EXPECT_THAT(picture.output, ::testing::HasSubstr("takes the noisy latents of a --denoising-end"));
}

}  // namespace
}  // namespace difftrain::testing
