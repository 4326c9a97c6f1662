// Checks `difftrain export` against diffusers (0.27.2): a UNet fine-tuned here from a small
// Stable Diffusion 1.x style pipeline (tests/reference/sd_pipeline.py make … ldm1) for two steps
// is exported
//   - as a diffusers pipeline around the base's other parts: diffusers' StableDiffusionPipeline
//     loads it and samples what `difftrain sample --checkpoint` samples of the checkpoint (and
//     `sample --pretrained` of the export), the same x_T, prompt, negative prompt and DDIM steps;
//   - as an original single-file checkpoint with the base's VAE and CLIP text model (an SD 2.x
//     base's in OpenCLIP's layout): tensor for tensor the file tests/reference/ldm_checkpoint.py
//     writes of the exported pipeline, which diffusers' from_single_file reads back as that
//     pipeline;
//   - as a state dict: the exported UNet's tensors under the same names;
//   - of a LoRA run, as its LoRA file, which diffusers reads and fuses into the base pipeline to
//     sample what the run's checkpoint samples.
// In fp32 and fp16. And a refusal: an --out that exists (another family as diffusers:
// launch/sample_command_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/sd_pipeline.h"

namespace difftrain::testing {
namespace {

// The samples the tests compare: diffusers' pipeline's settings and difftrain's flags for them.
constexpr const char* kPrompt =
    "--prompt 'a photo of a boat' --negative-prompt blurry --cfg 5 --per-class 2 --steps 6";

class ExportReferenceTest : public SdPipelineReferenceTest {
 protected:
  static nlohmann::json Settings() {
    return {{"prompt", "a photo of a boat"},
            {"negative_prompt", "blurry"},
            {"steps", 6},
            {"guidance", 5.0},
            {"spacing", nullptr},
            {"images", 2},
            {"seed", 3}};
  }
  // Two training steps from `base`'s UNet, on synthetic latents and texts: the checkpoint's
  // directory, or "" on failure.
  std::string Train(const std::string& base, const std::string& sections = "") {
    nlohmann::json unet = nlohmann::json::parse(std::ifstream(base + "/unet/config.json"));
    unet["name"] = "unet";
    // SDXL's refiner says its five time ids in model_index.json, not in the UNet's config.
    const nlohmann::json index = nlohmann::json::parse(std::ifstream(base + "/model_index.json"));
    if (index.value("requires_aesthetics_score", false)) unet["requires_aesthetics_score"] = true;
    const std::string ckpt = (dir_ / "ckpt").string();
    const std::string job = (dir_ / "job.yaml").string();
    std::ofstream(job) << "model: " << unet.dump() << "\n"
                       << "diffusion: {schedule: scaled_linear, beta_start: 0.00085, beta_end: "
                          "0.012}\n"
                       << "data: {kind: synthetic}\n"
                       << "batch: {micro: 2, global: 2}\n"
                       << "optimizer: {lr: 0.001}\n"
                       << "train: {steps: 2, log_every: 1}\n"
                       << "checkpoint: {dir: " << ckpt << ", every: 2, init_from: " << base
                       << "/unet}\n"
                       << sections;
    const CommandResult trained =
        RunCommand(fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), job));
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    return trained.exit_code == 0 ? ckpt : "";
  }
  // `sample --checkpoint` of `ckpt`'s trained weights as diffusers' DDIM pipeline samples: the
  // text encoder of `base`, the x_T of `reference`, `prompt`'s flags; the latents, into `raw`.
  Result<io::SafetensorsFile> SampleCheckpoint(const std::string& ckpt, const std::string& base,
                                               const std::string& reference,
                                               const std::string& prompt, const std::string& raw) {
    const CommandResult r = RunCommand(fmt::format(
        "{} sample --checkpoint {} --weights model --text-encoder {} --initial-noise {} {} "
        "--sampler ddim --timestep-spacing leading --steps-offset 1 --set-alpha-to-one false "
        "--clip-denoised false --vae none --raw {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), ShellQuote(base), ShellQuote(reference),
        prompt, ShellQuote(raw)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return io::SafetensorsFile::Read(raw);
  }
  CommandResult Export(const std::string& ckpt, const std::string& args) {
    return RunCommand(fmt::format("{} export --checkpoint {} --weights model {} 2>&1",
                                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), args));
  }
  // `export --format single-file` around a pipeline folder `name` made of `base`'s parts (each
  // link: the part's name there, the part of `base` it is).
  CommandResult ExportSingleFileAround(
      const std::string& ckpt, const std::string& base, const std::string& name,
      const std::vector<std::pair<std::string, std::string>>& links) {
    const std::filesystem::path folder = dir_ / name;
    std::filesystem::create_directories(folder);
    for (const auto& [part, from] : links)
      std::filesystem::create_directory_symlink(base + "/" + from, folder / part);
    return Export(ckpt, fmt::format("--format single-file --out {} --pipeline {}",
                                    ShellQuote((dir_ / "x.safetensors").string()),
                                    ShellQuote(folder.string())));
  }
  // A LoRA run `ckpt` from `base`'s UNet: `export --format lora` writes the file diffusers'
  // lora_state_dict reads (tests/reference/lora.py fuses it), and the base pipeline with it
  // (`settings`) samples what `from_checkpoint` (`sample --checkpoint` of the run, given
  // diffusers' x_T and the latents' path) samples, which the base alone does not. The file.
  using CheckpointSampler = std::function<Result<io::SafetensorsFile>(const std::string& reference,
                                                                      const std::string& raw)>;
  std::string ExpectLoraFileSamplesAsTheRun(const std::string& base, const std::string& ckpt,
                                            nlohmann::json settings,
                                            const CheckpointSampler& from_checkpoint,
                                            const std::string& name) {
    const std::string lora = (dir_ / "pytorch_lora_weights.safetensors").string();
    const CommandResult r = Export(ckpt, "--format lora --out " + ShellQuote(lora));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    settings["lora"] = nlohmann::json::array({lora});
    settings["lora_scale"] = nlohmann::json::array({1.0});
    const std::string prompt = kPrompt;
    // difftrain's side of Compare: the base with the exported file fused (`sample --lora`).
    const Compared compared =
        Compare(base, settings, prompt + " --lora " + ShellQuote(lora), name + "_fused");
    EXPECT_TRUE(compared.got.has_value());
    if (!compared.got) return lora;
    Result<io::SafetensorsFile> run =
        from_checkpoint(compared.reference, (dir_ / (name + "_checkpoint.safetensors")).string());
    EXPECT_TRUE(run.ok());
    if (!run.ok()) return lora;
    const double checkpoint_error = RelativeL2(ReferenceTensor(*run, "images"), compared.latents);
    std::cout << name << ": the run's checkpoint against diffusers' base pipeline with its LoRA "
              << "file: relative L2 " << checkpoint_error << "\n";
    EXPECT_LE(checkpoint_error, kBound);
    Result<io::SafetensorsFile> from_base =
        Sample(base, compared.reference, prompt, name + "_base");
    EXPECT_TRUE(from_base.ok());
    if (!from_base.ok()) return lora;
    const double trained_away = RelativeL2(ReferenceTensor(*from_base, "images"), compared.latents);
    std::cout << name << ": the base pipeline against it: relative L2 " << trained_away << "\n";
    EXPECT_GT(trained_away, 10 * kBound);
    return lora;
  }
};

// The tensors of two safetensors files are the same: names, shapes and values (as F32), but
// for `except`, which only the second has.
void ExpectSameTensors(const std::string& got_path, const std::string& want_path,
                       const std::string& except = "") {
  Result<io::SafetensorsFile> got = io::SafetensorsFile::Read(got_path);
  Result<io::SafetensorsFile> want = io::SafetensorsFile::Read(want_path);
  ASSERT_TRUE(got.ok() && want.ok());
  std::vector<std::string> got_names = got->Names(), want_names = want->Names();
  std::sort(got_names.begin(), got_names.end());
  std::erase(want_names, except);
  std::sort(want_names.begin(), want_names.end());
  ASSERT_EQ(got_names, want_names);
  for (const std::string& name : want_names) {
    const std::vector<int64_t>& shape = want->Find(name)->shape;
    ASSERT_EQ(got->Find(name)->shape, shape) << name;
    EXPECT_EQ(ReferenceTensor(*got, name), ReferenceTensor(*want, name)) << name;
  }
}

TEST_F(ExportReferenceTest, ExportsWhatDiffusersAndOriginalCheckpointsLoad) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "ldm1");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base);
  ASSERT_FALSE(ckpt.empty());
  const auto do_export = [&](const std::string& args) { return Export(ckpt, args); };
  const std::string exported = (dir_ / "exported").string();
  CommandResult r = do_export("--out " + ShellQuote(exported) + " --pipeline " + ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // diffusers samples the export as difftrain the checkpoint (and the export).
  const nlohmann::json settings = Settings();
  const std::string prompt = kPrompt;
  const Compared compared = Compare(exported, settings, prompt, "exported");
  ASSERT_TRUE(compared.got.has_value());
  Result<io::SafetensorsFile> from_checkpoint = SampleCheckpoint(
      ckpt, base, compared.reference, prompt, (dir_ / "from_checkpoint.safetensors").string());
  ASSERT_TRUE(from_checkpoint.ok());
  const double checkpoint_error =
      RelativeL2(ReferenceTensor(*from_checkpoint, "images"), compared.latents);
  std::cout << "the checkpoint against diffusers' run of its export: relative L2 "
            << checkpoint_error << "\n";
  EXPECT_LE(checkpoint_error, kBound);
  // The base itself samples otherwise: the export holds the trained UNet.
  Result<io::SafetensorsFile> from_base = Sample(base, compared.reference, prompt, "from_base");
  ASSERT_TRUE(from_base.ok());
  const double trained_away = RelativeL2(ReferenceTensor(*from_base, "images"), compared.latents);
  std::cout << "the base pipeline against the export: relative L2 " << trained_away << "\n";
  EXPECT_GT(trained_away, 10 * kBound);

  // Without --pipeline: unet/ and scheduler/, which `sample --pretrained` reads as the
  // checkpoint's model and diffusion (its DDIM config: leading, steps_offset 1), sampling as the
  // checkpoint does, bit for bit.
  const std::string bare = (dir_ / "bare").string();
  r = do_export("--out " + ShellQuote(bare));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(bare + "/model_index.json"));
  Result<io::SafetensorsFile> from_bare = Sample(
      bare, compared.reference,
      prompt + " --text-encoder " + ShellQuote(base) + " --vae " + ShellQuote(base), "from_bare");
  ASSERT_TRUE(from_bare.ok());
  EXPECT_EQ(ReferenceTensor(*from_bare, "images"), ReferenceTensor(*from_checkpoint, "images"));

  // The single file: what ldm_checkpoint.py writes of the export (and diffusers reads back).
  const std::string single = (dir_ / "single.safetensors").string();
  r = do_export("--format single-file --out " + ShellQuote(single) + " --pipeline " +
                ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = (dir_ / "written.safetensors").string();
  const CommandResult wrote =
      RunScript("ldm_checkpoint.py", "write " + ShellQuote(exported) + " " + ShellQuote(written));
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  ExpectSameTensors(single, written);

  // The state dict: the export's UNet tensors.
  const std::string state = (dir_ / "state.safetensors").string();
  r = do_export("--format state-dict --out " + ShellQuote(state));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectSameTensors(state, exported + "/unet/diffusion_pytorch_model.safetensors");

  // The UNet in fp16: diffusers loads the halves and samples them as difftrain does, their
  // rounding moves the samples a little; the single file is ldm_checkpoint.py's of that export,
  // its UNet in F16 (the base's parts as the base stores them, F32).
  const std::string half = (dir_ / "exported16").string();
  r = do_export("--dtype fp16 --out " + ShellQuote(half) + " --pipeline " + ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Compared halves = Compare(half, settings, prompt, "exported16");
  ASSERT_TRUE(halves.got.has_value());
  const double rounding = RelativeL2(halves.latents, compared.latents);
  std::cout << "fp16 against fp32 weights: relative L2 " << rounding << "\n";
  EXPECT_GT(rounding, 0);
  EXPECT_LT(rounding, 1e-2);
  const std::string single16 = (dir_ / "single16.safetensors").string();
  r = do_export("--dtype fp16 --format single-file --out " + ShellQuote(single16) + " --pipeline " +
                ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written16 = (dir_ / "written16.safetensors").string();
  const CommandResult wrote16 =
      RunScript("ldm_checkpoint.py", "write " + ShellQuote(half) + " " + ShellQuote(written16));
  ASSERT_EQ(wrote16.exit_code, 0) << wrote16.output;
  ExpectSameTensors(single16, written16);
  Result<io::SafetensorsFile> read16 = io::SafetensorsFile::Read(single16);
  ASSERT_TRUE(read16.ok());
  for (const std::string& name : read16->Names()) {
    ASSERT_EQ(read16->Find(name)->dtype,
              name.starts_with("model.diffusion_model.") ? io::DType::kF16 : io::DType::kF32)
        << name;
  }

  r = do_export("--out " + ShellQuote(exported));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("exists: export writes a new file or folder"));
}

// A LoRA run from the base's UNet (diffusers' train_text_to_image_lora.py's targets, the
// attention projections, at rank 4 and alpha 8): `export --format lora` writes the file
// diffusers' lora_state_dict reads (tests/reference/lora.py fuses it), and the base pipeline
// with it samples what `sample --checkpoint` samples of the run, which the base alone does not.
TEST_F(ExportReferenceTest, ALoraRunExportsWhatDiffusersLoads) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "ldm1");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base, "lora: {rank: 4, alpha: 8}\n");
  ASSERT_FALSE(ckpt.empty());
  const std::string lora = ExpectLoraFileSamplesAsTheRun(
      base, ckpt, Settings(),
      [&](const std::string& reference, const std::string& raw) {
        return SampleCheckpoint(ckpt, base, reference, kPrompt, raw);
      },
      "lora");
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(lora);
  ASSERT_TRUE(file.ok());
  EXPECT_NE(file->Find("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0.lora."
                       "up.weight"),
            nullptr);
}

