// Checks the C++ UNet against diffusers' UNet2DConditionModel (0.27.2, float64): `difftrain
// debug-dump --config JOB.yaml` writes one training step of a tiny UNet, and
// tests/reference/check_unet_dump.py rebuilds the model with UNet2DConditionModel(**config),
// loads the dump's weights strictly and compares x_t, the output, the loss and every gradient
// (relative L2 error <= 3e-5 each, <= 2e-6 all gradients together: the checker says why).
// diffusers comes from PyPI (tests/reference/diffusers_env.sh);
// where PyPI cannot be reached, the tests skip and say so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/io/checkpoint.h"
#include "model/io/lora.h"
#include "model/io/safetensors.h"
#include "model/text/text_testing.h"
#include "model/vae/vae_testing.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/run_command.h"

namespace difftrain::testing {
namespace {

struct UNetCase {
  const char* name;
  const char* model;      // the job's model section (YAML flow mapping)
  const char* diffusion;  // debug-dump's diffusion flags
  bool random_weights;
  int seed;
  const char* checker_flags = "";  // check_unet_dump.py's tolerances where not its defaults
};

void PrintTo(const UNetCase& c, std::ostream* os) {
  *os << c.name;
}

// The case the checker's own tests perturb (two channels per group, random weights).
constexpr UNetCase kCheckerCase{
    "Checker",
    "{name: unet, block_out_channels: [4, 8], layers_per_block: 1, attention_head_dim: 2, "
    "cross_attention_dim: 8, norm_num_groups: 2, down_block_types: [CrossAttnDownBlock2D, "
    "DownBlock2D], up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8, "
    "text_length: 5}",
    "", true, 1};

// SD's four-level ladder, small: attention in the first three levels, a plain last one.
constexpr const char* kSdLadder =
    "{name: unet, block_out_channels: [8, 16, 16, 32], layers_per_block: 2, "
    "attention_head_dim: [2, 2, 4, 4], cross_attention_dim: 8, norm_num_groups: 4, "
    "down_block_types: [CrossAttnDownBlock2D, CrossAttnDownBlock2D, CrossAttnDownBlock2D, "
    "DownBlock2D], up_block_types: [UpBlock2D, CrossAttnUpBlock2D, CrossAttnUpBlock2D, "
    "CrossAttnUpBlock2D], sample_size: 8, text_length: 4}";

// SDXL's shape, small (its micro-conditioning: a 6-feature pooled text, six time ids of 4
// features each).
constexpr const char* kSdxlShape =
    "{name: unet, block_out_channels: [4, 8, 8], layers_per_block: 2, "
    "attention_head_dim: [1, 2, 2], cross_attention_dim: 6, norm_num_groups: 2, "
    "use_linear_projection: true, transformer_layers_per_block: [1, 2, 3], "
    "down_block_types: [DownBlock2D, CrossAttnDownBlock2D, CrossAttnDownBlock2D], "
    "up_block_types: [CrossAttnUpBlock2D, CrossAttnUpBlock2D, UpBlock2D], "
    "addition_embed_type: text_time, addition_time_embed_dim: 4, "
    "projection_class_embeddings_input_dim: 30, sample_size: 8, text_length: 3, "
    "text_dropout: 0.3}";

// The UNet's tests also dump a training step of difftrain's model.
template <typename Env>
class UNetReferenceOf : public PythonReference<Env> {
 protected:
  // `difftrain debug-dump` of case c into dir_/dump.safetensors; its path, or "" on failure.
  std::string Dump(const UNetCase& c) {
    const std::string job = (this->dir_ / "job.yaml").string();
    std::ofstream(job) << "model: " << c.model << "\n";
    const std::string dump = (this->dir_ / "dump.safetensors").string();
    const CommandResult dumped =
        RunCommand(fmt::format("{} debug-dump --config {} {} --seed {} --batch 3 {}--out {} 2>&1",
                               ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job), c.diffusion, c.seed,
                               c.random_weights ? "--random-weights " : "", ShellQuote(dump)));
    EXPECT_EQ(dumped.exit_code, 0) << dumped.output;
    return dumped.exit_code == 0 ? dump : "";
  }
};
using UNetReference = UNetReferenceOf<DiffusersEnv>;

class UNetReferenceTest : public UNetReference, public ::testing::WithParamInterface<UNetCase> {};

TEST_P(UNetReferenceTest, DebugDumpMatchesDiffusers) {
  const std::string dump = Dump(GetParam());
  ASSERT_FALSE(dump.empty());
  // A LoRA's gradients are few tensors of alike size, each with fp32's rounding of the model's
  // weight gradients (1e-6 to 1e-5 relative), none large and exact to dominate the sum as the
  // model's biggest gradients do: all together they are within 1e-5 (a wrong adapter, scale or
  // kernel layout is off by 1e-3 or more). Each is within 1e-4: A's gradient s·Bᵀ·∂W can
  // cancel to 1e-3 of the largest (SDXL's mid-block cross-attention to_q: 1.2e-5 against
  // 1.5e-2) and then carries ∂W's fp32 rounding as 3e-5 of itself.
  const bool lora = std::string_view(GetParam().diffusion).find("--lora-rank") != std::string::npos;
  const CommandResult checked = RunScript(
      "check_unet_dump.py",
      ShellQuote(dump) + " " + (lora ? "--tol 1e-4 --tol-all 1e-5" : GetParam().checker_flags));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

// Conv and linear projections, one and several heads (a number or one per block), two levels
// and SD's four-level ladder (attention in the first three, a plain last block, 2 layers per
// block), epsilon- and v-prediction with the scaled linear schedule (and rescaled to zero
// terminal SNR), text dropout, PyTorch's own initialisation and random weights.
INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, UNetReferenceTest,
    ::testing::Values(
        UNetCase{"ConvProjection",
                 "{name: unet, block_out_channels: [4, 8], layers_per_block: 1, "
                 "attention_head_dim: 2, cross_attention_dim: 8, norm_num_groups: 2, "
                 "down_block_types: [CrossAttnDownBlock2D, DownBlock2D], "
                 "up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8, "
                 "text_length: 5}",
                 "", true, 1},
        UNetCase{"LinearProjectionHeadsPerBlock",
                 "{name: unet, block_out_channels: [8, 16], layers_per_block: 1, "
                 "attention_head_dim: [2, 4], cross_attention_dim: 12, norm_num_groups: 4, "
                 "use_linear_projection: true, in_channels: 3, out_channels: 3, "
                 "down_block_types: [CrossAttnDownBlock2D, CrossAttnDownBlock2D], "
                 "up_block_types: [CrossAttnUpBlock2D, CrossAttnUpBlock2D], sample_size: 4, "
                 "text_length: 3}",
                 "", true, 2},
        UNetCase{"SDLadder", kSdLadder, "", true, 3},
        UNetCase{"VPredictionTextDropout",
                 "{name: unet, block_out_channels: [8, 16], layers_per_block: 2, "
                 "attention_head_dim: [1, 2], cross_attention_dim: 6, norm_num_groups: 4, "
                 "use_linear_projection: true, down_block_types: [CrossAttnDownBlock2D, "
                 "DownBlock2D], up_block_types: [UpBlock2D, CrossAttnUpBlock2D], "
                 "sample_size: 8, text_length: 7, text_dropout: 0.5}",
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012 "
                 "--prediction v",
                 true, 4},
        // Zero terminal SNR, at its last timestep (x_t the noise, the v target −x0) and two
        // others: x_t and the loss from diffusers' rescale_zero_terminal_snr. Its gradients
        // together are 2.6e-6 from the float64 reference (OpenBLAS's Cooperlake kernels, AMD
        // EPYC Zen 4) and diffusers' own float32 run is 1.4e-6 from it: fp32's rounding of the
        // convolutions' weight gradients (5e-6 of each of the largest), spread over every
        // tensor. 5e-6 for all together; a wrong layer is off by 1e-3 or more.
        UNetCase{"VPredictionZeroTerminalSnr",
                 "{name: unet, block_out_channels: [4, 8], layers_per_block: 1, "
                 "attention_head_dim: 2, cross_attention_dim: 8, norm_num_groups: 2, "
                 "down_block_types: [CrossAttnDownBlock2D, DownBlock2D], "
                 "up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8, "
                 "text_length: 5}",
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012 "
                 "--prediction v --zero-terminal-snr --timesteps 999,998,500",
                 true, 6, "--tol-all 5e-6"},
        // SDXL's shape, small: a plain first level, transformers of 2 and 3 blocks (the mid
        // block's 3, the up blocks' mirrored), linear projections, and its micro-conditioning:
        // add_embedding of the pooled text (6 features) and the six time ids' sinusoids (4 each,
        // at 64 px: 64, 64, 0, 0, 64, 64) added to the time embedding; text dropout zeroes both.
        UNetCase{"SdxlBlocksAndMicroConditioning", kSdxlShape,
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012", true, 7},
        UNetCase{"PyTorchInitialisation",
                 "{name: unet, block_out_channels: [4, 8], layers_per_block: 1, "
                 "attention_head_dim: 2, cross_attention_dim: 8, norm_num_groups: 4, "
                 "down_block_types: [CrossAttnDownBlock2D, DownBlock2D], "
                 "up_block_types: [UpBlock2D, CrossAttnUpBlock2D], sample_size: 8}",
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012", false, 5},
        // LoRA training (random A and B): the adapters' gradients against peft's LoRA layers
        // beside the frozen modules. diffusers' training script's targets (every attention
        // projection) at alpha = rank; Linear and convolution targets (3×3 resnet convs, 1×1
        // projections) at alpha 2·rank.
        UNetCase{"LoraAttentionProjections", kSdLadder, "--lora-rank 2", true, 3},
        UNetCase{"LoraConvolutionsAndAlpha", kSdLadder,
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012 "
                 "--lora-rank 3 --lora-alpha 6 "
                 "--lora-targets proj_in,proj_out,conv1,ff.net.2,attn2.to_k",
                 true, 3},
        // SDXL's LoRA (train_text_to_image_lora_sdxl.py's targets) in blocks 2 and 3 deep.
        UNetCase{"LoraSdxl", kSdxlShape, "--lora-rank 2", true, 7}),
    [](const ::testing::TestParamInfo<UNetCase>& info) { return std::string(info.param.name); });

// The checker can fail, on each of its two bounds: a dump with one gradient 1e-3 off (far
// beyond fp32's rounding, far below a wrong layer's error) fails that tensor's bound, and one
// with every gradient 5e-6 off (within each tensor's bound) fails the bound on all gradients
// together.
using UNetCheckerTest = UNetReference;

TEST_F(UNetCheckerTest, FailsADumpWithOneGradientOff) {
  const std::string dump = Dump(kCheckerCase);
  ASSERT_FALSE(dump.empty());
  const std::string off = (dir_ / "off.safetensors").string();
  const CommandResult perturbed = RunScript(
      "perturb_dump.py", ShellQuote(dump) + " " + ShellQuote(off) + " grad.conv_in.weight 1.001");
  ASSERT_EQ(perturbed.exit_code, 0) << perturbed.output;
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(off));
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output,
              ::testing::ContainsRegex("grad\\.conv_in\\.weight  rel [0-9.e+-]+  FAIL"));
}

// A LoRA dump whose adapters' scale is not alpha / rank (the dump says alpha 4, its gradients
// are of alpha 2) fails every adapter's gradient.
TEST_F(UNetCheckerTest, FailsALoraDumpOfAnotherAlpha) {
  UNetCase c = kCheckerCase;
  c.diffusion = "--lora-rank 2 --lora-alpha 2";
  const std::string dump = Dump(c);
  ASSERT_FALSE(dump.empty());
  const std::string off = (dir_ / "off.safetensors").string();
  const CommandResult perturbed =
      RunScript("perturb_dump.py", ShellQuote(dump) + " " + ShellQuote(off) + " --metadata lora " +
                                       ShellQuote(R"({"rank": 2, "alpha": 4.0, "targets": []})"));
  ASSERT_EQ(perturbed.exit_code, 0) << perturbed.output;
  const CommandResult checked =
      RunScript("check_unet_dump.py", ShellQuote(off) + " --tol-all 1e-5");
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output, ::testing::ContainsRegex("grad\\.lora\\..*lora_A\\.weight  rel "
                                                       "[0-9.e+-]+  FAIL"));
}

