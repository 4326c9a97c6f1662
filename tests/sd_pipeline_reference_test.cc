// Checks `difftrain sample --pretrained PIPELINE` against diffusers' StableDiffusionPipeline
// (0.27.2, with transformers 4.40.2) end to end: a small Stable Diffusion 2 style pipeline
// (CLIP text model and tokenizer from tests/reference/text_encoder.py sd, UNet, VAE and a
// v-prediction DDIMScheduler with leading spacing, steps_offset 1, set_alpha_to_one false),
// written by the pipeline's save_pretrained, is sampled by both from the same x_T (diffusers'
// `latents`, difftrain's --initial-noise): the prompt through the tokenizer and text encoder,
// guidance against the empty or a negative prompt (and its rescale), every DDIM (PNDM, Euler, Heun,
// DPM-Solver++ multistep and singlestep, DEIS, UniPC, KDPM2, with Karras σ's; LMS; Euler ancestral
// and DPM++ SDE Karras with difftrain's step noise; TCD with γ 0.3 likewise) step and the VAE
// decoding; and a latent consistency model's pipeline (LatentConsistencyModelPipeline: LCM,
// guidance embedded) likewise; image to image (StableDiffusionImg2ImgPipeline, every scheduler
// from its begin index); an original single-file checkpoint of a pipeline (its
// from_single_file reading). Within fp32's rounding: relative L2 ≤ 1e-5 (measured 0.8–4.2e-6);
// the last step to ᾱ = 1 in place of ᾱ_0 alone moves the latents by more than 10 times that, and so
// does leaving out the guidance rescale.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/data/text_table.h"
#include "model/diffusion/guided_model.h"
#include "model/io/image.h"
#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "model/vae/vae.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/sd_pipeline.h"

namespace difftrain::testing {
namespace {

TEST_F(SdPipelineReferenceTest, SamplesAsStableDiffusionPipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python);
  ASSERT_FALSE(pipeline.empty());
  // A kohya LoRA of the pipeline's UNet and text encoder (tests/reference/lora.py).
  const std::string lora_dir = (dir_ / "lora").string();
  const CommandResult lora = RunScript(
      "lora.py", fmt::format("make {} {} 6 {}", ShellQuote(pipeline + "/unet"),
                             ShellQuote(lora_dir), ShellQuote(pipeline + "/text_encoder")));
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  const std::string kohya = lora_dir + "/kohya.safetensors", peft = lora_dir + "/peft.safetensors";
  struct Case {
    const char* name;
    nlohmann::json settings;  // sd_pipeline.py run's
    std::string flags;        // the same for difftrain sample
  };
  const std::vector<Case> cases = {
      // A kohya LoRA at 0.7 and a peft one at 0.3, of the UNet and the text encoder (diffusers'
      // reading of each, fused as peft does).
      {"lora",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 6},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"lora", {kohya, peft}},
        {"lora_scale", {0.7, 0.3}},
        {"images", 2},
        {"seed", 14}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 6 --lora " + ShellQuote(kohya) +
           " --lora " + ShellQuote(peft) + " --lora-scale 0.7,0.3"},
      // The pipeline's own scheduler, guided against the empty prompt.
      {"scheduler",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 10},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"images", 2}},
       "--prompt 'a photo of a boat' --per-class 2 --steps 10"},
      // from_config(…, timestep_spacing="trailing") and a negative prompt.
      {"trailing",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry, dark"},
        {"steps", 7},
        {"guidance", 3.0},
        {"spacing", "trailing"},
        {"images", 3},
        {"seed", 1}},
       "--prompt 'a photo of a boat' --negative-prompt 'blurry, dark' --cfg 3 "
       "--timestep-spacing trailing --per-class 3 --steps 7"},
      // A portrait, 24 × 16 pixels (12 × 8 latents) from the 16 × 16 UNet: diffusers' height and
      // width.
      {"portrait",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 6},
        {"guidance", 4.0},
        {"spacing", nullptr},
        {"height", 24},
        {"width", 16},
        {"images", 2},
        {"seed", 12}},
       "--prompt 'a photo of a boat' --cfg 4 --per-class 2 --steps 6 --height 24 --width 16"},
      // The same wide, with Euler.
      {"landscape_euler",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 6},
        {"guidance", 4.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"height", 16},
        {"width", 32},
        {"images", 2},
        {"seed", 13}},
       "--prompt 'a photo of a boat' --cfg 4 --per-class 2 --steps 6 --sampler euler "
       "--width 32"},
      // SD 1.x's scheduler: PNDM's pseudo linear multistep.
      {"pndm",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 8},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "pndm"},
        {"images", 2},
        {"seed", 2}},
       "--prompt 'a photo of a boat' --sampler pndm --cfg 5 --per-class 2 --steps 8"},
      // SDXL's scheduler: Euler, here with the pipeline's leading spacing.
      {"euler",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry"},
        {"steps", 9},
        {"guidance", 6.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"images", 2},
        {"seed", 3}},
       "--prompt 'a photo of a boat' --negative-prompt blurry --sampler euler --cfg 6 "
       "--per-class 2 --steps 9"},
      // DPM-Solver++ 2M, the pipeline's leading spacing.
      {"dpmsolver",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 12},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "dpmsolver"},
        {"images", 2},
        {"seed", 4}},
       "--prompt 'a photo of a boat' --sampler dpmsolver --per-class 2 --steps 12"},
      // Heun: 6 steps, 11 model calls.
      {"heun",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry"},
        {"steps", 6},
        {"guidance", 4.0},
        {"spacing", nullptr},
        {"scheduler", "heun"},
        {"images", 2},
        {"seed", 5}},
       "--prompt 'a photo of a boat' --negative-prompt blurry --sampler heun --cfg 4 "
       "--per-class 2 --steps 6"},
      // UniPC on Karras σ's, with guidance rescale.
      {"unipc_karras_rescale",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 10},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "unipc"},
        {"karras", true},
        {"guidance_rescale", 0.7},
        {"images", 2},
        {"seed", 6}},
       "--prompt 'a photo of a boat' --sampler unipc --karras-sigmas true "
       "--guidance-rescale 0.7 --per-class 2 --steps 10"},
      // LMS (a Stable Diffusion 1.x choice): 8 steps, the last 4 slopes combined.
      {"lms",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 8},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "lms"},
        {"images", 2},
        {"seed", 7}},
       "--prompt 'a photo of a boat' --sampler lms --per-class 2 --steps 8"},
      // KDPM2 ("DPM2 Karras"): 7 steps on Karras σ's, 13 model calls, 6 of them at midpoints.
      {"kdpm2_karras",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 7},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "kdpm2"},
        {"karras", true},
        {"images", 2},
        {"seed", 9}},
       "--prompt 'a photo of a boat' --sampler kdpm2 --karras-sigmas true --per-class 2 "
       "--steps 7"},
      // DPM-Solver++ singlestep, 9 steps in groups of 2 (the last alone): its linspace
      // spacing, not the pipeline's leading, which DPMSolverSinglestepScheduler has no key for.
      {"dpmsolver_singlestep",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 9},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "dpmsolver_singlestep"},
        {"images", 2},
        {"seed", 10}},
       "--prompt 'a photo of a boat' --sampler dpmsolver_singlestep --per-class 2 --steps 9"},
      // DEIS, 10 steps on the pipeline's leading spacing (steps_offset 1), which its class has.
      {"deis",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry"},
        {"steps", 10},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "deis"},
        {"images", 2},
        {"seed", 11}},
       "--prompt 'a photo of a boat' --negative-prompt blurry --sampler deis --cfg 5 "
       "--per-class 2 --steps 10"},
      // DPM++ SDE Karras: 7 steps, 13 model calls, two ancestral half steps each, diffusers'
      // Brownian tree replaced by the noise difftrain's sampler draws (StepNoise below).
      {"dpmsolver_sde_karras",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 7},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "dpmsolver_sde"},
        {"karras", true},
        {"images", 2},
        {"seed", 12}},
       "--prompt 'a photo of a boat' --sampler dpmsolver_sde --karras-sigmas true --per-class 2 "
       "--steps 7 --seed 5"},
      // TCD, 4 steps of γ 0.3 (TCDScheduler.step's eta, difftrain's default): its own
      // timesteps, the pipeline's eta and step noise difftrain's.
      {"tcd",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 4},
        {"guidance", 3.0},
        {"spacing", nullptr},
        {"scheduler", "tcd"},
        {"eta", 0.3},
        {"images", 2},
        {"seed", 13}},
       "--prompt 'a photo of a boat' --sampler tcd --cfg 3 --per-class 2 --seed 5"},
      // DDPM (DDPMScheduler.from_config of the pipeline's DDIM config: clip_sample false,
      // leading with steps_offset 1, its posterior variance), 8 ancestral steps whose noise is
      // difftrain's (StepNoise below); the last, from timestep 1 to ᾱ = 1, adds none.
      {"ddpm",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 8},
        {"guidance", 7.5},
        {"spacing", nullptr},
        {"scheduler", "ddpm"},
        {"images", 2},
        {"seed", 14}},
       "--prompt 'a photo of a boat' --sampler ddpm --per-class 2 --steps 8 --seed 5"},
      // Euler ancestral ("Euler a"), 9 steps: diffusers' step noise is the noise difftrain's
      // sampler draws from --seed (StepNoise below).
      {"euler_ancestral",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry"},
        {"steps", 9},
        {"guidance", 6.0},
        {"spacing", nullptr},
        {"scheduler", "euler_ancestral"},
        {"images", 2},
        {"seed", 8}},
       "--prompt 'a photo of a boat' --negative-prompt blurry --sampler euler_ancestral --cfg 6 "
       "--per-class 2 --steps 9 --seed 5"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    nlohmann::json settings = c.settings;
    if (settings["scheduler"] == "euler_ancestral" || settings["scheduler"] == "dpmsolver_sde" ||
        settings["scheduler"] == "tcd" || settings["scheduler"] == "ddpm") {
      // One draw a step (DPM++ SDE: two).
      settings["step_noise"] = WriteStepNoise(pipeline, settings["steps"], settings["images"],
                                              settings["scheduler"] == "dpmsolver_sde" ? 2 : 1);
    }
    const Compared compared = Compare(pipeline, settings, c.flags, c.name);
    ASSERT_TRUE(compared.got.has_value());
    const std::string& reference = compared.reference;
    const std::vector<float>& latents = compared.latents;
    if (c.name == std::string("scheduler")) {
      Result<io::SafetensorsFile> off =
          Sample(pipeline, reference, c.flags + " --set-alpha-to-one true", "off");
      ASSERT_TRUE(off.ok()) << off.status().message();
      EXPECT_GT(RelativeL2(ReferenceTensor(*off, "images"), latents), 10 * kBound);
    }
    if (c.name == std::string("lora")) {
      std::string plain = c.flags;
      plain.erase(plain.find(" --lora "));
      Result<io::SafetensorsFile> off = Sample(pipeline, reference, plain, "no_lora");
      ASSERT_TRUE(off.ok()) << off.status().message();
      const double moved = RelativeL2(ReferenceTensor(*off, "images"), latents);
      std::cout << "without the LoRA: relative L2 latents " << moved << "\n";
      EXPECT_GT(moved, 10 * kBound);
    }
    if (c.name == std::string("unipc_karras_rescale")) {
      std::string unrescaled = c.flags;
      unrescaled.erase(unrescaled.find("--guidance-rescale 0.7"), 22);
      Result<io::SafetensorsFile> off = Sample(pipeline, reference, unrescaled, "unrescaled");
      ASSERT_TRUE(off.ok()) << off.status().message();
      const double moved = RelativeL2(ReferenceTensor(*off, "images"), latents);
      std::cout << "without the guidance rescale: relative L2 latents " << moved << "\n";
      EXPECT_GT(moved, 10 * kBound);
    }
  }
}

