// Runs the built `difftrain sample` as a user does, on a tiny checkpoint that `difftrain
// train` writes first: the PNG grid and the raw file, both kinds of checkpoint argument,
// determinism, and the bad-input exits.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/vae/vae.h"
#include "model/vae/vae_testing.h"
#include "tests/testing/run_command.h"
#include "tests/testing/tiny_training.h"

namespace difftrain {
namespace {

using testing::CommandResult;
using testing::RunDifftrain;
using testing::ShellQuote;

// 8×8 grey images, 1 input channel, learn_sigma (DiT's default) and a null class.
const std::string kTinyJob =
    std::string(testing::kTinyGreyJobYaml) + "train:\n  steps: 2\n  log_every: 1\n";

class SampleCommandTest : public ::testing::Test {
 protected:
  // One checkpoint for the whole suite: training it is the slow part.
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("sample_command_test_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    const std::filesystem::path job = *dir_ / "job.yaml";
    std::ofstream(job) << kTinyJob << "checkpoint:\n  dir: " << (*dir_ / "ckpt").string() << "\n";
    train_ = new CommandResult(RunDifftrain("train --config " + ShellQuote(job.string())));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete train_;
  }
  void SetUp() override { ASSERT_EQ(train_->exit_code, 0) << train_->output; }

