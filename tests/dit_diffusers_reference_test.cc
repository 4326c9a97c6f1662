// Checks DiT in diffusers' form against diffusers 0.27.2 (tests/reference/dit_pipeline.py):
//   - a DiTPipeline folder as pretrained weights: the model read from transformer/config.json,
//     its tensors from diffusers' names (qkv from to_q, to_k and to_v; one embedder from every
//     block's copies), and `difftrain sample --pretrained` of it samples what DiTPipeline samples
//     from the same x_T, with the folder's DDIM scheduler and VAE, its classes also by the names
//     of its id2label; a pipeline whose blocks' copies differ is refused;
//   - `difftrain export --format diffusers` of a DiT trained here: the Transformer2DModel
//     diffusers loads computes the model's output, and, around a base pipeline (--pipeline),
//     DiTPipeline samples what `sample --checkpoint` samples of the run.
// diffusers' DiT embeds timesteps with frequencies exp(-ln(10000) i / 127) where DiT's code (and
// difftrain) divides by 128; the reference sets DiT's, and prints how far diffusers' own lands.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "tests/testing/python_reference.h"

namespace difftrain::testing {
namespace {

namespace fs = std::filesystem;

constexpr double kBound = 1e-5;
// dit_pipeline.py make's transformer, as difftrain's flags give it.
constexpr const char* kPipelineModel =
    "--model custom --input-size 8 --patch 2 --hidden 32 --depth 2 --heads 2 --num-classes 1000";

class DitDiffusersReferenceTest : public DiffusersReference {
 protected:
  CommandResult Difftrain(const std::string& args) {
    return RunCommand(fmt::format("{} {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), args));
  }
  // dit_pipeline.py make's pipeline in `name`; its path, or "" on failure.
  std::string MakePipeline(const std::string& name, const std::string& kind = "") {
    const std::string folder = (dir_ / name).string();
    const CommandResult made =
        RunScript("dit_pipeline.py", "make " + ShellQuote(folder) + " 5 " + kind);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return made.exit_code == 0 ? folder : "";
  }
  // `debug-dump` of one batch at fixed timesteps from the weights `from`; its path.
  std::string Dump(const std::string& model, const std::string& from, const std::string& name) {
    const std::string out = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = Difftrain(
        fmt::format("debug-dump {} --init-from {} --batch 3 --timesteps 10,500,999 --out {}", model,
                    ShellQuote(from), ShellQuote(out)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
  // The diffusers Transformer2DModel of `folder` on the dump's batch: within kBound of it.
  void ExpectForwardMatches(const std::string& folder, const std::string& dump) {
    const CommandResult r =
        RunScript("dit_pipeline.py",
                  fmt::format("forward {} {} {}", ShellQuote(folder), ShellQuote(dump), kBound));
    std::cout << folder << ": " << LastLine(r.output) << "\n";
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  // DiTPipeline's run of `folder` (classes 3 and 7, or by their names with `by_name`, guidance 4,
  // 5 DDIM steps): its file.
  std::string Reference(const std::string& folder, const std::string& name, bool by_name = false) {
    const std::string json = (dir_ / (name + ".json")).string();
    std::ofstream(json) << (by_name ? R"({"classes": [], "labels": ["tiger shark", "cock"], )"
                                    : R"({"classes": [3, 7], )")
                        << R"("guidance": 4.0, "steps": 5, "seed": 3})";
    const std::string out = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = RunScript(
        "dit_pipeline.py",
        fmt::format("run {} {} {}", ShellQuote(folder), ShellQuote(out), ShellQuote(json)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
  // difftrain's samples of the same classes (`classes`) from the reference's x_T (`source`:
  // --pretrained or --checkpoint and their flags) against the reference's latents and their
  // decoding.
  void ExpectSamplesMatch(const std::string& reference, const std::string& source,
                          const std::string& name, const std::string& classes = "3,7") {
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult r = Difftrain(fmt::format(
        "sample {} --initial-noise {} --classes {} --per-class 1 --steps 5 --sampler ddim "
        "--out {} --raw {}",
        source, ShellQuote(reference), ShellQuote(classes),
        ShellQuote((dir_ / (name + ".png")).string()), ShellQuote(raw)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Result<io::SafetensorsFile> want = io::SafetensorsFile::Read(reference);
    Result<io::SafetensorsFile> got = io::SafetensorsFile::Read(raw);
    ASSERT_TRUE(want.ok() && got.ok());
    const std::vector<float> latents = ReferenceTensor(*want, "latents");
    const double latents_error = RelativeL2(ReferenceTensor(*got, "images"), latents);
    const double decoded_error =
        RelativeL2(ReferenceTensor(*got, "decoded"), ReferenceTensor(*want, "decoded"));
    std::cout << name << ": relative L2 latents " << latents_error << ", decoded " << decoded_error
              << "\n";
    EXPECT_LE(latents_error, kBound);
    EXPECT_LE(decoded_error, kBound);
    EXPECT_GT(RelativeL2(ReferenceTensor(*want, "noise"), latents), 0.1) << "nothing was denoised";
  }
};

TEST_F(DitDiffusersReferenceTest, SamplesADiTPipelineAsDiffusersDoes) {
  const std::string pipeline = MakePipeline("pipeline");
  ASSERT_FALSE(pipeline.empty());
  // The model's tensors read from diffusers' names: its output is the Transformer2DModel's.
  ExpectForwardMatches(pipeline, Dump(kPipelineModel, pipeline, "dump"));
  // The model from transformer/config.json, the scheduler and VAE from the pipeline, DiT's
  // guidance 4 by default.
  ExpectSamplesMatch(Reference(pipeline, "want"), "--pretrained " + ShellQuote(pipeline),
                     "pipeline");
  // Classes by the names of model_index.json's id2label, as DiTPipeline.get_label_ids reads
  // them (each comma-separated synonym a name); a name it has not is refused.
  ExpectSamplesMatch(Reference(pipeline, "want_named", /*by_name=*/true),
                     "--pretrained " + ShellQuote(pipeline), "named", "tiger shark,cock");
  CommandResult named = Difftrain("sample --pretrained " + ShellQuote(pipeline) +
                                  " --classes 'white shark' --steps 2 --out " +
                                  ShellQuote((dir_ / "unnamed.png").string()));
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_THAT(named.output, ::testing::HasSubstr("--classes: 'white shark' is no class number and "
                                                 "none of the 5 names of id2label"));

  // Blocks whose embedders were trained apart have no place in difftrain's DiT.
  const std::string untied = MakePipeline("untied", "untied");
  ASSERT_FALSE(untied.empty());
  const CommandResult r =
      Difftrain("sample --pretrained " + ShellQuote(untied) + " --classes 1 --steps 2 --out " +
                ShellQuote((dir_ / "untied.png").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("differs from 'transformer_blocks.0.norm1.emb."));
}

TEST_F(DitDiffusersReferenceTest, ExportsWhatDiffusersLoadsAndDiTPipelineSamples) {
  const std::string pipeline = MakePipeline("base");
  ASSERT_FALSE(pipeline.empty());
  // Two steps from the pipeline's transformer.
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, "
                        "depth: 2, num_heads: 2, num_classes: 1000}\n"
                     << "data: {kind: synthetic}\n"
                     << "batch: {micro: 2, global: 2}\n"
                     << "optimizer: {lr: 0.01}\n"
                     << "train: {steps: 2, log_every: 1}\n"
                     << "checkpoint: {dir: " << ckpt << ", every: 2, init_from: " << pipeline
                     << "}\n";
  CommandResult r = Difftrain("train --config " + ShellQuote(job));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The transformer alone: diffusers computes what the run's weights compute, and reading it
  // back gives those weights to the bit.
  const std::string alone = (dir_ / "alone").string();
  r = Difftrain(fmt::format("export --checkpoint {} --weights model --out {}", ShellQuote(ckpt),
                            ShellQuote(alone)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_regular_file(fs::path(alone) / "transformer" / "config.json"));
  const std::string dump = Dump(kPipelineModel, ckpt, "trained");
  ExpectForwardMatches(alone, dump);
  Result<io::SafetensorsFile> trained = io::SafetensorsFile::Read(dump);
  Result<io::SafetensorsFile> back =
      io::SafetensorsFile::Read(Dump(kPipelineModel, alone, "read_back"));
  ASSERT_TRUE(trained.ok() && back.ok());
  EXPECT_EQ(ReferenceTensor(*back, "output"), ReferenceTensor(*trained, "output"));
  // The run moved the weights away from the base's.
  EXPECT_NE(ReferenceTensor(*back, "output"),
            ReferenceTensor(*io::SafetensorsFile::Read(Dump(kPipelineModel, pipeline, "base")),
                            "output"));

  // Around the base's VAE and scheduler: DiTPipeline samples what the checkpoint samples with
  // that VAE and the scheduler's spacing (unclipped, as diffusers' DDIM with clip_sample false:
  // a run on synthetic data is not known to be of latents).
  const std::string whole = (dir_ / "whole").string();
  r = Difftrain(fmt::format("export --checkpoint {} --weights model --pipeline {} --out {}",
                            ShellQuote(ckpt), ShellQuote(pipeline), ShellQuote(whole)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectSamplesMatch(Reference(whole, "whole_want"),
                     fmt::format("--checkpoint {} --weights model --vae {} --cfg 4 "
                                 "--timestep-spacing leading --steps-offset 0 "
                                 "--set-alpha-to-one true --clip-denoised false",
                                 ShellQuote(ckpt), ShellQuote(pipeline + "/vae")),
                     "whole");
}

}  // namespace
}  // namespace difftrain::testing