// Image to image as StableDiffusionImg2ImgPipeline: the image's latents (one for both samples,
// or one each) noised to the first of the last ⌊steps × strength⌋ steps by the scheduler's
// add_noise (diffusers' noise the samples' x_T, --initial-noise), then those steps, the
// multistep solvers warming up from there (set_begin_index): DDIM, PNDM (from its second
// timestep too, whose repeated call diffusers makes), Euler on Karras σ's, Heun, LMS (whose
// first step takes the leading coefficient of a higher order, as diffusers' zip), KDPM2,
// DPM-Solver++ multistep and singlestep (starting inside a group of 2), DEIS, UniPC, Euler
// ancestral and TCD with difftrain's step noise. A strength of 1 differs from sampling x_T.
TEST_F(SdPipelineReferenceTest, StartsFromAnImageAsStableDiffusionImg2ImgPipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python);
  ASSERT_FALSE(pipeline.empty());
  const std::string one = WriteStartLatents(pipeline, 1), two = WriteStartLatents(pipeline, 2);
  const std::vector<ImageCase> cases = {
      {"ddim", 10, 0.6, 6, ""},
      {"pndm", 8, 0.75, 6, ""},
      {"pndm", 8, 0.875, 7, ""},
      {"euler", 8, 0.5, 4, "--karras-sigmas true"},
      {"heun", 6, 0.5, 3, ""},
      {"lms", 10, 0.7, 7, ""},
      {"kdpm2", 6, 0.67, 4, ""},
      {"dpmsolver", 10, 0.6, 6, ""},
      {"dpmsolver_singlestep", 10, 0.7, 7, ""},
      {"deis", 10, 0.6, 6, ""},
      {"unipc", 10, 0.6, 6, ""},
      {"euler_ancestral", 8, 0.5, 4, "--seed 5"},
      {"tcd", 4, 0.5, 2, "--seed 5"},
  };
  int seed = 30;
  for (const ImageCase& c : cases) {
    const std::string name = fmt::format("image_{}_{}", c.scheduler, c.run);
    SCOPED_TRACE(name);
    const std::string& image = seed % 2 ? two : one;
    const auto [settings, flags] = ImageCaseRun(pipeline, c, image, seed++);
    const Compared compared = Compare(pipeline, settings, flags, name);
    ASSERT_TRUE(compared.got.has_value());
    const nlohmann::json how = nlohmann::json::parse(compared.got->metadata().at("sampling"));
    EXPECT_EQ(how["strength"], c.strength);
    EXPECT_EQ(how["image"], nlohmann::json::array({image}));
  }
  // At strength 1 the image is still there (√ᾱ of the first timestep, not 0).
  Result<io::SafetensorsFile> full =
      Sample(pipeline, (dir_ / "image_ddim_6_want.safetensors").string(),
             "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 10 --image " +
                 ShellQuote(one) + " --strength 1",
             "image_full");
  ASSERT_TRUE(full.ok()) << full.status().message();
  Result<io::SafetensorsFile> plain =
      Sample(pipeline, (dir_ / "image_ddim_6_want.safetensors").string(),
             "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 10", "image_none");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const double moved =
      RelativeL2(ReferenceTensor(*full, "images"), ReferenceTensor(*plain, "images"));
  std::cout << "strength 1 against x_T alone: relative L2 latents " << moved << "\n";
  EXPECT_GT(moved, 10 * kBound);
  // A picture samples at its own size, as diffusers' img2img pipeline does, rounded down to
  // one the UNet takes (35 × 26 pixels: latents 17 × 13 → 16 × 12, 32 × 24 pixels), as given by
  // --height/--width.
  {
    const std::string picture = (dir_ / "wide.png").string();
    std::vector<uint8_t> rgb(26 * 35 * 3);
    for (size_t i = 0; i < rgb.size(); ++i)
      rgb[i] = static_cast<uint8_t>((i * 13 + i / 105 * 7) % 256);
    ASSERT_TRUE(io::WritePng(picture, rgb.data(), 35, 26, 3).ok());
    const auto run = [&](const std::string& flags, const std::string& name) {
      const std::string raw = (dir_ / (name + ".safetensors")).string();
      const CommandResult r = RunCommand(fmt::format(
          "{} sample --pretrained {} --prompt boat --steps 4 --per-class 2 --image {} {} --raw {} "
          "2>&1",
          ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote(picture), flags,
          ShellQuote(raw)));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return std::make_pair(r.output, io::SafetensorsFile::Read(raw));
    };
    const auto [log, own] = run("", "own_size");
    EXPECT_THAT(log, ::testing::HasSubstr("'s size: 32x24 pixels (16x12 latents"));
    ASSERT_TRUE(own.ok());
    std::vector<int64_t> shape;
    const std::vector<float> latents = ReferenceTensor(*own, "images", &shape);
    EXPECT_EQ(shape, (std::vector<int64_t>{2, 4, 12, 16}));
    const auto [given_log, given] = run("--height 24 --width 32", "given_size");
    ASSERT_TRUE(given.ok());
    EXPECT_EQ(ReferenceTensor(*given, "images"), latents);
  }
  // A strength that leaves no step.
  const CommandResult refused = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt boat --steps 10 --image {} --strength 0.05 --raw {} "
      "2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote(one),
      ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("= 0 of the 10 steps"));
}