TEST_F(UNetCheckerTest, FailsADumpWithEveryGradientSlightlyOff) {
  const std::string dump = Dump(kCheckerCase);
  ASSERT_FALSE(dump.empty());
  const std::string off = (dir_ / "off.safetensors").string();
  const CommandResult perturbed =
      RunScript("perturb_dump.py", ShellQuote(dump) + " " + ShellQuote(off) + " grad. 1.000005");
  ASSERT_EQ(perturbed.exit_code, 0) << perturbed.output;
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(off));
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output, ::testing::HasSubstr("all gradients together  rel"));
  EXPECT_THAT(checked.output, ::testing::HasSubstr("1 FAILED"));
}

// checkpoint.init_from with diffusers' own files: a UNet that save_pretrained wrote in float16
// into a pipeline's unet/ folder is what `debug-dump --init-from` (the path a job's
// checkpoint.init_from takes) starts from, tensor for tensor, and the step from those weights
// is diffusers' step.
using UNetInitFromTest = UNetReference;

TEST_F(UNetInitFromTest, DiffusersFp16WeightsLoadExactlyAndTheirStepMatches) {
  const std::string config_dump = Dump(kCheckerCase);  // the config, for diffusers
  ASSERT_FALSE(config_dump.empty());
  const std::filesystem::path unet = dir_ / "pipeline" / "unet";
  const CommandResult saved =
      RunScript("init_weights.py",
                "save-diffusers " + ShellQuote(config_dump) + " " + ShellQuote(unet.string()));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  ASSERT_TRUE(std::filesystem::exists(unet / "diffusion_pytorch_model.fp16.safetensors"))
      << saved.output;

  const std::string dump = (dir_ / "from_diffusers.safetensors").string();
  const CommandResult dumped = RunCommand(
      fmt::format("{} debug-dump --config {} --seed 1 --batch 3 --init-from {} --out {} 2>&1",
                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote((dir_ / "job.yaml").string()),
                  ShellQuote((dir_ / "pipeline").string()), ShellQuote(dump)));
  ASSERT_EQ(dumped.exit_code, 0) << dumped.output;
  const CommandResult compared = RunScript(
      "init_weights.py", "compare-diffusers " + ShellQuote(unet.string()) + " " + ShellQuote(dump));
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(dump));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;

  // A config that is not the weights' (one block fewer) is refused, naming what is missing.
  std::ofstream(dir_ / "other.yaml")
      << "model: {name: unet, block_out_channels: [4, 8], layers_per_block: 2, "
         "attention_head_dim: 2, cross_attention_dim: 8, norm_num_groups: 2, down_block_types: "
         "[CrossAttnDownBlock2D, DownBlock2D], up_block_types: [UpBlock2D, CrossAttnUpBlock2D], "
         "sample_size: 8, text_length: 5}\n";
  const CommandResult refused = RunCommand(fmt::format(
      "{} debug-dump --config {} --init-from {} --out {} 2>&1", ShellQuote(DIFFTRAIN_BINARY),
      ShellQuote((dir_ / "other.yaml").string()), ShellQuote((dir_ / "pipeline").string()),
      ShellQuote((dir_ / "other.safetensors").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("'down_blocks.0.resnets.1."));
}

// A diffusers pipeline's folder is enough to sample from: the UNet's config.json as diffusers
// 0.27.2's save_pretrained writes it (every key of its signature), the scheduler's config, the
// text encoder with its tokenizer and the VAE are each taken from the folder, and sample as
// each given by its own flag does.
TEST_F(UNetInitFromTest, APipelineFolderSamplesAsItsPartsGivenByFlags) {
  const std::string config_dump = Dump(kCheckerCase);
  ASSERT_FALSE(config_dump.empty());
  const std::filesystem::path pipeline = dir_ / "pipeline";
  CommandResult r = RunScript("init_weights.py", "save-diffusers " + ShellQuote(config_dump) + " " +
                                                     ShellQuote((pipeline / "unet").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunScript("init_weights.py",
                "save-scheduler " + ShellQuote((pipeline / "scheduler").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(pipeline / "model_index.json")
      << R"({"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]})";
  ASSERT_EQ(WriteTextEncoderFolder(pipeline / "text_encoder", 8, 3, 2, /*max_positions=*/77), "");
  ASSERT_EQ(WriteVaeFolder(pipeline / "vae",
                           {{"block_out_channels", {4, 8}},
                            {"norm_num_groups", 2},
                            {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                            {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}}},
                           4),
            "");

  const auto sample = [&](const std::string& args, const std::string& name) {
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult s = RunCommand(fmt::format(
        "{} sample {} --prompt 'a photo of a boat' --sampler ddim --steps 2 --per-class 2 --out {} "
        "--raw {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), args, ShellQuote((dir_ / (name + ".png")).string()),
        ShellQuote(raw)));
    EXPECT_EQ(s.exit_code, 0) << args << "\n" << s.output;
    Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(raw);
    EXPECT_TRUE(file.ok()) << file.status().message();
    return std::move(file).value();
  };
  const io::SafetensorsFile alone =
      sample("--pretrained " + ShellQuote(pipeline.string()), "alone");
  const nlohmann::json config = nlohmann::json::parse(alone.metadata().at("config"));
  EXPECT_EQ(config["block_out_channels"], nlohmann::json({4, 8}));
  EXPECT_EQ(config["cross_attention_dim"], 8);
  EXPECT_EQ(config["text_length"], 77);  // difftrain's default: diffusers' config has none
  const nlohmann::json how = nlohmann::json::parse(alone.metadata().at("sampling"));
  EXPECT_EQ(how["diffusion"]["schedule"], "scaled_linear");
  EXPECT_EQ(how["diffusion"]["beta_start"], 0.00085);
  EXPECT_EQ(how["diffusion"]["beta_end"], 0.012);
  EXPECT_EQ(how["diffusion"]["prediction"], "v");
  EXPECT_EQ(how["text_encoder"], pipeline.string());
  EXPECT_EQ(how["vae"], (pipeline / "vae" / "diffusion_pytorch_model.safetensors").string());

  std::ofstream(dir_ / "model.yaml") << "model: " << config.dump() << "\n";
  const io::SafetensorsFile flags =
      sample("--pretrained " + ShellQuote((pipeline / "unet").string()) + " --config " +
                 ShellQuote((dir_ / "model.yaml").string()) +
                 " --schedule scaled_linear --beta-start 0.00085 --beta-end 0.012 --prediction v "
                 "--text-encoder " +
                 ShellQuote((pipeline / "text_encoder").string()) + " --vae " +
                 ShellQuote((pipeline / "vae").string()),
             "flags");
  for (const char* tensor : {"images", "decoded"}) {
    SCOPED_TRACE(tensor);
    EXPECT_EQ(ReferenceTensor(alone, tensor), ReferenceTensor(flags, tensor));
  }

  // --input-size alone samples the folder's model at another size.
  const io::SafetensorsFile smaller =
      sample("--pretrained " + ShellQuote(pipeline.string()) + " --input-size 4", "smaller");
  EXPECT_EQ(nlohmann::json::parse(smaller.metadata().at("config"))["sample_size"], 4);
  EXPECT_EQ(ReferenceTensor(smaller, "images").size(), 2u * 4 * 4 * 4);

  // The scheduler's spacing (SD 2's: leading, steps_offset 1, set_alpha_to_one false) is
  // sampling's; a spacing flag keeps its other keys. Without flags: diffusers' defaults.
  EXPECT_EQ(how["timestep_spacing"],
            nlohmann::json::parse(
                R"({"kind": "leading", "steps_offset": 1, "set_alpha_to_one": false})"));
  EXPECT_EQ(how["cfg_scale"], 7.5);
  const io::SafetensorsFile trailing = sample(
      "--pretrained " + ShellQuote(pipeline.string()) + " --timestep-spacing trailing", "trailing");
  EXPECT_EQ(nlohmann::json::parse(trailing.metadata().at("sampling"))["timestep_spacing"],
            nlohmann::json::parse(
                R"({"kind": "trailing", "steps_offset": 1, "set_alpha_to_one": false})"));
  EXPECT_NE(ReferenceTensor(trailing, "images"), ReferenceTensor(alone, "images"));
  const std::string defaults_raw = (dir_ / "defaults.safetensors").string();
  r = RunCommand(fmt::format("{} sample --pretrained {} --prompt boat --per-class 1 --raw {} 2>&1",
                             ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline.string()),
                             ShellQuote(defaults_raw)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json defaults =
      nlohmann::json::parse(io::SafetensorsFile::Read(defaults_raw)->metadata().at("sampling"));
  EXPECT_EQ(defaults["sampler"], "ddim");
  EXPECT_EQ(defaults["steps"], 50);
  EXPECT_EQ(defaults["cfg_scale"], 7.5);

  // A UniPC scheduler on Karras σ's (its keys as save_pretrained writes them) is the pipeline's
  // sampler; with --sampler ddim the σ's go, as from_config drops a key DDIM does not take.
  const std::filesystem::path scheduler_json = pipeline / "scheduler" / "scheduler_config.json";
  nlohmann::json unipc = nlohmann::json::parse(std::ifstream(scheduler_json));
  unipc.update(nlohmann::json::parse(
      R"({"_class_name": "UniPCMultistepScheduler", "use_karras_sigmas": true,
          "solver_order": 2, "solver_type": "bh1", "predict_x0": true, "solver_p": null,
          "disable_corrector": [], "lower_order_final": true})"));
  std::ofstream(scheduler_json) << unipc.dump();
  const auto sampling_of = [&](const std::string& flags, const std::string& name) {
    const std::string raw = (dir_ / (name + ".safetensors")).string();
    const CommandResult s = RunCommand(fmt::format(
        "{} sample --pretrained {} --prompt boat --per-class 1 --steps 3 {} --raw {} 2>&1",
        ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline.string()), flags, ShellQuote(raw)));
    EXPECT_EQ(s.exit_code, 0) << s.output;
    return nlohmann::json::parse(io::SafetensorsFile::Read(raw)->metadata().at("sampling"));
  };
  const nlohmann::json unipc_how = sampling_of("", "unipc");
  EXPECT_EQ(unipc_how["sampler"], "unipc");
  EXPECT_EQ(unipc_how["timestep_spacing"]["karras_sigmas"], true);
  EXPECT_EQ(unipc_how["unipc"]["solver_type"], "bh1");
  const nlohmann::json ddim_how = sampling_of("--sampler ddim", "unipc_as_ddim");
  EXPECT_EQ(ddim_how["sampler"], "ddim");
  EXPECT_FALSE(ddim_how["timestep_spacing"].contains("karras_sigmas"));
  // Read by DPM-Solver as its from_config reads UniPC's keys: the order kept, bh1 → midpoint;
  // the solver flags over them.
  const nlohmann::json dpm_how = sampling_of("--sampler dpmsolver", "unipc_as_dpm");
  EXPECT_EQ(dpm_how["dpm_solver"]["solver_order"], 2);
  EXPECT_EQ(dpm_how["dpm_solver"]["solver_type"], "midpoint");
  const nlohmann::json flags_how = sampling_of("--solver-order 1 --solver-type bh2", "unipc_flags");
  EXPECT_EQ(flags_how["unipc"]["solver_order"], 1);
  EXPECT_EQ(flags_how["unipc"]["solver_type"], "bh2");

  // A scheduler rescaled to zero terminal SNR (a v model's) samples from ᾱ = 0 and says so.
  unipc.update(nlohmann::json::parse(
      R"({"_class_name": "DDIMScheduler", "prediction_type": "v_prediction",
          "rescale_betas_zero_snr": true, "timestep_spacing": "trailing"})"));
  std::ofstream(scheduler_json) << unipc.dump();
  const nlohmann::json zero_how = sampling_of("", "zero_snr");
  EXPECT_EQ(zero_how["diffusion"]["zero_terminal_snr"], true);
  EXPECT_EQ(zero_how["timestep_spacing"]["kind"], "trailing");

  // A DPMSolverSinglestepScheduler is the pipeline's sampler; its spacing is linspace whatever
  // timestep_spacing the config holds (the class has no such key), its options the config's.
  unipc.update(nlohmann::json::parse(
      R"({"_class_name": "DPMSolverSinglestepScheduler", "rescale_betas_zero_snr": false,
          "timestep_spacing": "leading", "solver_order": 3,
          "final_sigmas_type": "sigma_min"})"));
  std::ofstream(scheduler_json) << unipc.dump();
  const nlohmann::json single_how = sampling_of("", "singlestep");
  EXPECT_EQ(single_how["sampler"], "dpmsolver_singlestep");
  EXPECT_EQ(single_how["timestep_spacing"]["kind"], "linspace");
  EXPECT_EQ(single_how["dpm_solver"]["solver_order"], 3);
  EXPECT_EQ(single_how["dpm_solver"]["final_sigmas_type"], "sigma_min");
  EXPECT_EQ(single_how["dpm_solver"]["lower_order_final"], true);  // as the config above holds

  // What the folder says and difftrain does not implement is refused, naming the file.
  std::ofstream(pipeline / "scheduler" / "scheduler_config.json")
      << R"({"beta_schedule": "sigmoid"})";
  const CommandResult refused = RunCommand(fmt::format(
      "{} sample --pretrained {} --prompt x --raw {} 2>&1", ShellQuote(DIFFTRAIN_BINARY),
      ShellQuote(pipeline.string()), ShellQuote((dir_ / "refused.safetensors").string())));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("scheduler_config.json"));
  EXPECT_THAT(refused.output, ::testing::HasSubstr("beta_schedule: 'sigmoid' is not supported"));
}

// DoRA training (`--lora-use-dora`, random A, B and magnitudes): the adapters' gradients, the
// magnitudes' among them (the checker refuses a dump without them), against peft 0.10.0's own
// DoRA layers (tests/reference/peft_env.sh), whose norms are detached as the dump's are held
// constant. Attention projections (Linear) at alpha = rank; 3×3 and 1×1 convolutions and Linear
// layers at alpha 2·rank; SDXL's shape.
//
// Each tensor within 3e-4, all together within 1e-5. On SDXL's shape, seeds 7 to 10 put the
// worst tensor at 2.4e-4, 2.1e-5, 1.6e-4 and 2.9e-5 on an AVX2 EPYC (a LoRA's at 2.4e-5,
// 1.0e-5, 2.7e-5 and 1.3e-5), all together at most 4.6e-6; on an AVX-512 Xeon (OpenBLAS's
// other kernels) at 5.8e-4, 1.1e-5, 2.1e-4 and 1.7e-5, seeds 11 to 13 at 2.0e-5 to 2.3e-5,
// all together 1.2e-5 at seed 7 and at most 2.5e-6 at the others. At seed 7 the dump's
// adapters and magnitudes put through DoRA's formula in float64 from the reference's float64
// ∂W equal peft's gradients to 1e-12, and in float32 to 6e-8: the rest is the float32 rounding
// of the model's own ∂W, which some draws of these weights condition far worse than others
// (seeds 7 and 9). The SDXL case uses seed 8, 14× and more inside the bound on both machines;
// it was seed 7, which failed on the Xeon. A wrong factor m/n is off by 1e-2 or more.
using PeftReferenceTest = UNetReferenceOf<PeftEnv>;

class PeftReferenceCases : public PeftReferenceTest,
                           public ::testing::WithParamInterface<UNetCase> {};

TEST_P(PeftReferenceCases, DebugDumpMatchesPeft) {
  const std::string dump = Dump(GetParam());
  ASSERT_FALSE(dump.empty());
  const CommandResult checked =
      RunScript("check_unet_dump.py", ShellQuote(dump) + " --tol 3e-4 --tol-all 1e-5");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

INSTANTIATE_TEST_SUITE_P(
    TinyConfigs, PeftReferenceCases,
    ::testing::Values(
        UNetCase{"AttentionProjections", kSdLadder, "--lora-rank 2 --lora-use-dora", true, 3},
        UNetCase{"ConvolutionsAndAlpha", kSdLadder,
                 "--schedule scaled_linear --beta-start 0.00085 --beta-end 0.012 "
                 "--lora-rank 3 --lora-alpha 6 --lora-use-dora "
                 "--lora-targets proj_in,proj_out,conv1,ff.net.2,attn2.to_k",
                 true, 4},
        UNetCase{"Sdxl", kSdxlShape, "--lora-rank 2 --lora-use-dora", true, 8},
        // rsLoRA (peft's use_rslora: alpha / √rank), alone (scale 2 where a LoRA's is 1) and
        // with DoRA. (Its gradients at scale 4, alpha 8, are those of a plain LoRA at alpha 16
        // to the last bit, and both 3.6e-5 off all together: the model's float32 ∂W at a
        // larger update, not rsLoRA.)
        UNetCase{"RsLora", kSdLadder, "--lora-rank 4 --lora-alpha 4 --lora-use-rslora", true, 3},
        UNetCase{"DoraRsLora", kSdLadder,
                 "--lora-rank 4 --lora-use-dora --lora-use-rslora --lora-targets to_q,conv1", true,
                 5}),
    [](const ::testing::TestParamInfo<UNetCase>& info) { return std::string(info.param.name); });

// The check can fail: a DoRA dump whose magnitudes' gradients are 0.1% off fails them.
TEST_F(PeftReferenceTest, FailsADumpWithTheMagnitudesGradientOff) {
  UNetCase c = kCheckerCase;
  c.diffusion = "--lora-rank 2 --lora-use-dora";
  const std::string dump = Dump(c);
  ASSERT_FALSE(dump.empty());
  const std::string off = (dir_ / "off.safetensors").string();
  const std::string name =
      "grad.lora.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_magnitude_vector";
  const CommandResult perturbed = RunScript(
      "perturb_dump.py", ShellQuote(dump) + " " + ShellQuote(off) + " " + name + " 1.001");
  ASSERT_EQ(perturbed.exit_code, 0) << perturbed.output;
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(off));
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output, ::testing::HasSubstr(name + "  rel "));
  EXPECT_THAT(checked.output, ::testing::HasSubstr("FAIL"));
}

