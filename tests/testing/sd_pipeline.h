// The fixture of the tests that check `difftrain sample` against diffusers' Stable Diffusion
// pipelines (tests/sd_pipeline_reference_test.cc, tests/export_reference_test.cc): a small
// pipeline made by tests/reference/sd_pipeline.py, diffusers' runs of it, and difftrain's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/diffusion/guided_model.h"
#include "model/io/checkpoint.h"
#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {

inline constexpr double kBound = 1e-5;

// Captioned pictures for fine-tuning: DIR/NN.png of each size (width × height) in `sizes`, its
// pixels a pattern of its number, and DIR/metadata.jsonl pairing it with captions[k].
inline void WriteCaptionedPictures(const std::filesystem::path& dir,
                                   const std::vector<std::pair<int, int>>& sizes,
                                   const std::vector<std::string>& captions) {
  std::filesystem::create_directories(dir);
  std::ofstream jsonl(dir / "metadata.jsonl");
  for (size_t k = 0; k < sizes.size(); ++k) {
    const auto [width, height] = sizes[k];
    std::vector<uint8_t> pixels(width * height * 3);
    for (size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<uint8_t>((i * 29 + k * 53) % 251);
    const std::string file = fmt::format("{:02d}.png", k);
    ASSERT_TRUE(io::WritePng((dir / file).string(), pixels.data(), width, height, 3).ok());
    jsonl << nlohmann::json{{"file_name", file}, {"text", captions[k]}}.dump() << "\n";
  }
}

// `data pack` of the captioned pictures in `pictures` at 16 px through `pipeline`'s VAE and (its
// captions) text encoder into `out`.
inline void PackCaptionedPictures(const std::string& pictures, const std::string& pipeline,
                                  const std::string& out) {
  const CommandResult pack = RunCommand(fmt::format(
      "{} data pack --dataset image_folder --path {} --image-size 16 --crop square --vae {} "
      "--text-encoder {} --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pictures), ShellQuote(pipeline),
      ShellQuote(pipeline), ShellQuote(out)));
  ASSERT_EQ(pack.exit_code, 0) << pack.output;
}

// `difftrain train` of `job` in one process of one OpenMP thread.
inline CommandResult TrainInOneProcess(const std::string& job) {
  return RunCommand(fmt::format("OMP_NUM_THREADS=1 {} train --config {} 2>&1",
                                ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
}

// `difftrain train` of `job` (parallel: {dp: 2}) as two ranks on this machine, meeting in a
// file store in `dir`; rank 1's output in dir/rank1.log. Fails where either rank fails.
inline CommandResult TrainOnTwoRanks(const std::string& job, const std::filesystem::path& dir) {
  const std::string rank = fmt::format(
      "OMP_NUM_THREADS=1 {} train --config {} --world 2 --store {}", ShellQuote(DIFFTRAIN_BINARY),
      ShellQuote(job), ShellQuote((dir / "store").string()));
  return RunCommand(fmt::format(
      "sh -c {}", ShellQuote(fmt::format("{} --rank 1 > {}/rank1.log 2>&1 & p=$!; {} --rank 0 "
                                         "2>&1 || rc=1; wait $p || rc=1; exit ${{rc:-0}}",
                                         rank, dir.string(), rank))));
}

// Shard 0 of the newest complete checkpoint in `ckpt`.
inline io::SafetensorsFile NewestShard0(const std::string& ckpt) {
  io::CheckpointStore store(ckpt, 10);
  const int64_t step = store.LatestComplete()->value();
  return std::move(store.ReadShard(step, 0, *store.World(step))).value();
}

// A run broken after its first step: checkpoint directory `to` holding only `from`'s first step.
inline void KeepTheFirstStep(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  std::filesystem::copy(from + "/step-00000001", to + "/step-00000001",
                        std::filesystem::copy_options::recursive);
}

// A job fine-tuning `pipeline`'s UNet on the latent folder `packed` for `steps` steps of
// `batch` (2 samples by default), its checkpoints (every `every` steps; 0: at the end) in `ckpt`,
// with the sections `extra` too; written to `job`.
inline void WriteFineTuneJob(const std::string& job, const std::string& pipeline,
                             const std::string& packed, const std::string& ckpt, int steps,
                             int every = 0, const std::string& extra = "",
                             const std::string& batch = "batch: {micro: 2, global: 2}") {
  nlohmann::json unet = nlohmann::json::parse(std::ifstream(pipeline + "/unet/config.json"));
  unet["name"] = "unet";
  std::ofstream(job) << "model: " << unet.dump() << "\n"
                     << "diffusion: {schedule: scaled_linear, beta_start: 0.00085, beta_end: "
                        "0.012}\n"
                     << "data: {kind: latent_folder, path: " << packed << "}\n"
                     << batch << "\n"
                     << "train: {steps: " << steps << ", log_every: 1}\n"
                     << extra << "checkpoint: {dir: " << ckpt
                     << ", every: " << (every > 0 ? every : steps)
                     << ", keep: 10, init_from: " << pipeline << "/unet}\n";
}

class SdPipelineReferenceTest : public DiffusersReference {
 protected:
  // The python of the text encoder's environment (scripts/text_encoder_env.sh); "" when PyPI
  // cannot be reached.
  static std::string TextPython() {
    const CommandResult env = RunCommand(
        ShellQuote(DIFFTRAIN_SOURCE_DIR "/scripts/text_encoder_env.sh") + " 2>/dev/null");
    return env.exit_code == 0 ? LastLine(env.output) : "";
  }

  // The pipeline folder ("sd": StableDiffusionPipeline, "lcm": LatentConsistencyModelPipeline,
  // "sdxl": StableDiffusionXLPipeline, "refiner": SDXL's refiner; sd_pipeline.py make's kinds); its
  // text half made by `text_python`, SD 1.x's (quick GELU) for "ldm1", SDXL's two encoders for
  // "sdxl" (the refiner keeps the second), else SD 2.x's.
  std::string MakePipeline(const std::string& text_python, const std::string& kind = "sd") {
    // SDXL's text half is its two encoders and tokenizers.
    const std::string dir = ShellQuote(dir_.string());
    const std::string text_args =
        kind == "sdxl" || kind == "ldmxl" || kind == "refiner" || kind == "ldmxl_refiner"
            ? "sdxl " + dir
            : fmt::format("sd {} {}", dir, kind == "ldm1" ? 1 : 2);
    const CommandResult text = RunCommand(fmt::format(
        "{} {} {} '[\"x\"]' 3 2>&1", ShellQuote(text_python),
        ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/text_encoder.py"), text_args));
    EXPECT_EQ(text.exit_code, 0) << text.output;
    const std::string pipeline = (dir_ / "pipeline").string();  // text_encoder.py's
    const CommandResult made =
        RunScript("sd_pipeline.py", "make " + ShellQuote(pipeline) + " 5 " + kind);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return text.exit_code == 0 && made.exit_code == 0 ? pipeline : "";
  }

  // Fine-tuning starts from `weights` (checkpoint.init_from, as `debug-dump --init-from` takes
  // it): the model of the sampling `config` (a sample's metadata) then holds `pipeline`'s UNet,
  // tensor for tensor.
  void ExpectInitFromHoldsItsUNet(const std::string& config, const std::string& weights,
                                  const std::string& pipeline) {
    std::ofstream(dir_ / "job.yaml") << "model: " << config << "\n";
    const std::string dump = (dir_ / "init.safetensors").string();
    const CommandResult dumped = RunCommand(
        fmt::format("{} debug-dump --config {} --seed 1 --batch 2 --init-from {} --out {} 2>&1",
                    ShellQuote(DIFFTRAIN_BINARY), ShellQuote((dir_ / "job.yaml").string()),
                    ShellQuote(weights), ShellQuote(dump)));
    ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
    const CommandResult same =
        RunScript("init_weights.py",
                  "compare-diffusers " + ShellQuote(pipeline + "/unet") + " " + ShellQuote(dump));
    EXPECT_EQ(same.exit_code, 0) << same.output;
  }

  // diffusers' run of `settings` into `name`.safetensors; its path.
  std::string Reference(const std::string& pipeline, const nlohmann::json& settings,
                        const std::string& name) {
    const std::string json = (dir_ / (name + ".json")).string();
    std::ofstream(json) << settings.dump();
    const std::string out = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = RunScript(
        "sd_pipeline.py",
        fmt::format("run {} {} {}", ShellQuote(pipeline), ShellQuote(out), ShellQuote(json)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }

  // The noise `difftrain sample --seed 5` draws at each step for samples 0 … images − 1 (their
  // step noise streams, sampler.h), each [4, h, w] of the UNet's latents, `draws` draws a step;
  // none at the last. Written for sd_pipeline.py's step_noise; its path.
  std::string WriteStepNoise(const std::string& pipeline, int steps, int images, int draws) {
    const nlohmann::json unet =
        nlohmann::json::parse(std::ifstream(pipeline + "/unet/config.json"));
    const size_t n = 4 * unet["sample_size"].get<size_t>() * unet["sample_size"].get<size_t>();
    std::vector<float> noise(size_t(steps) * draws * images * n, 0.0f);
    std::vector<double> z(n);
    for (int b = 0; b < images; ++b) {
      Rng rng(5, RngStream::kSample, StepNoiseCounter(b));
      for (int k = 0; k + 1 < steps; ++k) {
        for (int d = 0; d < draws; ++d) {
          DrawFrameNoise(rng, 0.0, 1, n, z.data());
          std::copy(z.begin(), z.end(), noise.begin() + ((size_t(k) * draws + d) * images + b) * n);
        }
      }
    }
    io::SafetensorsWriter file;
    file.AddF32("noise", {steps, draws, images, int64_t(n)}, noise.data());
    const std::string path = (dir_ / "step_noise.safetensors").string();
    EXPECT_TRUE(file.WriteAtomic(path).ok());
    return path;
  }

  // K latents [K, 4, h, w] of the UNet's size (smooth, of about the scale of SD's scaled
  // latents) as "images" of a safetensors file, for image to image; its path.
  std::string WriteStartLatents(const std::string& pipeline, int K, bool masked = false) {
    const nlohmann::json unet =
        nlohmann::json::parse(std::ifstream(pipeline + "/unet/config.json"));
    const int64_t side = unet["sample_size"].get<int64_t>();
    std::vector<float> latents(K * 4 * side * side);
    Rng rng(21, RngStream::kSample, 0);
    for (size_t i = 0; i < latents.size(); ++i) {
      const double x = double(i % side) / side, y = double(i / side % side) / side;
      latents[i] =
          static_cast<float>(std::sin(4 * x + 3 * y + i / (side * side)) + 0.3 * rng.Normal());
    }
    io::SafetensorsWriter file;
    file.AddF32("images", {K, 4, side, side}, latents.data());
    // An inpainting UNet's masked image: other latents of the same kind.
    std::vector<float> other(latents.size());
    for (size_t i = 0; i < other.size(); ++i)
      other[i] = static_cast<float>(std::cos(3 * double(i % side) / side + i / side % 5) +
                                    0.3 * rng.Normal());
    if (masked) file.AddF32("masked_image_latents", {K, 4, side, side}, other.data());
    const std::string path =
        (dir_ / fmt::format("start{}{}.safetensors", K, masked ? "_masked" : "")).string();
    EXPECT_TRUE(file.WriteAtomic(path).ok());
    return path;
  }

  // Case `name` sampled by diffusers (`settings`) and by difftrain (`flags`) from the same x_T:
  // the final latents and their decoding must agree within `bound`, and differ from x_T.
  // difftrain samples `pretrained` where it is given, else the pipeline itself.
  // diffusers' file and final latents, and difftrain's file.
  struct Compared {
    std::string reference;
    std::vector<float> latents;
    std::optional<io::SafetensorsFile> got;
  };
  Compared Compare(const std::string& pipeline, const nlohmann::json& settings,
                   const std::string& flags, const std::string& name,
                   const std::string& pretrained = "", double bound = kBound) {
    Compared c;
    c.reference = Reference(pipeline, settings, name + "_want");
    Result<io::SafetensorsFile> want = io::SafetensorsFile::Read(c.reference);
    EXPECT_TRUE(want.ok()) << want.status().message();
    Result<io::SafetensorsFile> got =
        Sample(pretrained.empty() ? pipeline : pretrained, c.reference, flags, name);
    EXPECT_TRUE(got.ok()) << got.status().message();
    if (!want.ok() || !got.ok()) return c;
    c.latents = ReferenceTensor(*want, "latents");
    const double latents_error = RelativeL2(ReferenceTensor(*got, "images"), c.latents);
    const double decoded_error =
        RelativeL2(ReferenceTensor(*got, "decoded"), ReferenceTensor(*want, "decoded"));
    std::cout << name << ": relative L2 latents " << latents_error << ", decoded " << decoded_error
              << "\n";
    EXPECT_LE(latents_error, bound);
    EXPECT_LE(decoded_error, bound);
    EXPECT_GT(RelativeL2(ReferenceTensor(*want, "noise"), c.latents), 0.1)
        << "nothing was denoised";
    c.got = std::move(got).value();
    return c;
  }

  // A case of sampling from an image (image to image, inpainting): the scheduler, its steps
  // and strength, the steps that run, difftrain's flags beyond the common ones.
  struct ImageCase {
    const char* scheduler;
    int steps;
    double strength;
    int run;  // ⌊steps × strength⌋ (inpainting at strength 1: steps)
    std::string flags;
  };
  // Its settings for sd_pipeline.py (guidance 5, 2 samples from `image`), with the step noise
  // of the samplers that draw, and its flags for difftrain (`extra` after the image).
  std::pair<nlohmann::json, std::string> ImageCaseRun(const std::string& pipeline,
                                                      const ImageCase& c, const std::string& image,
                                                      int seed, const std::string& extra = "") {
    nlohmann::json settings = {{"prompt", "a photo of a boat"},
                               {"negative_prompt", nullptr},
                               {"steps", c.steps},
                               {"guidance", 5.0},
                               {"spacing", nullptr},
                               {"scheduler", c.scheduler},
                               {"image", image},
                               {"strength", c.strength},
                               {"images", 2},
                               {"seed", seed}};
    const std::string scheduler = c.scheduler;
    if (scheduler == "tcd") settings["eta"] = 0.3;
    if (c.flags.find("--karras-sigmas true") != std::string::npos) settings["karras"] = true;
    if (scheduler == "euler_ancestral" || scheduler == "tcd" || scheduler == "dpmsolver_sde") {
      settings["step_noise"] =
          WriteStepNoise(pipeline, c.run, 2, scheduler == "dpmsolver_sde" ? 2 : 1);
    }
    const std::string flags = fmt::format(
        "--prompt 'a photo of a boat' --cfg 5 --per-class 2 --sampler {} --steps {} --image {} "
        "{} --strength {} {}",
        c.scheduler, c.steps, ShellQuote(image), extra, c.strength, c.flags);
    return {settings, flags};
  }

  // How far difftrain's samples with `flags`, from the x_T of diffusers' run `want`
  // (`want`_want.safetensors), land from that run's latents: their relative L2, printed after
  // `what`; NaN where either could not be read.
  double MovedFrom(const std::string& pipeline, const std::string& want, const std::string& flags,
                   const std::string& what) {
    const std::string reference = (dir_ / (want + "_want.safetensors")).string();
    Result<io::SafetensorsFile> run = io::SafetensorsFile::Read(reference);
    Result<io::SafetensorsFile> got = Sample(pipeline, reference, flags, want + "_moved");
    EXPECT_TRUE(run.ok() && got.ok());
    if (!run.ok() || !got.ok()) return std::numeric_limits<double>::quiet_NaN();
    const double moved =
        RelativeL2(ReferenceTensor(*got, "images"), ReferenceTensor(*run, "latents"));
    std::cout << what << ": relative L2 latents " << moved << "\n";
    return moved;
  }

  // difftrain's samples from `noise` with `flags` into `name`.safetensors.
  Result<io::SafetensorsFile> Sample(const std::string& pipeline, const std::string& noise,
                                     const std::string& flags, const std::string& name) {
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = RunCommand(
        fmt::format("{} sample --pretrained {} --initial-noise {} {} --out {} --raw {} 2>&1",
                    ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline), ShellQuote(noise), flags,
                    ShellQuote((dir_ / (name + ".png")).string()), ShellQuote(raw)));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    return io::SafetensorsFile::Read(raw);
  }
};

}  // namespace difftrain::testing