// Textual inversion as diffusers' load_textual_inversion: a one-vector embedding in diffusers'
// form (its tensor named by its token) and a three-vector one in A1111's (emb_params, its token
// given), in the prompt and in the negative prompt, where the three-vector token stands for
// itself and its _1 and _2 (maybe_convert_prompt). Without the files the tokens are plain text
// and the samples move; a token the vocabulary has is refused.
TEST_F(SdPipelineReferenceTest, LoadsTextualInversionsAsDiffusers) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python);
  ASSERT_FALSE(pipeline.empty());
  const int D = nlohmann::json::parse(std::ifstream(pipeline + "/text_encoder/config.json"))
                    .at("hidden_size")
                    .get<int>();
  std::vector<float> one(D), three(3 * D);
  for (int i = 0; i < D; ++i)
    one[i] = static_cast<float>(std::sin(0.7 * i) * 0.8);
  for (size_t i = 0; i < three.size(); ++i)
    three[i] = static_cast<float>(std::cos(0.3 * i + 1) * 0.6);
  io::SafetensorsWriter diffusers_form, a1111_form;
  diffusers_form.AddF32("<boat-style>", {D}, one.data());
  a1111_form.AddF32("emb_params", {3, D}, three.data());
  const std::string style = (dir_ / "learned_embeds.safetensors").string();
  const std::string ship = (dir_ / "ship.safetensors").string();
  ASSERT_TRUE(diffusers_form.WriteAtomic(style).ok());
  ASSERT_TRUE(a1111_form.WriteAtomic(ship).ok());
  const nlohmann::json settings = {
      {"prompt", "a photo of <boat-style> and <ship>, sailing"},
      {"negative_prompt", "blurry <ship>"},
      {"steps", 6},
      {"guidance", 5.0},
      {"spacing", nullptr},
      {"textual_inversion", nlohmann::json::array({nlohmann::json::array({style, nullptr}),
                                                   nlohmann::json::array({ship, "<ship>"})})},
      {"images", 2},
      {"seed", 15}};
  const std::string prompts =
      "--prompt 'a photo of <boat-style> and <ship>, sailing' --negative-prompt 'blurry <ship>' "
      "--cfg 5 --per-class 2 --steps 6";
  const std::string flags = prompts + " --textual-inversion " + ShellQuote(style) +
                            " --textual-inversion " + ShellQuote(ship) +
                            " --textual-inversion-token '<boat-style>' "
                            "--textual-inversion-token '<ship>'";
  const Compared compared = Compare(pipeline, settings, flags, "textual_inversion");
  ASSERT_TRUE(compared.got.has_value());
  Result<io::SafetensorsFile> plain =
      Sample(pipeline, compared.reference, prompts, "textual_inversion_none");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const double moved = RelativeL2(ReferenceTensor(*plain, "images"), compared.latents);
  std::cout << "without the embeddings: relative L2 latents " << moved << "\n";
  EXPECT_GT(moved, 10 * kBound);
  const CommandResult refused = RunCommand(
      fmt::format("{} sample --pretrained {} --prompt boat --steps 2 --textual-inversion {} "
                  "--textual-inversion-token '<|endoftext|>' --raw {} 2>&1",
                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote(style),
                  ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("the token '<|endoftext|>' is already in"));
}

// A mask picture of width × height (not the pipeline's 16 × 16, so stretched): a white disc
// with soft edges on black, in colour, moved by `shift`; its path.
std::string WriteMask(const std::filesystem::path& dir, int width, int height, double shift) {
  std::vector<uint8_t> pixels(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double dx = x - width * (0.4 + shift), dy = y - height * 0.55;
      const double inside =
          std::clamp(1.2 - std::sqrt(dx * dx + dy * dy) / (0.3 * width), 0.0, 1.0);
      for (int c = 0; c < 3; ++c)
        pixels[(size_t(y) * width + x) * 3 + c] =
            static_cast<uint8_t>(255 * inside * (1 - 0.2 * c));
    }
  }
  const std::string path = (dir / fmt::format("mask{}.png", shift)).string();
  EXPECT_TRUE(io::WritePng(path, pixels.data(), width, height, 3).ok());
  return path;
}