  static std::string Ckpt() { return ShellQuote((*dir_ / "ckpt").string()); }
  // Four DDIM samples (classes 1, 2) of the model `args` names, through file `raw`.
  static std::vector<float> Images(const std::string& args, const std::string& raw) {
    const CommandResult r = RunDifftrain(
        "sample --classes 1,2 --per-class 2 --sampler ddim "
        "--steps 3 --raw " +
        ShellQuote(File(raw)) + " " + args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    Result<io::SafetensorsFile> f = io::SafetensorsFile::Read(File(raw));
    std::vector<float> x(4 * 8 * 8);
    EXPECT_TRUE(f.ok() && f->CopyF32("images", {4, 1, 8, 8}, x.data()).ok());
    return x;
  }
  static std::string File(const std::string& name) { return (*dir_ / name).string(); }
  // A `width` × `height` gradient picture of `channels` (1 or 3) at File(name); its path.
  static std::string Picture(const std::string& name, int width, int height, int channels) {
    std::vector<uint8_t> pixels(size_t(width) * height * channels);
    for (size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<uint8_t>((i * 37 + i / (width * channels) * 11) % 256);
    EXPECT_TRUE(io::WritePng(File(name), pixels.data(), width, height, channels).ok());
    return File(name);
  }

  static std::filesystem::path* dir_;
  static CommandResult* train_;
};

std::filesystem::path* SampleCommandTest::dir_ = nullptr;
CommandResult* SampleCommandTest::train_ = nullptr;

TEST_F(SampleCommandTest, WritesGridAndRawSamples) {
  const CommandResult r = RunDifftrain(
      "sample --checkpoint " + Ckpt() +
      " --classes 0,3,7 --per-class 4 --steps 5 --sampler ddpm --cfg 2 --seed 1 --batch 5 --out " +
      ShellQuote(File("grid.png")) + " --raw " + ShellQuote(File("raw.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  Result<io::PngImage> png = io::ReadPng(File("grid.png"));
  ASSERT_TRUE(png.ok()) << png.status().message();
  // 4 columns and 3 rows of 8×8 images with 2 pixels of padding: 4·10 + 2 by 3·10 + 2.
  EXPECT_EQ(png->width, 42);
  EXPECT_EQ(png->height, 32);
  EXPECT_EQ(png->channels, 1);

  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File("raw.safetensors"));
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  const io::TensorView* images = raw->Find("images");
  const io::TensorView* labels = raw->Find("labels");
  ASSERT_NE(images, nullptr);
  ASSERT_NE(labels, nullptr);
  EXPECT_EQ(images->dtype, io::DType::kF32);
  EXPECT_EQ(images->shape, (std::vector<int64_t>{12, 1, 8, 8}));
  EXPECT_EQ(labels->dtype, io::DType::kI64);
  EXPECT_EQ(labels->shape, (std::vector<int64_t>{12}));
  std::vector<int64_t> label_values(12);
  std::memcpy(label_values.data(), labels->data, labels->bytes);
  EXPECT_EQ(label_values, (std::vector<int64_t>{0, 0, 0, 0, 3, 3, 3, 3, 7, 7, 7, 7}));
  std::vector<float> pixels(12 * 64);
  std::memcpy(pixels.data(), images->data, images->bytes);
  for (float v : pixels) {
    ASSERT_TRUE(v >= -1.0f && v <= 1.0f) << v;
  }
  EXPECT_EQ(raw->metadata().at("format"), "difftrain-samples");
}

// PNDM, Euler (ancestral), Heun, LMS, DPM-Solver and UniPC need a diffusers spacing: from a
// checkpoint they take their schedulers' defaults (leading for PNDM, else linspace), and sample
// without clipping.
TEST_F(SampleCommandTest, MultistepSamplersTakeTheirSchedulersSpacing) {
  for (const auto& [sampler, spacing] :
       std::vector<std::pair<std::string, std::string>>{{"pndm", "leading"},
                                                        {"euler", "linspace"},
                                                        {"euler_ancestral", "linspace"},
                                                        {"heun", "linspace"},
                                                        {"lms", "linspace"},
                                                        {"kdpm2", "linspace"},
                                                        {"kdpm2_ancestral", "linspace"},
                                                        {"dpmsolver", "linspace"},
                                                        {"dpmsolver_singlestep", "linspace"},
                                                        {"dpmsolver_sde", "linspace"},
                                                        {"deis", "linspace"},
                                                        {"unipc", "linspace"}}) {
    SCOPED_TRACE(sampler);
    const std::string raw = File(sampler + ".safetensors");
    const CommandResult r = RunDifftrain("sample --checkpoint " + Ckpt() +
                                         " --classes 1 --per-class 2 --steps 3 --sampler " +
                                         sampler + " --raw " + ShellQuote(raw));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(sampler + " 3 steps spaced " + spacing), std::string::npos) << r.output;
    Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(raw);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const nlohmann::json how = nlohmann::json::parse(file->metadata().at("sampling"));
    EXPECT_EQ(how["sampler"], sampler);
    EXPECT_EQ(how["timestep_spacing"]["kind"], spacing);
    EXPECT_EQ(how["clip_denoised"], false);
    EXPECT_EQ(how.contains("unipc"), sampler == "unipc");
  }
  // LCM takes 4 steps (LatentConsistencyModelPipeline's) of its own timesteps by default.
  const CommandResult lcm = RunDifftrain("sample --checkpoint " + Ckpt() +
                                         " --classes 1 --per-class 2 --sampler lcm --raw " +
                                         ShellQuote(File("lcm.safetensors")));
  ASSERT_EQ(lcm.exit_code, 0) << lcm.output;
  EXPECT_NE(lcm.output.find("lcm 4 steps of the distillation's 50 timesteps"), std::string::npos)
      << lcm.output;
  // TCD likewise, with γ 0.3 (TCDScheduler.step's) unless --eta says otherwise.
  const CommandResult tcd = RunDifftrain("sample --checkpoint " + Ckpt() +
                                         " --classes 1 --per-class 2 --sampler tcd --raw " +
                                         ShellQuote(File("tcd.safetensors")));
  ASSERT_EQ(tcd.exit_code, 0) << tcd.output;
  EXPECT_NE(tcd.output.find("tcd 4 steps (gamma 0.3) of the distillation's 50 timesteps"),
            std::string::npos)
      << tcd.output;

  // Karras σ's and guidance rescale reach the sampler and its record.
  const std::string raw = File("karras.safetensors");
  const CommandResult r =
      RunDifftrain("sample --checkpoint " + Ckpt() +
                   " --classes 1 --per-class 2 --steps 3 --sampler unipc --karras-sigmas true "
                   "--guidance-rescale 0.5 --raw " +
                   ShellQuote(raw));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Karras sigmas"), std::string::npos) << r.output;
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(raw);
  ASSERT_TRUE(file.ok()) << file.status().message();
  const nlohmann::json how = nlohmann::json::parse(file->metadata().at("sampling"));
  EXPECT_EQ(how["timestep_spacing"]["karras_sigmas"], true);
  EXPECT_EQ(how["guidance_rescale"], 0.5);
  EXPECT_EQ(how["unipc"]["solver_type"], "bh2");

  // The solvers' flags reach the sampler and its record: DPM++ 3M with heun's corrections,
  // DPM++ 2M SDE, UniPC bh1 of order 1.
  for (const auto& [flags, key, want] :
       std::vector<std::tuple<std::string, std::string, nlohmann::json>>{
           {"--sampler dpmsolver --solver-order 3 --solver-type heun",
            "dpm_solver",
            {{"solver_order", 3}, {"solver_type", "heun"}, {"algorithm_type", "dpmsolver++"}}},
           {"--sampler dpmsolver --algorithm-type sde-dpmsolver++",
            "dpm_solver",
            {{"solver_order", 2},
             {"solver_type", "midpoint"},
             {"algorithm_type", "sde-dpmsolver++"}}},
           {"--sampler unipc --solver-order 1 --solver-type bh1",
            "unipc",
            {{"solver_order", 1}, {"solver_type", "bh1"}}},
           {"--sampler deis --solver-order 3 --algorithm-type deis",
            "deis",
            {{"solver_order", 3}, {"solver_type", "logrho"}, {"lower_order_final", true}}},
           {"--sampler dpmsolver --final-sigmas-type sigma_min --lower-order-final false",
            "dpm_solver",
            {{"final_sigmas_type", "sigma_min"}, {"lower_order_final", false}}},
           {"--sampler dpmsolver_singlestep --solver-order 3 --final-sigmas-type sigma_min",
            "dpm_solver",
            {{"solver_order", 3}, {"final_sigmas_type", "sigma_min"}}},
           {"--sampler lcm --original-inference-steps 20",
            "lcm",
            {{"original_inference_steps", 20}, {"timestep_scaling", 10}}},
           // Its class's default lower_order_final is false (forced true by a final σ of 0).
           {"--sampler dpmsolver_singlestep --solver-order 3 --solver-type heun",
            "dpm_solver",
            {{"solver_order", 3}, {"solver_type", "heun"}, {"lower_order_final", false}}}}) {
    SCOPED_TRACE(flags);
    const std::string solver_raw = File("solver.safetensors");
    const CommandResult solved =
        RunDifftrain("sample --checkpoint " + Ckpt() + " --classes 1 --per-class 2 --steps 3 " +
                     flags + " --raw " + ShellQuote(solver_raw));
    ASSERT_EQ(solved.exit_code, 0) << solved.output;
    Result<io::SafetensorsFile> solver_file = io::SafetensorsFile::Read(solver_raw);
    ASSERT_TRUE(solver_file.ok()) << solver_file.status().message();
    const nlohmann::json record =
        nlohmann::json::parse(solver_file->metadata().at("sampling"))[key];
    for (const auto& [name, value] : want.items())
      EXPECT_EQ(record[name], value) << name << " in " << record.dump();
  }
}

// A step directory works as well as the checkpoint directory, the batch size does not
// change the samples, and the same seed gives the same file.
TEST_F(SampleCommandTest, StepDirectoryBatchSizeAndSeed) {
  auto sample = [&](const std::string& checkpoint, int batch, int seed, const std::string& name) {
    const CommandResult r = RunDifftrain(
        "sample --checkpoint " + checkpoint +
        " --classes 1,2 --per-class 3 --steps 4 --sampler ddim --eta 0.5 --weights model --seed " +
        std::to_string(seed) + " --batch " + std::to_string(batch) + " --raw " +
        ShellQuote(File(name)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File(name));
    EXPECT_TRUE(raw.ok()) << raw.status().message();
    if (!raw.ok()) return std::vector<float>();
    const io::TensorView* images = raw->Find("images");
    std::vector<float> values(images->bytes / sizeof(float));
    std::memcpy(values.data(), images->data, images->bytes);
    return values;
  };
  const std::string step_dir = ShellQuote((*dir_ / "ckpt" / "step-00000002").string());
  const std::vector<float> a = sample(Ckpt(), 6, 3, "a.safetensors");
  ASSERT_EQ(a.size(), 6u * 64);
  EXPECT_EQ(sample(step_dir, 6, 3, "b.safetensors"), a);
  EXPECT_EQ(sample(Ckpt(), 6, 4, "c.safetensors") == a, false);
  // DiT's forward is per sample, but a GEMM over another batch size may round differently.
  const std::vector<float> d = sample(Ckpt(), 2, 3, "d.safetensors");
  ASSERT_EQ(d.size(), a.size());
  for (size_t k = 0; k < a.size(); ++k)
    ASSERT_NEAR(d[k], a[k], 1e-4) << k;
}

TEST_F(SampleCommandTest, BadInputExitsTwo) {
  struct Case {
    std::string args, message;
  };
  const std::string out = " --out " + ShellQuote(File("bad.png"));
  const std::vector<float> four(4, 0.5f);
  io::SafetensorsWriter misshapen, unnamed;
  misshapen.AddF32("noise", {1, 4}, four.data());
  unnamed.AddF32("a", {4}, four.data());
  unnamed.AddF32("b", {4}, four.data());
  ASSERT_TRUE(misshapen.WriteAtomic(File("misshapen.safetensors")).ok());
  ASSERT_TRUE(unnamed.WriteAtomic(File("unnamed.safetensors")).ok());
  const std::string picture = " --image " + ShellQuote(Picture("bad_start.png", 8, 8, 1));
  for (const Case& c : std::vector<Case>{
           {"--checkpoint " + Ckpt() + " --classes 0 --strength 0.5" + out,
            "--strength is for sampling from --image"},
           {"--checkpoint " + Ckpt() + " --classes 0 --steps 10 --strength 1.5" + picture + out,
            "the strength must be in (0, 1], got 1.5"},
           {"--checkpoint " + Ckpt() + " --classes 0 --steps 10 --strength 0.05" + picture + out,
            "strength 0.05 runs ⌊10 × 0.05⌋ = 0 of the 10 steps"},
           {"--checkpoint " + Ckpt() + " --classes 0,1 --per-class 3" + picture + picture +
                picture + out,
            "--image: 3 images for 2 rows of 3 samples: give one for all, one per row (2) or one "
            "per sample (6)"},
           {"--checkpoint " + Ckpt() + " --classes 0 --image " +
                ShellQuote(File("misshapen.safetensors")) + out,
            "--image: '" + File("misshapen.safetensors") +
                "': tensor 'noise' is [1, 4], and this model's samples are [K, 1, 8, 8]"},
           {"--checkpoint " + Ckpt() + " --classes 0 --image /nonexistent.png" + out, "--image: "},
           {"--checkpoint " + Ckpt() + " --classes 0 --height 16" + out,
            "--height/--width: the dit family runs at its model's size only (8x8 latents)"},
           {"--checkpoint " + Ckpt() + " --classes 0 --width 0" + out,
            "--height/--width: 8x0 pixels, and the samples' sides must be positive multiples of "
            "the VAE's downscale 1"},
           {"--checkpoint " + Ckpt() + " --classes 0 --initial-noise " +
                ShellQuote(File("misshapen.safetensors")) + out,
            "--initial-noise: safetensors file '" + File("misshapen.safetensors") +
                "': tensor 'noise' is F32 [1, 4], expected shape [8, 1, 8, 8]"},
           {"--checkpoint " + Ckpt() + " --classes 0 --initial-noise " +
                ShellQuote(File("unnamed.safetensors")) + out,
            "holds 2 tensors and none is named 'noise'"},
           {"--checkpoint /nonexistent --classes 0" + out, "'/nonexistent' is not a directory"},
           {"--checkpoint " + ShellQuote(dir_->string()) + " --classes 0" + out,
            "holds no complete checkpoint"},
           {"--checkpoint " + Ckpt() + " --classes 0,10" + out, "class 10 is outside"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler euler_a" + out, "unknown sampler"},
           {"--checkpoint " + Ckpt() + " --classes 0 --karras-sigmas true" + out,
            "--karras-sigmas: Karras sigmas are for --sampler euler, heun, lms, kdpm2, "
            "kdpm2_ancestral, dpmsolver, dpmsolver_singlestep, dpmsolver_sde, deis, unipc"},
           {"--checkpoint " + Ckpt() + " --classes 0 --solver-order 3" + out,
            "--solver-order, --solver-type and --lower-order-final are for --sampler dpmsolver, "
            "dpmsolver_singlestep, deis, unipc"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler deis --final-sigmas-type zero" + out,
            "--final-sigmas-type is for --sampler dpmsolver, dpmsolver_singlestep"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler unipc --final-sigmas-type one" + out,
            "--final-sigmas-type: one not in {zero,sigma_min}"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --sampler unipc --algorithm-type "
                "sde-dpmsolver++" +
                out,
            "--algorithm-type is for --sampler dpmsolver, dpmsolver_singlestep, deis"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler unipc --solver-type heun" + out,
            "--solver-type: 'heun' is not one of the unipc solver's (bh1, bh2)"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler dpmsolver --solver-order 4" + out,
            "--solver-order: solver_order: 4 is not supported"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --sampler dpmsolver --solver-order 3 --algorithm-type "
                "sde-dpmsolver++" +
                out,
            "solver_order: 3 with sde-dpmsolver++ is not supported"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --sampler dpmsolver_singlestep --algorithm-type sde-dpmsolver++" +
                out,
            "--algorithm-type: 'sde-dpmsolver++' is not one of the dpmsolver_singlestep solver's "
            "(dpmsolver++)"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler deis --solver-type midpoint" + out,
            "--solver-type: 'midpoint' is not one of the deis solver's (logrho)"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --sampler dpmsolver_singlestep --timestep-spacing trailing" + out,
            "--timestep-spacing: --sampler dpmsolver_singlestep (DPMSolverSinglestepScheduler) "
            "places its steps by linspace only"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler lcm --timestep-spacing trailing" +
                out,
            "--timestep-spacing: --sampler lcm (LCMScheduler) places its steps on the "
            "distillation's original_inference_steps timesteps only"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler lcm --steps 60" + out,
            "LCM takes 1 to original_inference_steps = 50 steps"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler lcm --original-inference-steps 0" +
                out,
            "--original-inference-steps: original_inference_steps must be positive, got 0"},
           {"--checkpoint " + Ckpt() + " --classes 0 --lora /nonexistent.safetensors" + out,
            "--lora: "},
           {"--checkpoint " + Ckpt() + " --classes 0 --lora a.safetensors --lora-scale 0.5,1" + out,
            "--lora-scale: give one scale, or one per --lora (1), got 2"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler ddim --original-inference-steps 8" +
                out,
            "--original-inference-steps is for --sampler lcm"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --sampler dpmsolver_singlestep --solver-order 3 --steps 5" + out,
            "ends on a step of order 2 to σ = 0"},
           {"--checkpoint " + Ckpt() + " --classes 0 --guidance-rescale 1.5" + out,
            "the guidance rescale must be in [0, 1], got 1.5"},
           {"--checkpoint " + Ckpt() + " --classes 0 --steps 5000" + out, "got 5000"},
           {"--checkpoint " + Ckpt() + " --classes 0 --eta 0.5" + out, "--eta is for"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler pndm --clip-denoised true" + out,
            "PNDM does not clip"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler pndm --timestep-spacing respace" +
                out,
            "PNDM follows diffusers' PNDMScheduler"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler pndm --eta 0.3" + out,
            "--eta is for --sampler ddim and tcd (its gamma) only"},
           {"--checkpoint " + Ckpt() + " --classes 0 --sampler tcd --eta 1.5" + out,
            "eta must be in [0, 1], got 1.5"},
           {"--checkpoint " + Ckpt() + " --classes 0 --steps-offset 1" + out,
            "--timestep-spacing: steps_offset and set_alpha_to_one are for diffusers' spacings"},
           {"--checkpoint " + Ckpt() + " --classes 0 --timestep-spacing karras" + out,
            "--timestep-spacing"},
           {"--checkpoint " + Ckpt() +
                " --classes 0 --timestep-spacing leading --steps-offset 999" + out,
            "outside the diffusion's"},
           {"--checkpoint " + Ckpt() + " --classes 0", "give --out"},
           {"--checkpoint " + Ckpt() + " --classes 0 --weights best" + out, "--weights"},
           {"--checkpoint " + Ckpt() + out, "--classes is required"},
           {"--checkpoint " + Ckpt() + " --classes 0 --gif " + ShellQuote(File("x.gif")),
            "--gif is for video models"},
           // More samples a call than the machine holds: an error, not an abort or an OOM kill.
           {"--checkpoint " + Ckpt() +
                " --classes 0 --per-class 100000000 --batch 100000000 "
                "--steps 2 --raw " +
                ShellQuote(File("huge.safetensors")),
            "out of host memory: an allocation needs more than the"},
       }) {
    const CommandResult r = RunDifftrain("sample " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// Image to image from a checkpoint of a pixel model: a picture is converted to the model's
// channels and stretched to its size, so it samples as the same x0 given as a tensor does; one
// picture per row starts each row from its own (the first row as from its picture alone); the
// samples' noise does not depend on the batch; a strength changes them.
TEST_F(SampleCommandTest, StartsFromImages) {
  const std::string grey = Picture("start_grey.png", 8, 8, 1);
  const std::string colour = Picture("start_rgb.png", 12, 10, 3);  // stretched, to luma
  auto sample = [&](const std::string& args, const std::string& name) {
    const CommandResult r =
        RunDifftrain("sample --checkpoint " + Ckpt() +
                     " --classes 1,2 --per-class 2 --sampler ddim --steps 10 --seed 3 " + args +
                     " --raw " + ShellQuote(File(name)));
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File(name));
    EXPECT_TRUE(raw.ok()) << raw.status().message();
    std::vector<float> values(4 * 64);
    if (raw.ok()) {
      EXPECT_TRUE(raw->CopyF32("images", {4, 1, 8, 8}, values.data()).ok());
    }
    return std::make_pair(values, r.output);
  };
  const auto [from_grey, log] = sample("--image " + ShellQuote(grey) + " --strength 0.5", "g.st");
  EXPECT_NE(log.find("at strength 0.5: 5 of the steps, from timestep 444"), std::string::npos)
      << log;
  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File("g.st"));
  ASSERT_TRUE(raw.ok());
  const nlohmann::json how = nlohmann::json::parse(raw->metadata().at("sampling"));
  EXPECT_EQ(how["strength"], 0.5);
  EXPECT_EQ(how["image"], nlohmann::json::array({grey}));

  // The picture as x0's: its pixels, x/255 · 2 − 1.
  Result<io::PngImage> png = io::ReadPng(grey);
  ASSERT_TRUE(png.ok());
  std::vector<float> x0(64);
  for (size_t i = 0; i < x0.size(); ++i)
    x0[i] = 2.0f * (png->pixels[i] / 255.0f) - 1.0f;
  io::SafetensorsWriter tensor;
  tensor.AddF32("images", {1, 1, 8, 8}, x0.data());
  ASSERT_TRUE(tensor.WriteAtomic(File("start.safetensors")).ok());
  EXPECT_EQ(
      sample("--image " + ShellQuote(File("start.safetensors")) + " --strength 0.5", "t.st").first,
      from_grey);

  const std::vector<float> per_row =
      sample("--image " + ShellQuote(grey) + " --image " + ShellQuote(colour) + " --strength 0.5",
             "rows.st")
          .first;
  for (size_t k = 0; k < 2 * 64; ++k)
    ASSERT_NEAR(per_row[k], from_grey[k], 1e-5) << k;
  EXPECT_NE(std::vector<float>(per_row.begin() + 128, per_row.end()),
            std::vector<float>(from_grey.begin() + 128, from_grey.end()));

  const std::vector<float> batch_one =
      sample("--image " + ShellQuote(grey) + " --strength 0.5 --batch 1", "b1.st").first;
  for (size_t k = 0; k < batch_one.size(); ++k)
    ASSERT_NEAR(batch_one[k], from_grey[k], 1e-4) << k;
  EXPECT_NE(sample("--image " + ShellQuote(grey) + " --strength 0.8", "s8.st").first, from_grey);
}

// Inpainting a pixel model (DiT's: no conditioning channels): the samples keep the picture
// exactly where the mask is black (clipped DDIM and DDPM, with a mask of another size, binarised
// at half), and are painted where it is white; one mask per row; at strength 1 (the default)
// from x_T, below from the picture noised. A mask without an image, a mask as a tensor and a
// wrong number of masks are refused.
TEST_F(SampleCommandTest, InpaintsAPictureOutsideItsMask) {
  const std::string picture = Picture("paint.png", 8, 8, 1);
  std::vector<uint8_t> left(12 * 12), right(12 * 12);
  for (int y = 0; y < 12; ++y) {
    for (int x = 0; x < 12; ++x) {
      left[y * 12 + x] = x < 6 ? 255 : 0;
      right[y * 12 + x] = x >= 6 && y >= 3 ? 230 : 20;
    }
  }
  ASSERT_TRUE(io::WritePng(File("left.png"), left.data(), 12, 12, 1).ok());
  ASSERT_TRUE(io::WritePng(File("right.png"), right.data(), 12, 12, 1).ok());
  std::vector<float> x0(64), painted_left(64), painted_right(64);
  PrepareStretched(*io::ReadPng(picture), 8, 8, 1, x0.data());
  PrepareMask(*io::ReadPng(File("left.png")), 8, 8, painted_left.data());
  PrepareMask(*io::ReadPng(File("right.png")), 8, 8, painted_right.data());
  for (const char* sampler : {"ddim", "ddpm"}) {
    for (const std::string strength : {"", " --strength 0.6"}) {
      SCOPED_TRACE(sampler + strength);
      const std::string raw = File(fmt::format("paint_{}{}.st", sampler, strength.size()));
      const CommandResult r = RunDifftrain(
          "sample --checkpoint " + Ckpt() + " --classes 1,2 --per-class 2 --steps 10 --seed 3 " +
          "--sampler " + sampler + " --image " + ShellQuote(picture) + " --mask " +
          ShellQuote(File("left.png")) + " --mask " + ShellQuote(File("right.png")) + strength +
          " --raw " + ShellQuote(raw));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("the image kept elsewhere at every step"), std::string::npos);
      Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(raw);
      ASSERT_TRUE(file.ok());
      std::vector<float> x(4 * 64);
      ASSERT_TRUE(file->CopyF32("images", {4, 1, 8, 8}, x.data()).ok());
      size_t painted = 0;
      for (int k = 0; k < 4; ++k) {
        const std::vector<float>& mask = k < 2 ? painted_left : painted_right;
        for (size_t i = 0; i < 64; ++i) {
          if (mask[i] == 0) {
            ASSERT_EQ(x[k * 64 + i], x0[i]) << k << " " << i;
          } else {
            painted += x[k * 64 + i] != x0[i];
          }
        }
      }
      EXPECT_GT(painted, 100u);
    }
  }
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--mask " + ShellQuote(File("left.png")), "--mask is for inpainting an --image"},
           {"--image " + ShellQuote(picture) + " --mask " + ShellQuote(File("raw.safetensors")),
            "a mask is a picture (PNG or JPEG)"},
           {"--image " + ShellQuote(picture) + " --mask " + ShellQuote(File("left.png")) +
                " --mask " + ShellQuote(File("left.png")) + " --mask " +
                ShellQuote(File("left.png")),
            "3 masks for 2 rows of 2 samples"},
       }) {
    const CommandResult r =
        RunDifftrain("sample --checkpoint " + Ckpt() + " --classes 1,2 --per-class 2 --steps 4 " +
                     args + " --raw " + ShellQuote(File("bad.st")));
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}

// An unconditional Latte of 3 frames: one row of videos, a filmstrip of one row of frames per
// video, an animated GIF whose frame f is every video's frame f (decoded by Pillow and
// compared with the raw samples), and raw videos [N, F, C, H, W].
constexpr const char* kTinyLatteJob = R"(model:
  name: latte
  input_size: 8
  patch_size: 2
  in_channels: 1
  hidden_size: 32
  depth: 2
  num_heads: 4
  num_classes: 0
  num_frames: 3
batch:
  micro: 2
  global: 2
train:
  steps: 2
  log_every: 1
)";

// Checks that every GIF frame f is the grid (one row of the 4 videos, padding 2) of the raw
// videos' frame f, each value v as the byte round((clamp(v, -1, 1) + 1) * 127.5).
constexpr const char* kCompareGif = R"(
import sys
import numpy as np
from PIL import Image, ImageSequence
sys.path.insert(0, sys.argv[3])
import safetensors_np
videos = safetensors_np.read(sys.argv[2])[0]["images"]  # [N, F, 1, H, W]
N, F, _, H, W = videos.shape
gif = Image.open(sys.argv[1])
frames = [np.array(f.convert("L")) for f in ImageSequence.Iterator(gif)]
assert len(frames) == F and gif.size == (N * (W + 2) + 2, H + 4), (len(frames), gif.size)
for f, frame in enumerate(frames):
    for n in range(N):
        x0, y0 = 2 + n * (W + 2), 2
        want = np.floor((np.clip(videos[n, f, 0], -1, 1) + 1) * 127.5 + 0.5)
        got = frame[y0:y0 + H, x0:x0 + W]
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, (f, n)
print(f"{F} frames of {N} videos match")
)";

TEST(VideoSampleCommandTest, WritesFilmstripGifAndRawVideos) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("video_sample_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "job.yaml") << kTinyLatteJob
                                  << "checkpoint:\n  dir: " << (dir / "ckpt").string() << "\n";
  CommandResult r = RunDifftrain("train --config " + ShellQuote((dir / "job.yaml").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = ShellQuote((dir / "ckpt").string());
  r = RunDifftrain("sample --checkpoint " + ckpt + " --classes 0 --out x.png");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--classes: this model has no classes"), std::string::npos) << r.output;

  const std::string strip = (dir / "strip.png").string(), gif = (dir / "videos.gif").string(),
                    raw = (dir / "raw.safetensors").string();
  r = RunDifftrain("sample --checkpoint " + ckpt +
                   " --per-class 4 --steps 3 --sampler ddim --out " + ShellQuote(strip) +
                   " --gif " + ShellQuote(gif) + " --raw " + ShellQuote(raw));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<io::PngImage> png = io::ReadPng(strip);
  ASSERT_TRUE(png.ok()) << png.status().message();
  EXPECT_EQ(png->width, 3 * 10 + 2);   // the 3 frames of a video in a row
  EXPECT_EQ(png->height, 4 * 10 + 2);  // one row per video
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(raw);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->Find("images")->shape, (std::vector<int64_t>{4, 3, 1, 8, 8}));

  std::ofstream(dir / "compare.py") << kCompareGif;
  r = testing::RunCommand("/usr/bin/python3 " + ShellQuote((dir / "compare.py").string()) + " " +
                          ShellQuote(gif) + " " + ShellQuote(raw) + " " +
                          ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference"));
  if (r.output.find("No module named 'PIL'") != std::string::npos) {
    GTEST_SKIP() << "Pillow (python3-pil) is not installed: scripts/install-deps.sh installs it";
  }
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::remove_all(dir);
}

// `--pretrained`: the checkpoint's EMA saved as a plain state dict (what DiT's released weights
// are, as safetensors), with the model given by flags, samples what the checkpoint samples; so
// does the checkpoint directory given as pretrained weights, its EMA or its trained weights.
TEST_F(SampleCommandTest, PretrainedWeightsSampleAsTheirCheckpoint) {
  const std::string shard = File("ckpt/step-00000002/shard-00000-of-00001.safetensors");
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(shard);
  ASSERT_TRUE(file.ok()) << file.status().message();
  io::SafetensorsWriter plain;
  std::vector<std::vector<float>> data;
  data.reserve(file->Names().size());
  for (const std::string& name : file->Names()) {
    if (name.starts_with("optim.") || (!name.starts_with("ema.") && !name.starts_with("pos_embed")))
      continue;
    const io::TensorView* t = file->Find(name);
    data.emplace_back(t->bytes / sizeof(float));
    ASSERT_TRUE(file->CopyF32(name, t->shape, data.back().data()).ok());
    plain.AddF32(name.starts_with("ema.") ? name.substr(4) : name, t->shape, data.back().data());
  }
  ASSERT_TRUE(plain.WriteAtomic(File("dit.safetensors")).ok());

  const std::string model =
      " --model custom --input-size 8 --patch 2 --in-channels 1 --hidden 32 --depth 2 "
      "--heads 4 --num-classes 10";
  const auto images = &SampleCommandTest::Images;
  const std::vector<float> ema = images("--checkpoint " + Ckpt(), "ckpt-ema.safetensors");
  EXPECT_EQ(
      images("--pretrained " + ShellQuote(File("dit.safetensors")) + model, "plain.safetensors"),
      ema);
  EXPECT_EQ(images("--pretrained " + Ckpt() + model, "dir.safetensors"), ema);
  // `difftrain export --format state-dict` writes that file (the EMA weights, pos_embed too); a
  // DiT has no diffusers or single-file form here.
  CommandResult exported =
      RunDifftrain("export --checkpoint " + Ckpt() + " --format state-dict --out " +
                   ShellQuote(File("exported.safetensors")));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(images("--pretrained " + ShellQuote(File("exported.safetensors")) + model,
                   "exported-samples.safetensors"),
            ema);
  // And as diffusers' Transformer2DModel (tests/dit_diffusers_reference_test.cc checks it
  // against diffusers): read back with the model from its config.json. Its scheduler clips a
  // model of pixels (clip_sample true) as diffusers' DDIM does, stepping along the model's own ε
  // where DiT's steps along the clipped x0's: unclipped, both sample alike.
  exported =
      RunDifftrain("export --checkpoint " + Ckpt() + " --out " + ShellQuote(File("exported-dir")));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const nlohmann::json scheduler =
      nlohmann::json::parse(std::ifstream(File("exported-dir/scheduler/scheduler_config.json")));
  EXPECT_EQ(scheduler["clip_sample"], true);
  EXPECT_EQ(images("--pretrained " + ShellQuote(File("exported-dir")) +
                       " --timestep-spacing respace --clip-denoised false",
                   "diffusers-samples.safetensors"),
            images("--checkpoint " + Ckpt() + " --clip-denoised false", "unclipped.safetensors"));
  const std::vector<float> clipped =
      images("--pretrained " + ShellQuote(File("exported-dir")) + " --timestep-spacing respace",
             "diffusers-clipped.safetensors");
  EXPECT_TRUE(
      std::all_of(clipped.begin(), clipped.end(), [](float v) { return v >= -1 && v <= 1; }));
  EXPECT_NE(clipped, ema);
  // A DDPMScheduler variance that difftrain's DDPM does not draw is refused by name.
  nlohmann::json large = scheduler;
  large["variance_type"] = "fixed_large";
  std::ofstream(File("exported-dir/scheduler/scheduler_config.json")) << large.dump();
  const CommandResult refused = RunDifftrain("sample --classes 1 --sampler ddpm --steps 2 --raw " +
                                             ShellQuote(File("x.safetensors")) + " --pretrained " +
                                             ShellQuote(File("exported-dir")));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("variance_type \"fixed_large\" is not supported"),
            std::string::npos)
      << refused.output;
  std::ofstream(File("exported-dir/scheduler/scheduler_config.json")) << scheduler.dump();
  const std::vector<float> trained =
      images("--checkpoint " + Ckpt() + " --weights model", "ckpt-model.safetensors");
  EXPECT_NE(trained, ema);
  EXPECT_EQ(images("--pretrained " + Ckpt() + model + " --weights model", "dir-model.safetensors"),
            trained);
  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(File("plain.safetensors"));
  ASSERT_TRUE(raw.ok());
  const nlohmann::json how = nlohmann::json::parse(raw->metadata().at("sampling"));
  EXPECT_EQ(how["pretrained"], File("dit.safetensors"));
  EXPECT_EQ(how["diffusion"]["schedule"], "linear");

  std::string wider = model;
  wider.replace(wider.find("--hidden 32"), 11, "--hidden 64");
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "give --checkpoint (a difftrain checkpoint) or --pretrained (weights)"},
           {"--pretrained " + ShellQuote(File("dit.safetensors")),
            "--pretrained: needs the model: '" + File("dit.safetensors") +
                "' has no diffusers config.json beside it"},
           {"--checkpoint " + Ckpt() + model, "the model and diffusion flags are for --pretrained"},
           {"--checkpoint " + Ckpt() + " --prediction v",
            "the model and diffusion flags are for --pretrained"},
           {"--checkpoint " + Ckpt() + " --classes sneaker",
            "--classes: 'sneaker' is no class number, and the model's classes have no names"},
           {"--checkpoint " + Ckpt() + " --aesthetic-score 6",
            "--aesthetic-score: for SDXL's refiner (a pipeline with requires_aesthetics_score)"},
           {"--pretrained " + ShellQuote(File("dit.safetensors")) + wider, "tensors do not match"},
           {"--pretrained " + ShellQuote(File("none.safetensors")) + model,
            "--pretrained: '" + File("none.safetensors") + "': no such file or directory"},
       }) {
    const CommandResult r =
        RunDifftrain("sample --classes 1 --out " + ShellQuote(File("bad.png")) + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// A DiT trained on latents that `data pack --vae` encoded: the folder's index names the VAE,
// and `sample --out` decodes with it without being told (1×32×32 Fashion-MNIST images, 4×16×16
// latents). Where that VAE is gone, sampling stops and says so; `--vae none` keeps the latents.
TEST(LatentSampleTest, DecodesWithTheVaeTheTrainingDataWasPackedWith) {
  TempDir temp("latent_sample");
  const std::string dir = temp.path();
  const nlohmann::json config = {{"block_out_channels", {4, 8}},
                                 {"norm_num_groups", 2},
                                 {"in_channels", 1},
                                 {"out_channels", 1},
                                 {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                                 {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}}};
  ASSERT_EQ(testing::WriteVaeFolder(dir + "/vae", config, 9), "");
  CommandResult r = RunDifftrain("data pack --dataset fashion_mnist --split test --limit 8 --vae " +
                                 ShellQuote(dir + "/vae") + " --out " + ShellQuote(dir + "/data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<std::optional<LatentFolderVae>> packed = ReadLatentFolderVae(dir + "/data");
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  ASSERT_TRUE(packed->has_value());
  EXPECT_EQ((*packed)->path, dir + "/vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ((*packed)->posterior, "sample");
  r = RunDifftrain("data verify " + ShellQuote(dir + "/data"));
  EXPECT_NE(r.output.find("encoded by the VAE " + dir + "/vae/diffusion_pytorch_model.safetensors"),
            std::string::npos)
      << r.output;

  std::string job = kTinyJob;
  job.replace(job.find("input_size: 8"), 13, "input_size: 16");
  job.replace(job.find("in_channels: 1"), 14, "in_channels: 4");
  std::ofstream(dir + "/job.yaml") << job << "data:\n  kind: latent_folder\n  path: " << dir
                                   << "/data\ncheckpoint:\n  dir: " << dir << "/ckpt\n";
  r = RunDifftrain("train --config " + ShellQuote(dir + "/job.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string sample = "sample --checkpoint " + ShellQuote(dir + "/ckpt") +
                             " --classes 1,2 --per-class 2 --sampler ddim --steps 2 ";
  r = RunDifftrain(sample + "--out " + ShellQuote(dir + "/grid.png") + " --raw " +
                   ShellQuote(dir + "/raw.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("decoding with the VAE the training data was encoded with"),
            std::string::npos)
      << r.output;
  Result<io::PngImage> png = io::ReadPng(dir + "/grid.png");
  ASSERT_TRUE(png.ok()) << png.status().message();
  EXPECT_EQ(png->channels, 1);
  EXPECT_EQ(png->width, 2 * 34 + 2);
  Result<io::SafetensorsFile> raw = io::SafetensorsFile::Read(dir + "/raw.safetensors");
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  ASSERT_NE(raw->Find("decoded"), nullptr);
  EXPECT_EQ(raw->Find("decoded")->shape, (std::vector<int64_t>{4, 1, 32, 32}));

  std::filesystem::rename(dir + "/vae", dir + "/moved");
  r = RunDifftrain(sample + "--out " + ShellQuote(dir + "/gone.png"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("was encoded by the VAE '" + dir +
                          "/vae/diffusion_pytorch_model.safetensors', which is not there"),
            std::string::npos)
      << r.output;
  r = RunDifftrain(sample + "--vae none --raw " + ShellQuote(dir + "/latents.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  raw = io::SafetensorsFile::Read(dir + "/latents.safetensors");
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  EXPECT_EQ(raw->Find("decoded"), nullptr);
  r = RunDifftrain(sample + "--vae " + ShellQuote(dir + "/moved") + " --out " +
                   ShellQuote(dir + "/moved.png"));
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Image to image: a 32 × 32 picture through the VAE's encoder (a draw of its posterior from
  // the seed), as its latents given as a tensor.
  std::vector<uint8_t> pixels(32 * 32);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(i * 7 % 256);
  ASSERT_TRUE(io::WritePng(dir + "/start.png", pixels.data(), 32, 32, 1).ok());
  const std::string image = sample + "--seed 4 --strength 0.5 --image ";
  r = RunDifftrain(image + ShellQuote(dir + "/start.png") + " --vae " + ShellQuote(dir + "/moved") +
                   " --raw " + ShellQuote(dir + "/from_png.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<Vae> vae = Vae::Load(dir + "/moved");
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  std::vector<float> x(pixels.size()), latents(4 * 16 * 16);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 2.0f * (pixels[i] / 255.0f) - 1.0f;
  ASSERT_TRUE(vae->Encode(x.data(), 1, 32, 32, VaePosterior::kSample, 4, 0, latents.data()).ok());
  io::SafetensorsWriter encoded;
  encoded.AddF32("latents", {4, 16, 16}, latents.data());
  ASSERT_TRUE(encoded.WriteAtomic(dir + "/start.safetensors").ok());
  r = RunDifftrain(image + ShellQuote(dir + "/start.safetensors") + " --vae none --raw " +
                   ShellQuote(dir + "/from_latents.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<io::SafetensorsFile> from_png = io::SafetensorsFile::Read(dir + "/from_png.st");
  Result<io::SafetensorsFile> from_latents = io::SafetensorsFile::Read(dir + "/from_latents.st");
  ASSERT_TRUE(from_png.ok() && from_latents.ok());
  std::vector<float> a(4 * 4 * 16 * 16), b(a.size());
  ASSERT_TRUE(from_png->CopyF32("images", {4, 4, 16, 16}, a.data()).ok());
  ASSERT_TRUE(from_latents->CopyF32("images", {4, 4, 16, 16}, b.data()).ok());
  EXPECT_EQ(a, b);
  r = RunDifftrain(image + ShellQuote(dir + "/start.png") + " --vae none --raw " +
                   ShellQuote(dir + "/none.st"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a picture and this model samples latents of 4 channels: give --vae"),
            std::string::npos)
      << r.output;
}

// A LoRA run (the job's lora section) from pretrained weights: its checkpoint samples the
// adapters fused; `export --format lora` writes the adapters as a LoRA file (no `unet.` prefix:
// a DiT has no diffusers form) which `sample --lora` fuses into those weights to the same
// samples, bit for bit. A whole-model checkpoint has no adapters to export.
TEST_F(SampleCommandTest, ALoraRunExportsWhatSampleFusesIntoItsBase) {
  CommandResult r =
      RunDifftrain("export --checkpoint " + Ckpt() + " --weights model --format state-dict --out " +
                   ShellQuote(File("lora-base.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::filesystem::path job = *dir_ / "lora-job.yaml";
  std::ofstream(job) << kTinyJob << "optimizer: {lr: 0.01}\n"
                     << "lora: {rank: 2, targets: [qkv, final_layer.linear, adaLN_modulation.1]}\n"
                     << "checkpoint: {dir: " << File("lora-ckpt")
                     << ", init_from: " << File("lora-base.safetensors") << "}\n";
  r = RunDifftrain("train --config " + ShellQuote(job.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string lora_ckpt = ShellQuote(File("lora-ckpt"));
  r = RunDifftrain("export --checkpoint " + lora_ckpt + " --weights model --format lora --out " +
                   ShellQuote(File("adapters.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<io::SafetensorsFile> adapters = io::SafetensorsFile::Read(File("adapters.safetensors"));
  ASSERT_TRUE(adapters.ok());
  EXPECT_EQ(adapters->Names().size(), 2u * (2 + 1 + 3));  // qkv ×2, the final linear, 3 adaLNs
  ASSERT_NE(adapters->Find("blocks.1.attn.qkv.lora.down.weight"), nullptr);
  EXPECT_EQ(adapters->Find("blocks.1.attn.qkv.lora.up.weight")->shape,
            (std::vector<int64_t>{96, 2}));

  const std::string model =
      " --model custom --input-size 8 --patch 2 --in-channels 1 --hidden 32 --depth 2 "
      "--heads 4 --num-classes 10";
  const std::vector<float> trained =
      Images("--checkpoint " + lora_ckpt + " --weights model", "lora-trained.safetensors");
  const std::string base = "--pretrained " + ShellQuote(File("lora-base.safetensors")) + model;
  EXPECT_EQ(Images(base + " --lora " + ShellQuote(File("adapters.safetensors")),
                   "lora-fused.safetensors"),
            trained);
  EXPECT_NE(Images(base, "lora-base-samples.safetensors"), trained);

  r = RunDifftrain("export --checkpoint " + Ckpt() + " --format lora --out " +
                   ShellQuote(File("none.safetensors")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the checkpoint trained the whole model, not LoRA adapters"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace difftrain