// Stable Diffusion XL: a fine-tune of an SDXL pipeline's UNet (its micro-conditioning trained
// on synthetic pooled texts) exported as a diffusers pipeline around the base's two text
// encoders, which StableDiffusionXLPipeline.from_pretrained samples as `sample --checkpoint`
// does, and as an original single file in SDXL's layout; and a LoRA run's adapters as the file
// diffusers' SDXL LoRA script writes, fused by diffusers into the base as `sample --lora` fuses
// it. Diffusers' side runs SDXL's Euler.
class SdxlExportTest : public ExportReferenceTest {
 protected:
  static nlohmann::json SdxlSettings() {
    nlohmann::json settings = Settings();
    settings["scheduler"] = "euler";
    return settings;
  }
  // `sample --checkpoint` as the pipeline samples: its Euler, and the time ids of its 16 px
  // pictures (the checkpoint knows no VAE).
  Result<io::SafetensorsFile> SampleSdxlCheckpoint(const std::string& ckpt, const std::string& base,
                                                   const std::string& reference,
                                                   const std::string& raw) {
    const CommandResult r = RunCommand(fmt::format(
        "{} sample --checkpoint {} --weights model --text-encoder {} --initial-noise {} {} "
        "--sampler euler --timestep-spacing leading --steps-offset 1 --original-size 16,16 "
        "--target-size 16,16 --vae none --raw {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), ShellQuote(base), ShellQuote(reference),
        kPrompt, ShellQuote(raw)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return io::SafetensorsFile::Read(raw);
  }
};

TEST_F(SdxlExportTest, AFineTuneExportsAsAnSdxlPipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base);
  ASSERT_FALSE(ckpt.empty());
  const std::string out = (dir_ / "sdxl-finetune").string();
  CommandResult r =
      Export(ckpt, fmt::format("--out {} --pipeline {}", ShellQuote(out), ShellQuote(base)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(out + "/text_encoder_2/config.json"));
  const std::string want = Reference(out, SdxlSettings(), "sdxl_export_want");
  Result<io::SafetensorsFile> reference = io::SafetensorsFile::Read(want);
  ASSERT_TRUE(reference.ok());
  Result<io::SafetensorsFile> got =
      SampleSdxlCheckpoint(ckpt, base, want, (dir_ / "sdxl_checkpoint.safetensors").string());
  ASSERT_TRUE(got.ok());
  const double error =
      RelativeL2(ReferenceTensor(*got, "images"), ReferenceTensor(*reference, "latents"));
  std::cout << "the exported SDXL pipeline in diffusers against sample --checkpoint: relative L2 "
            << error << "\n";
  EXPECT_LE(error, kBound);
  // The single file in SDXL's original layout (the addition embedding as label_emb, both text
  // models under conditioner.embedders): tensor for tensor what ldm_checkpoint.py writes of the
  // exported pipeline, which diffusers' conversions read back as that pipeline.
  const std::string single = (dir_ / "sdxl_single.safetensors").string();
  r = Export(ckpt, fmt::format("--format single-file --out {} --pipeline {}", ShellQuote(single),
                               ShellQuote(base)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = (dir_ / "sdxl_written.safetensors").string();
  const CommandResult wrote = RunScript(
      "ldm_checkpoint.py", "write " + ShellQuote(out) + " " + ShellQuote(written) + " sdxl");
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  ExpectSameTensors(single, written);
  // A base without SDXL's second text encoder is refused by name, not written half.
  r = ExportSingleFileAround(
      ckpt, base, "half",
      {{"vae", "vae"}, {"text_encoder", "text_encoder"}, {"tokenizer", "tokenizer"}});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("has no text_encoder_2/"));
}

// SDXL's refiner fine-tuned (five time ids, its one text encoder): as an original single file in
// the refiner's layout (its OpenCLIP model as conditioner.embedders.0), tensor for tensor what
// ldm_checkpoint.py writes of the exported refiner pipeline; a refiner's UNet around a base's
// two text encoders is refused by name.
TEST_F(SdxlExportTest, ARefinerFineTuneExportsAsItsOriginalFile) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "ldmxl_refiner");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base);
  ASSERT_FALSE(ckpt.empty());
  const std::string out = (dir_ / "refiner-finetune").string();
  CommandResult r =
      Export(ckpt, fmt::format("--out {} --pipeline {}", ShellQuote(out), ShellQuote(base)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string single = (dir_ / "refiner_single.safetensors").string();
  r = Export(ckpt, fmt::format("--format single-file --out {} --pipeline {}", ShellQuote(single),
                               ShellQuote(base)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = (dir_ / "refiner_written.safetensors").string();
  const CommandResult wrote = RunScript(
      "ldm_checkpoint.py", "write " + ShellQuote(out) + " " + ShellQuote(written) + " refiner");
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  ExpectSameTensors(single, written);
  // A base's two text encoders for the refiner's UNet.
  r = ExportSingleFileAround(ckpt, base, "two",
                             {{"vae", "vae"},
                              {"text_encoder_2", "text_encoder_2"},
                              {"tokenizer_2", "tokenizer_2"},
                              {"text_encoder", "text_encoder_2"}});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("and the UNet is SDXL's refiner"));
}

TEST_F(SdxlExportTest, ALoraRunExportsWhatDiffusersLoads) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base, "lora: {rank: 4, alpha: 8}\n");
  ASSERT_FALSE(ckpt.empty());
  ExpectLoraFileSamplesAsTheRun(
      base, ckpt, SdxlSettings(),
      [&](const std::string& reference, const std::string& raw) {
        return SampleSdxlCheckpoint(ckpt, base, reference, raw);
      },
      "sdxl_lora");
}

// An SD 2.x style base (OpenCLIP's text model, GELU): the single file holds the text model in
// OpenCLIP's layout (each layer's q, k, v as one in_proj), as ldm_checkpoint.py writes it of the
// exported pipeline (whose read-back by diffusers' create_text_encoder_from_open_clip_checkpoint
// gives the pipeline's text model), but for the text_projection a CLIPTextModel does not hold.
TEST_F(ExportReferenceTest, WritesAnSd2TextModelInOpenClipsLayout) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string base = MakePipeline(text_python, "ldm2");
  ASSERT_FALSE(base.empty());
  const std::string ckpt = Train(base);
  ASSERT_FALSE(ckpt.empty());
  const std::string exported = (dir_ / "exported").string();
  CommandResult r =
      Export(ckpt, "--out " + ShellQuote(exported) + " --pipeline " + ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string single = (dir_ / "single.safetensors").string();
  r = Export(
      ckpt, "--format single-file --out " + ShellQuote(single) + " --pipeline " + ShellQuote(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = (dir_ / "written.safetensors").string();
  const CommandResult wrote = RunScript("ldm_checkpoint.py", "write " + ShellQuote(exported) + " " +
                                                                 ShellQuote(written) + " openclip");
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  ExpectSameTensors(single, written, "cond_stage_model.model.text_projection");
}

}  // namespace
}  // namespace difftrain::testing