// Inpainting as StableDiffusionInpaintPipeline, with the SD pipeline's 4-channel UNet ("sd":
// after every step the latents outside the mask are the image's, noised by the scheduler's
// add_noise to the next timestep, and after the last the image's own) and with an inpainting
// UNet of 9 input channels ("inpaint": the latents, the mask and the masked image's latents).
// The mask a picture of another size with soft edges (diffusers' resize, binarisation and
// nearest interpolation); strength 1 (from x_T, the pipeline's default) and below (the image
// noised to the first step that runs); one mask for all samples or one each; every scheduler.
class InpaintReferenceTest : public SdPipelineReferenceTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(InpaintReferenceTest, InpaintsAsStableDiffusionInpaintPipeline) {
  const std::string kind = GetParam();
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, kind);
  ASSERT_FALSE(pipeline.empty());
  const bool nine = kind == "inpaint";
  const std::string one = WriteStartLatents(pipeline, 1, nine);
  const std::string two = WriteStartLatents(pipeline, 2, nine);
  const std::string mask = WriteMask(dir_, 20, 18, 0.0), other = WriteMask(dir_, 20, 18, 0.25);
  std::vector<ImageCase> cases = {
      {"ddim", 8, 1.0, 8, ""},      {"ddim", 10, 0.6, 6, ""},
      {"dpmsolver", 8, 1.0, 8, ""}, {"euler", 8, 0.75, 6, "--karras-sigmas true"},
      {"pndm", 8, 1.0, 8, ""},
  };
  if (!nine) {
    const std::vector<ImageCase> more = {
        {"pndm", 8, 0.75, 6, ""},
        {"heun", 6, 1.0, 6, ""},
        {"lms", 8, 1.0, 8, ""},
        {"kdpm2", 6, 1.0, 6, ""},
        {"kdpm2", 6, 0.67, 4, "--karras-sigmas true"},
        {"dpmsolver_singlestep", 9, 1.0, 9, ""},
        {"deis", 8, 0.75, 6, ""},
        {"unipc", 8, 1.0, 8, ""},
        {"euler_ancestral", 8, 1.0, 8, "--seed 5"},
        {"dpmsolver_sde", 6, 1.0, 6, "--seed 5 --karras-sigmas true"},
        {"tcd", 4, 1.0, 4, "--seed 5"},
    };
    cases.insert(cases.end(), more.begin(), more.end());
  }
  int seed = 50;
  for (const ImageCase& c : cases) {
    const std::string name = fmt::format("{}_{}_{}", kind, c.scheduler, c.run);
    SCOPED_TRACE(name);
    // Odd seeds: an image and a mask per sample (diffusers takes one mask_image for all: the
    // second sample's is the first's, here given twice).
    const bool each = seed % 2;
    const std::string& image = each ? two : one;
    std::string masks = "--mask " + ShellQuote(mask);
    if (each) masks += " --mask " + ShellQuote(mask);
    auto [settings, flags] = ImageCaseRun(pipeline, c, image, seed++, masks);
    settings["mask"] = mask;
    const Compared compared = Compare(pipeline, settings, flags, name);
    ASSERT_TRUE(compared.got.has_value());
    const nlohmann::json how = nlohmann::json::parse(compared.got->metadata().at("sampling"));
    EXPECT_EQ(how["strength"], c.strength);
    EXPECT_EQ(how["mask"].size(), each ? 2u : 1u);
  }
  // Another mask moves the samples; so does (for the inpainting UNet) another masked image.
  const std::string noise = (dir_ / fmt::format("{}_ddim_8_want.safetensors", kind)).string();
  const std::string flags =
      "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --sampler ddim --steps 8 --image " +
      ShellQuote(one) + " --mask " + ShellQuote(other);
  Result<io::SafetensorsFile> moved = Sample(pipeline, noise, flags, kind + "_other_mask");
  ASSERT_TRUE(moved.ok()) << moved.status().message();
  Result<io::SafetensorsFile> want = io::SafetensorsFile::Read(noise);
  ASSERT_TRUE(want.ok());
  const double other_mask =
      RelativeL2(ReferenceTensor(*moved, "images"), ReferenceTensor(*want, "latents"));
  std::cout << kind << ": another mask moves the latents by " << other_mask << "\n";
  EXPECT_GT(other_mask, 10 * kBound);
  if (nine) {
    // Pictures: the image and, per sample, the image masked (0 where painted) encoded by the
    // pipeline's VAE (draws 0 and 2³² + k of the seed) sample as those latents given as tensors.
    const std::string picture = (dir_ / "picture.png").string();
    std::vector<uint8_t> rgb(18 * 20 * 3);
    for (size_t i = 0; i < rgb.size(); ++i)
      rgb[i] = static_cast<uint8_t>((i * 29 + i / 60 * 13) % 256);
    ASSERT_TRUE(io::WritePng(picture, rgb.data(), 20, 18, 3).ok());
    Result<Vae> vae = Vae::Load(pipeline + "/vae");
    ASSERT_TRUE(vae.ok()) << vae.status().message();
    std::vector<float> pixels(3 * 16 * 16), painted(16 * 16), masked(2 * pixels.size());
    PrepareStretched(*io::ReadImage(picture), 16, 16, 3, pixels.data());
    PrepareMask(*io::ReadImage(mask), 16, 16, painted.data());
    for (size_t e = 0; e < masked.size(); ++e)
      masked[e] = painted[e % painted.size()] >= 0.5f ? 0.0f : pixels[e % pixels.size()];
    std::vector<float> x0(4 * 8 * 8), masked_latents(2 * x0.size());
    ASSERT_TRUE(vae->Encode(pixels.data(), 1, 16, 16, VaePosterior::kSample, 7, 0, x0.data()).ok());
    ASSERT_TRUE(vae->Encode(masked.data(), 2, 16, 16, VaePosterior::kSample, 7, uint64_t{1} << 32,
                            masked_latents.data())
                    .ok());
    io::SafetensorsWriter encoded;
    encoded.AddF32("images", {1, 4, 8, 8}, x0.data());
    encoded.AddF32("masked_image_latents", {2, 4, 8, 8}, masked_latents.data());
    const std::string latents = (dir_ / "picture.safetensors").string();
    ASSERT_TRUE(encoded.WriteAtomic(latents).ok());
    const std::string picture_flags =
        "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 6 --strength 0.5 --seed 7 "
        "--height 16 --width 16 --mask " +
        ShellQuote(mask) + " --image ";
    Result<io::SafetensorsFile> from_picture =
        Sample(pipeline, noise, picture_flags + ShellQuote(picture), "from_picture");
    Result<io::SafetensorsFile> from_latents =
        Sample(pipeline, noise, picture_flags + ShellQuote(latents), "from_latents");
    ASSERT_TRUE(from_picture.ok() && from_latents.ok());
    const double picture_error = RelativeL2(ReferenceTensor(*from_picture, "images"),
                                            ReferenceTensor(*from_latents, "images"));
    std::cout << "the picture against its encodings: relative L2 " << picture_error << "\n";
    EXPECT_LE(picture_error, 1e-6);
  }
  // Without its mask an inpainting UNet has nothing to see; a mask wants an image.
  const CommandResult unmasked =
      RunCommand(fmt::format("{} sample --pretrained {} --prompt boat --steps 2 {} --raw {} 2>&1",
                             ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline),
                             nine ? "--image " + ShellQuote(one) : "--mask " + ShellQuote(mask),
                             ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(unmasked.exit_code, 2) << unmasked.output;
  EXPECT_THAT(unmasked.output,
              ::testing::HasSubstr(nine ? "give the --image to paint and its --mask"
                                        : "--mask is for inpainting an --image"));
}