// An rsLoRA dump read as a plain LoRA's (its scale alpha / rank, not alpha / √rank) fails.
TEST_F(PeftReferenceTest, FailsAnRsLoraDumpReadAsAPlainLora) {
  UNetCase c = kCheckerCase;
  c.diffusion = "--lora-rank 4 --lora-alpha 4 --lora-use-rslora";
  const std::string dump = Dump(c);
  ASSERT_FALSE(dump.empty());
  const std::string off = (dir_ / "off.safetensors").string();
  const CommandResult perturbed =
      RunScript("perturb_dump.py", ShellQuote(dump) + " " + ShellQuote(off) + " --metadata lora " +
                                       ShellQuote(R"({"rank": 4, "alpha": 4.0, "targets": []})"));
  ASSERT_EQ(perturbed.exit_code, 0) << perturbed.output;
  const std::string bounds = " --tol 3e-4 --tol-all 1e-5";
  EXPECT_EQ(RunScript("check_unet_dump.py", ShellQuote(dump) + bounds).exit_code, 0);
  const CommandResult checked = RunScript("check_unet_dump.py", ShellQuote(off) + bounds);
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output, ::testing::ContainsRegex("grad\\.lora\\..*  rel [0-9.e+-]+  FAIL"));
}

// A DoRA run with rsLoRA's scale (three steps from a diffusers UNet, attention projections and
// 3×3 convolutions at rank 2, alpha 4: a scale 4/√2): `export --format lora` writes peft's
// names, alpha / √rank folded into B, which peft's
// set_peft_model_state_dict loads whole into its DoRA layers and whose merge is the run's
// checkpoint's fused weights; difftrain's own reader (FuseLora: `sample --lora`) fuses the file
// into the base to the same weights.
TEST_F(PeftReferenceTest, ARunsExportedFileIsWhatPeftMerges) {
  const std::string unet = (dir_ / "unet").string();
  const CommandResult made = RunScript("lora.py", "unet " + ShellQuote(unet) + " 5");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  nlohmann::json model = nlohmann::json::parse(std::ifstream(unet + "/config.json"));
  model["name"] = "unet";
  const std::string ckpt = (dir_ / "ckpt").string(), job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "model: " << model.dump() << "\n"
                     << "data: {kind: synthetic}\nbatch: {micro: 2, global: 2}\n"
                     << "optimizer: {lr: 0.01, ema_decay: 0}\ntrain: {steps: 3, log_every: 1}\n"
                     << "lora: {rank: 2, alpha: 4, use_dora: true, use_rslora: true, "
                        "targets: [to_q, to_v, conv1]}\n"
                     << "checkpoint: {dir: " << ckpt << ", every: 3, init_from: " << unet << "}\n";
  const CommandResult trained = RunCommand(
      fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string file = (dir_ / "dora.safetensors").string();
  const CommandResult exported = RunCommand(
      fmt::format("{} export --checkpoint {} --weights model --format lora --out {} 2>&1",
                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote(ckpt), ShellQuote(file)));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string merged_path = (dir_ / "merged.safetensors").string();
  const CommandResult merged_by_peft = RunScript(
      "dora.py", ShellQuote(unet) + " " + ShellQuote(file) + " " + ShellQuote(merged_path));
  ASSERT_EQ(merged_by_peft.exit_code, 0) << merged_by_peft.output;

  Result<io::SafetensorsFile> merged = io::SafetensorsFile::Read(merged_path);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  Result<io::SafetensorsFile> shard = io::CheckpointStore(ckpt, 1).ReadShard(3, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  Result<io::SafetensorsFile> base =
      io::SafetensorsFile::Read(unet + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(base.ok()) << base.status().message();
  TensorTable table;
  for (const std::string& name : base->Names())
    table.Add(name, base->Find(name)->shape);
  std::vector<float> fused(table.total());
  for (const TensorSpec& t : table.tensors())
    ASSERT_TRUE(base->CopyAsF32(t.name, t.shape, fused.data() + t.offset).ok()) << t.name;
  Result<io::LoraFused> read = io::FuseLora(file, 1.0, {{io::kLoraUNet, &table, fused.data()}});
  ASSERT_TRUE(read.ok()) << read.status().message();

  // Every module of the file: its A, B and magnitude.
  Result<io::SafetensorsFile> exported_file = io::SafetensorsFile::Read(file);
  ASSERT_TRUE(exported_file.ok());
  EXPECT_EQ(exported_file->Names().size(), 3 * merged->Names().size()) << merged_by_peft.output;
  EXPECT_EQ(read->modules, static_cast<int>(merged->Names().size()));
  EXPECT_NE(exported_file->Find("unet.down_blocks.0.resnets.0.conv1.lora_magnitude_vector"),
            nullptr);
  for (const std::string& name : merged->Names()) {
    const std::vector<float> peft = ReferenceTensor(*merged, name);
    const std::vector<float> run = ReferenceTensor(*shard, name);
    const std::vector<float> original = ReferenceTensor(*base, name);
    const TensorSpec* t = table.Find(name);
    ASSERT_NE(t, nullptr) << name;
    const std::vector<float> ours(fused.begin() + t->offset, fused.begin() + t->offset + t->numel);
    EXPECT_LT(RelativeL2(peft, run), 2e-6) << name << ": peft's merge against the run's weights";
    EXPECT_LT(RelativeL2(ours, run), 2e-6) << name << ": FuseLora against the run's weights";
    EXPECT_GT(RelativeL2(run, original), 1e-4) << name << " did not train";
  }
}

}  // namespace
}  // namespace difftrain::testing