INSTANTIATE_TEST_SUITE_P(Unets, InpaintReferenceTest, ::testing::Values("sd", "inpaint"));

// An original Stable Diffusion checkpoint (one model.safetensors in the CompVis layout) of a
// pipeline, written by tests/reference/ldm_checkpoint.py and read back by diffusers'
// from_single_file as that pipeline's UNet and VAE: difftrain samples the file (its UNet's
// config from its tensors, its own VAE, diffusers' single-file DDIM scheduler, its own text
// model with the config and tokenizer of --text-encoder, here another CLIP of other weights) as
// diffusers samples the pipeline. SD 1.x's layout (8 heads, convolutional projections, the CLIP
// text model, SD 1.x's quick GELU, under transformers' names), SD 2.x's (heads of 64 channels,
// linear projections, the text model as OpenCLIP's, q, k and v in one in_proj) and SDXL's (the
// addition embedding as label_emb, both text models under conditioner.embedders, the second as
// OpenCLIP's with its projection transposed; diffusers' single-file Euler scheduler, as
// StableDiffusionXLPipeline samples the pipeline). Fine-tuning starts from the file too.
class SingleFileReferenceTest : public SdPipelineReferenceTest,
                                public ::testing::WithParamInterface<const char*> {};

TEST_P(SingleFileReferenceTest, SamplesAsDiffusersSamplesThePipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, GetParam());
  ASSERT_FALSE(pipeline.empty());
  const std::string single = (dir_ / "model.safetensors").string();
  // SD 2.x's file holds its text model as OpenCLIP's, SDXL's its two.
  const bool sd2 = GetParam() == std::string("ldm2");
  const bool xl = GetParam() == std::string("ldmxl");
  const CommandResult written =
      RunScript("ldm_checkpoint.py", "write " + ShellQuote(pipeline) + " " + ShellQuote(single) +
                                         (sd2  ? " openclip"
                                          : xl ? " sdxl"
                                               : ""));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  // Text encoders of the same configs and tokenizers and other weights: the file's own must win.
  const std::string other_dir = ShellQuote((dir_ / "other").string());
  const CommandResult other = RunCommand(
      fmt::format("{} {} {} '[\"x\"]' 9 2>&1", ShellQuote(text_python),
                  ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/text_encoder.py"),
                  xl ? "sdxl " + other_dir : fmt::format("sd {} {}", other_dir, sd2 ? 2 : 1)));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::string other_encoder = (dir_ / "other" / "pipeline").string();
  nlohmann::json settings = {{"prompt", "a photo of a boat"},
                             {"negative_prompt", nullptr},
                             {"steps", 8},
                             {"guidance", 5.0},
                             {"spacing", nullptr},
                             {"images", 2},
                             {"seed", 40}};
  if (xl) settings["scheduler"] = "euler";
  const std::string flags =
      "--input-size 8 --prompt 'a photo of a boat' --cfg 5 --per-class 2 "
      "--steps 8";
  const std::string name = std::string("single_file_") + GetParam();
  const Compared compared =
      Compare(pipeline, settings, "--text-encoder " + ShellQuote(other_encoder) + " " + flags, name,
              single);
  ASSERT_TRUE(compared.got.has_value());
  const nlohmann::json how = nlohmann::json::parse(compared.got->metadata().at("sampling"));
  EXPECT_EQ(how["sampler"], xl ? "euler" : "ddim");
  EXPECT_EQ(how["vae"], single);
  // The same weights and scheduler as the pipeline's folder: its samples, bit for bit.
  Result<io::SafetensorsFile> folder =
      Sample(pipeline, compared.reference, flags, name + "_folder");
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  EXPECT_EQ(ReferenceTensor(*folder, "decoded"), ReferenceTensor(*compared.got, "decoded"));

  // Fine-tuning starts from it too.
  ExpectInitFromHoldsItsUNet(compared.got->metadata().at("config"), single, pipeline);
  // Without a text encoder's folder there is no tokenizer to embed the prompt with.
  const CommandResult refused = RunCommand(fmt::format(
      "{} sample --pretrained {} --input-size 8 --prompt boat --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(single), ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output,
              ::testing::HasSubstr("an original Stable Diffusion checkpoint holds no tokenizer"));
  if (xl) {  // SDXL's two text models take both encoders' configs and tokenizers
    const CommandResult one = RunCommand(fmt::format(
        "{} sample --pretrained {} --input-size 8 --prompt boat --text-encoder {} --raw {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), ShellQuote(single),
        ShellQuote(other_encoder + "/text_encoder"), ShellQuote((dir_ / "x.st").string())));
    EXPECT_EQ(one.exit_code, 2) << one.output;
    EXPECT_THAT(one.output, ::testing::HasSubstr("holds SDXL's two text models"));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SingleFileReferenceTest,
                         ::testing::Values("ldm1", "ldm2", "ldmxl"));

// A guidance-distilled (LCM) pipeline: LatentConsistencyModelPipeline's UNet takes the guidance
// scale as an embedding (time_cond_proj_dim) in one conditional pass, its LCMScheduler steps on
// the distillation's timesteps with fresh noise at each (difftrain's, as above). The pipeline's
// defaults (LCM, 4 steps, guidance 8.5) and flags over them; the same sample with guidance 1
// (w = 0, an embedding of sin 0 and cos 1) moves, so the embedding reaches the model. From an
// image as LatentConsistencyModelImg2ImgPipeline: 4 steps of the first ⌊50 × 0.6⌋ timesteps of
// the distillation's schedule.
TEST_F(SdPipelineReferenceTest, SamplesAsLatentConsistencyModelPipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "lcm");
  ASSERT_FALSE(pipeline.empty());
  const std::string start = WriteStartLatents(pipeline, 1);
  struct Case {
    const char* name;
    nlohmann::json settings;  // sd_pipeline.py run's
    std::string flags;        // the same for difftrain sample
  };
  const std::vector<Case> cases = {
      {"lcm_defaults",
       {{"prompt", "a photo of a boat"}, {"steps", 4}, {"guidance", 8.5}, {"images", 2}},
       "--prompt 'a photo of a boat' --per-class 2 --seed 5"},
      {"lcm_30",
       {{"prompt", "a photo of a boat"},
        {"steps", 6},
        {"guidance", 2.0},
        {"original_inference_steps", 30},
        {"images", 2},
        {"seed", 1}},
       "--prompt 'a photo of a boat' --per-class 2 --steps 6 --cfg 2 "
       "--original-inference-steps 30 --seed 5"},
      {"lcm_image",
       {{"prompt", "a photo of a boat"},
        {"steps", 4},
        {"guidance", 8.5},
        {"image", start},
        {"strength", 0.6},
        {"images", 2},
        {"seed", 2}},
       "--prompt 'a photo of a boat' --per-class 2 --image " + ShellQuote(start) +
           " --strength 0.6 --seed 5"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    nlohmann::json settings = c.settings;
    settings["step_noise"] = WriteStepNoise(pipeline, settings["steps"], settings["images"], 1);
    const Compared compared = Compare(pipeline, settings, c.flags, c.name);
    ASSERT_TRUE(compared.got.has_value());
    const nlohmann::json how = nlohmann::json::parse(compared.got->metadata().at("sampling"));
    EXPECT_EQ(how["sampler"], "lcm");
    EXPECT_EQ(how["embedded_guidance"], settings["guidance"]);
    EXPECT_EQ(how["cfg_scale"], 1.0);
  }
  EXPECT_GT(MovedFrom(pipeline, "lcm_defaults", cases[0].flags + " --cfg 1",
                      "guidance 1 in place of 8.5"),
            10 * kBound);
  // Classifier-free guidance's flags have nothing to steer.
  const CommandResult refused = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt boat --negative-prompt blurry --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("takes its guidance scale as an embedding"));
  // SDXL's micro-conditioning flags are refused for a UNet without it.
  const CommandResult no_time_ids = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt boat --original-size 16,16 --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(no_time_ids.exit_code, 2) << no_time_ids.output;
  EXPECT_THAT(no_time_ids.output,
              ::testing::HasSubstr("--original-size: for SDXL's micro-conditioning"));
}

// Stable Diffusion XL (StableDiffusionXLPipeline): its two text encoders' penultimate states
// side by side and the second's pooled embedding, the UNet's micro-conditioning (pooled text
// and time ids), guidance against zeros (force_zeros_for_empty_prompt) or a negative prompt, its
// Euler scheduler; the time ids from the samples' size, or from diffusers' original_size,
// crops_coords_top_left and target_size; a textual inversion of SDXL's form (clip_l and clip_g,
// two vectors each) loaded into both encoders.
TEST_F(SdPipelineReferenceTest, SamplesAsStableDiffusionXLPipeline) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(pipeline.empty());
  const std::string start = WriteStartLatents(pipeline, 1);
  const std::string mask = WriteMask(dir_, 20, 18, 0.0);
  // A kohya LoRA as sd-scripts name SDXL's modules (the original layout's input_blocks, …) and
  // both text encoders' (lora_te1_, lora_te2_), read by diffusers' own conversions.
  const std::string kohya = (dir_ / "sdxl_kohya.safetensors").string();
  const CommandResult lora =
      RunScript("lora.py", fmt::format("sdxl {} {} 8", ShellQuote(pipeline), ShellQuote(kohya)));
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  // An SDXL textual inversion: two vectors for each encoder, clip_l and clip_g.
  const std::string inversion = (dir_ / "sdxl_embedding.safetensors").string();
  {
    io::SafetensorsWriter embedding;
    std::vector<std::vector<float>> rows;
    for (const char* part : {"text_encoder", "text_encoder_2"}) {
      const int64_t D = nlohmann::json::parse(std::ifstream(pipeline + "/" + part + "/config.json"))
                            .at("hidden_size")
                            .get<int64_t>();
      std::vector<float>& v = rows.emplace_back(2 * D);
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(std::sin(0.9 * i + rows.size()) * 0.7);
      embedding.AddF32(rows.size() == 1 ? "clip_l" : "clip_g", {2, D}, v.data());
    }
    ASSERT_TRUE(embedding.WriteAtomic(inversion).ok());
  }
  struct Case {
    const char* name;
    nlohmann::json settings;  // sd_pipeline.py run's
    std::string flags;        // the same for difftrain sample
    double bound = kBound;
  };
  const std::vector<Case> cases = {
      {"sdxl_defaults",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 8},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"images", 2},
        {"seed", 3}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 8"},
      {"sdxl_negative_conditioned",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry, dark"},
        {"steps", 6},
        {"guidance", 4.0},
        {"spacing", nullptr},
        {"scheduler", "dpmsolver"},
        {"original_size", {40, 24}},
        {"crops_coords_top_left", {4, 2}},
        {"target_size", {16, 12}},
        {"images", 2},
        {"seed", 4}},
       "--prompt 'a photo of a boat' --negative-prompt 'blurry, dark' --cfg 4 --per-class 2 "
       "--steps 6 --sampler dpmsolver --original-size 40,24 --crop-top-left 4,2 "
       "--target-size 16,12"},
      // DDIM from SDXL's Euler config, as DDIMScheduler.from_config reads it: its default
      // clip_sample true clips each x0 of the latents to [−1, 1], and the steps go on along the
      // model's own ε. Clipped, the path is ill-conditioned: diffusers' own fp32 run lands
      // 1.6e-5 from its float64 run (8 steps: 8.4e-5; 20: 0.14), difftrain 1.5e-5.
      {"sdxl_ddim",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 4},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "ddim"},
        {"images", 2},
        {"seed", 10}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 4 --sampler ddim",
       5e-5},
      {"sdxl_portrait",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 6},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"height", 24},
        {"width", 16},
        {"images", 2},
        {"seed", 5}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 6 --height 24 --width 16"},
      // Image to image (StableDiffusionXLImg2ImgPipeline): its default strength 0.3.
      {"sdxl_image",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 10},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"image", start},
        {"strength", 0.3},
        {"images", 2},
        {"seed", 7}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 10 --image " +
           ShellQuote(start)},
      // Inpainting (StableDiffusionXLInpaintPipeline): its default strength 0.9999.
      {"sdxl_inpaint",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", nullptr},
        {"steps", 10},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"image", start},
        {"mask", mask},
        {"strength", 0.9999},
        {"images", 2},
        {"seed", 9}},
       "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 10 --image " +
           ShellQuote(start) + " --mask " + ShellQuote(mask)},
      {"sdxl_kohya_lora",
       {{"prompt", "a photo of a boat"},
        {"negative_prompt", "blurry"},
        {"steps", 6},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"lora", {kohya}},
        {"lora_scale", {0.8}},
        {"images", 2},
        {"seed", 6}},
       "--prompt 'a photo of a boat' --negative-prompt blurry --cfg 5 --per-class 2 --steps 6 "
       "--lora " +
           ShellQuote(kohya) + " --lora-scale 0.8"},
      {"sdxl_textual_inversion",
       {{"prompt", "a photo of <boat-style>, sailing"},
        {"negative_prompt", "blurry <boat-style>"},
        {"steps", 6},
        {"guidance", 5.0},
        {"spacing", nullptr},
        {"scheduler", "euler"},
        {"textual_inversion",
         nlohmann::json::array({nlohmann::json::array({inversion, "<boat-style>"})})},
        {"images", 2},
        {"seed", 8}},
       "--prompt 'a photo of <boat-style>, sailing' --negative-prompt 'blurry <boat-style>' "
       "--cfg 5 --per-class 2 --steps 6 --textual-inversion " +
           ShellQuote(inversion) + " --textual-inversion-token '<boat-style>'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Compared compared = Compare(pipeline, c.settings, c.flags, c.name, "", c.bound);
    ASSERT_TRUE(compared.got.has_value());
  }
  // DDIMScheduler's default clip_sample matters: unclipped, the same x_T lands far away.
  EXPECT_GT(MovedFrom(pipeline, "sdxl_ddim",
                      "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --steps 4 --sampler ddim "
                      "--clip-denoised false",
                      "DDIM without clip_sample"),
            10 * kBound);
  // The embedding matters: without it the tokens are plain text and the samples move.
  EXPECT_GT(MovedFrom(pipeline, "sdxl_textual_inversion",
                      "--prompt 'a photo of <boat-style>, sailing' --negative-prompt "
                      "'blurry <boat-style>' --cfg 5 --per-class 2 --steps 6",
                      "without the textual inversion"),
            10 * kBound);
  // An embedding of one encoder's, or without its token, is refused for SDXL's pair.
  const std::string style = (dir_ / "one_encoder.safetensors").string();
  {
    io::SafetensorsWriter one;
    const std::vector<float> v(32, 0.5f);
    one.AddF32("<boat-style>", {32}, v.data());
    ASSERT_TRUE(one.WriteAtomic(style).ok());
  }
  for (const auto& [flags, message] :
       {std::pair{"--textual-inversion " + ShellQuote(style) + " --textual-inversion-token '<s>'",
                  "whose embeddings hold a clip_l and a clip_g tensor; it holds <boat-style>"},
        {"--textual-inversion " + ShellQuote(inversion),
         "an SDXL embedding names no token: give one"}}) {
    const CommandResult refused =
        RunCommand(fmt::format("{} sample --pretrained {} --prompt boat --steps 2 {} --raw {} 2>&1",
                               ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), flags,
                               ShellQuote((dir_ / "x.st").string())));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_THAT(refused.output, ::testing::HasSubstr(message));
  }
  // The LoRA matters: without it the same x_T samples far from diffusers' run with it.
  EXPECT_GT(MovedFrom(pipeline, "sdxl_kohya_lora",
                      "--prompt 'a photo of a boat' --negative-prompt blurry --cfg 5 --per-class 2 "
                      "--steps 6",
                      "without the kohya LoRA"),
            10 * kBound);
  // Latents alone (no VAE decoding them): the time ids still take the pipeline's VAE's size.
  Result<io::SafetensorsFile> want =
      io::SafetensorsFile::Read((dir_ / "sdxl_defaults_want.safetensors").string());
  ASSERT_TRUE(want.ok());
  const std::string raw = (dir_ / "sdxl_latents_only.safetensors").string();
  const CommandResult sampled = RunCommand(fmt::format(
      "{} sample --pretrained {} --initial-noise {} {} --raw {} 2>&1", ShellQuote(DIFFTRAIN_BINARY),
      ShellQuote(pipeline), ShellQuote((dir_ / "sdxl_defaults_want.safetensors").string()),
      cases[0].flags, ShellQuote(raw)));
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  Result<io::SafetensorsFile> latents_only = io::SafetensorsFile::Read(raw);
  ASSERT_TRUE(latents_only.ok()) << latents_only.status().message();
  EXPECT_EQ(latents_only->Find("decoded"), nullptr);
  EXPECT_LE(RelativeL2(ReferenceTensor(*latents_only, "images"), ReferenceTensor(*want, "latents")),
            kBound);
  // The micro-conditioning matters: other time ids move the latents far beyond the bound.
  EXPECT_GT(MovedFrom(pipeline, "sdxl_defaults", cases[0].flags + " --original-size 64,64",
                      "original size 64x64 in place of 16x16"),
            10 * kBound);
  // Malformed SDXL flags are refused.
  const CommandResult malformed = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt boat --crop-top-left 1,2,3 --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote((dir_ / "x.st").string())));
  EXPECT_EQ(malformed.exit_code, 2) << malformed.output;
  EXPECT_THAT(malformed.output, ::testing::HasSubstr("--crop-top-left: two non-negative numbers"));
}

// SDXL fine-tuning from captioned pictures of several sizes: `data pack` through the pipeline's
// VAE and its two text encoders (the table holds each caption's pooled embedding, each shard
// each picture's geometry), each sample's time ids its own picture's, training from the
// pipeline's UNet on the packed folder, sampling a prompt the table lacks from the checkpoint;
// and a table without pooled embeddings refused for SDXL by name.
TEST_F(SdPipelineReferenceTest, SdxlTrainsOnPicturesPackedWithItsEncoders) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(pipeline.empty());
  const std::filesystem::path images = dir_ / "pictures";
  // Pictures of three sizes (width × height): each sample's time ids are its own.
  WriteCaptionedPictures(images, {{16, 16}, {40, 24}, {24, 32}},
                         {"a red boat", "a boat at night", "a red boat"});
  const std::string packed = (dir_ / "packed").string();
  const CommandResult pack = RunCommand(fmt::format(
      "{} data pack --dataset image_folder --path {} --image-size 16 --crop square --vae {} "
      "--text-encoder {} --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(images.string()), ShellQuote(pipeline),
      ShellQuote(pipeline), ShellQuote(packed)));
  ASSERT_EQ(pack.exit_code, 0) << pack.output;
  Result<TextTable> table = ReadTextTable(packed + "/text.safetensors");
  ASSERT_TRUE(table.ok()) << table.status().message();
  EXPECT_EQ(table->size(), 2);
  EXPECT_EQ(table->dim, 32 + 48);    // the two encoders' widths
  EXPECT_EQ(table->pooled_dim, 40);  // text_encoder_2's projection
  EXPECT_EQ(table->pooled.size(), 2u * 40);

  const std::string ckpt = (dir_ / "ckpt").string(), job = (dir_ / "job.yaml").string();
  WriteFineTuneJob(job, pipeline, packed, ckpt, 2);
  // SDXL's time ids of each picture in a training batch (`debug-dump --data`: the folder's
  // first batch): its original size, where the square crop (16/side of the centred square)
  // took it, and the 16 px sample (diffusers' original_size, crops_coords_top_left,
  // target_size); diffusers' UNet steps on the batch as difftrain's does.
  const std::string dump = (dir_ / "dump.safetensors").string();
  const CommandResult dumped = RunCommand(fmt::format(
      "{} debug-dump --config {} --data {} --seed 1 --batch 3 --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job), ShellQuote(packed), ShellQuote(dump)));
  ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
  Result<io::SafetensorsFile> dumped_file = io::SafetensorsFile::Read(dump);
  ASSERT_TRUE(dumped_file.ok());
  const std::vector<float> ids = ReferenceTensor(*dumped_file, "input.time_ids");
  std::vector<std::vector<float>> rows;
  for (size_t b = 0; b < 3; ++b)
    rows.emplace_back(ids.begin() + 6 * b, ids.begin() + 6 * b + 6);
  EXPECT_THAT(rows, ::testing::UnorderedElementsAre(
                        std::vector<float>{16, 16, 0, 0, 16, 16},
                        std::vector<float>{24, 40, 0, 5, 16, 16},    // 8 px of 24², × 16/24
                        std::vector<float>{32, 24, 3, 0, 16, 16}));  // 4 px, × 16/24
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(dump));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  const CommandResult trained =
      RunCommand(fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), job));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string raw = (dir_ / "from_checkpoint.safetensors").string();
  const CommandResult sampled = RunCommand(fmt::format(
      "{} sample --checkpoint {} --prompt 'a boat in the fog' --steps 4 --vae none --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), ShellQuote(raw)));
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  EXPECT_THAT(sampled.output, ::testing::HasSubstr("embedded 1 prompt(s)"));

  // The same folder with a table of the texts alone is refused for SDXL's UNet.
  table->pooled_dim = 0;
  table->pooled.clear();
  ASSERT_TRUE(WriteTextTable(*table, packed + "/text.safetensors").ok());
  std::filesystem::remove_all(ckpt);
  const CommandResult refused =
      RunCommand(fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), job));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_THAT(refused.output,
              ::testing::HasSubstr("the model takes each text's pooled embedding of 40 features"));
  const CommandResult refused_dump = RunCommand(
      fmt::format("{} debug-dump --config {} --data {} --out {} 2>&1", ShellQuote(DIFFTRAIN_BINARY),
                  ShellQuote(job), ShellQuote(packed), ShellQuote(dump)));
  EXPECT_EQ(refused_dump.exit_code, 2) << refused_dump.output;
  EXPECT_THAT(refused_dump.output, ::testing::HasSubstr("--data: the model takes each text's "
                                                        "pooled embedding of 40 features"));
}

// SDXL fine-tuning on aspect-ratio buckets (`data pack --crop buckets`): pictures of square,
// landscape and portrait shapes packed into 16×16, 12×20 and 20×12 px buckets through the
// pipeline's VAE and text encoders (8×8, 6×10 and 10×6 latents); a training batch is of one
// bucket, its time ids say each picture's size, its crop and the bucket as the target size, and
// diffusers' UNet steps on a non-square batch as difftrain's does; one epoch of every bucket's
// batches trains from the pipeline's UNet, and the checkpoint samples.
TEST_F(SdPipelineReferenceTest, SdxlTrainsOnAspectRatioBuckets) {
  const std::string text_python = TextPython();
  if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment (PyPI unreachable?)";
  const std::string pipeline = MakePipeline(text_python, "sdxl");
  ASSERT_FALSE(pipeline.empty());
  const std::filesystem::path images = dir_ / "pictures";
  // Width × height: four near-square, four landscape, four portrait pictures.
  std::vector<std::string> captions;
  for (int k = 0; k < 12; ++k)
    captions.push_back(k % 2 ? "a red boat" : "a harbour");
  WriteCaptionedPictures(images,
                         {{16, 16},
                          {20, 18},
                          {17, 19},
                          {32, 32},
                          {40, 24},
                          {30, 17},
                          {25, 15},
                          {50, 31},
                          {24, 40},
                          {17, 29},
                          {15, 26},
                          {30, 49}},
                         captions);
  const std::string packed = (dir_ / "packed").string();
  const CommandResult pack = RunCommand(fmt::format(
      "{} data pack --dataset image_folder --path {} --image-size 16 --crop buckets --buckets "
      "16x16,12x20,20x12 --vae {} --text-encoder {} --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(images.string()), ShellQuote(pipeline),
      ShellQuote(pipeline), ShellQuote(packed)));
  ASSERT_EQ(pack.exit_code, 0) << pack.output;
  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(packed);
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  EXPECT_EQ((*folder)->buckets(), (std::vector<SampleSize>{{8, 8}, {6, 10}, {10, 6}}));
  std::vector<int> per_bucket(3);
  for (int64_t i = 0; i < (*folder)->size(); ++i)
    ++per_bucket[(*folder)->BucketOf(i)];
  EXPECT_EQ(per_bucket, (std::vector<int>{4, 4, 4}));
  const CommandResult verified = RunCommand(
      fmt::format("{} data verify {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(packed)));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output,
              ::testing::HasSubstr("12 samples of 4×8×8 in 3 aspect-ratio buckets (8×8, 6×10, "
                                   "10×6)"));

  const std::string ckpt = (dir_ / "ckpt").string(), job = (dir_ / "job.yaml").string();
  WriteFineTuneJob(job, pipeline, packed, ckpt, 6);
  // The first batch of a few seeds, until one is of a non-square bucket: its time ids are each
  // picture's own with the bucket as the target, and diffusers' UNet takes the step.
  bool checked_wide = false;
  for (int seed = 1; seed <= 8 && !checked_wide; ++seed) {
    const std::string dump = (dir_ / fmt::format("dump{}.safetensors", seed)).string();
    const CommandResult dumped = RunCommand(fmt::format(
        "{} debug-dump --config {} --data {} --seed {} --batch 2 --out {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job), ShellQuote(packed), seed, ShellQuote(dump)));
    ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
    Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(dump);
    ASSERT_TRUE(file.ok());
    const std::vector<int64_t> shape = file->Find("input.x_t")->shape;
    ASSERT_EQ(shape.size(), 4u);
    if (shape[2] == shape[3]) continue;
    const std::vector<float> ids = ReferenceTensor(*file, "input.time_ids");
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(ids[6 * b + 4], 2 * shape[2]) << "target height";
      EXPECT_EQ(ids[6 * b + 5], 2 * shape[3]) << "target width";
      // A landscape bucket's pictures are landscape (and a portrait one's portrait).
      EXPECT_EQ(ids[6 * b + 1] > ids[6 * b + 0], shape[3] > shape[2]) << b;
    }
    const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(dump));
    EXPECT_EQ(checked.exit_code, 0) << checked.output;
    checked_wide = true;
  }
  EXPECT_TRUE(checked_wide) << "no seed's first batch was of a non-square bucket";

  const CommandResult trained =
      RunCommand(fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), job));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_THAT(trained.output, ::testing::HasSubstr("12 samples in 3 aspect-ratio buckets; an "
                                                   "epoch trains 12 of them"));
  const std::string raw = (dir_ / "from_checkpoint.safetensors").string();
  const CommandResult sampled = RunCommand(fmt::format(
      "{} sample --checkpoint {} --prompt 'a boat in the fog' --steps 4 --vae none --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), ShellQuote(raw)));
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
}

}  // namespace
}  // namespace difftrain::testing
