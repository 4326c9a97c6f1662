// The job is parsed and resolved once, where it is launched: `parallel: auto` is chosen for
// the cluster the launcher gives (flags over the file), and the job a rank receives parses to
// the same job with that layout written in, so no rank chooses one.
#include "job/job_spec.h"

#include <chrono>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/dit/family.h"
#include "model/io/safetensors.h"
#include "model/train/planner.h"

namespace difftrain {
namespace {

class JobSpecTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& yaml, const std::string& name = "job.yaml") {
    const std::string path = tmp_.path() + "/" + name;
    std::ofstream(path) << yaml;
    return path;
  }
  // The job `yaml` is refused with a message holding `why`.
  static void ExpectRefused(const std::string& yaml, const std::string& why) {
    Result<TrainConfig> r = TrainConfig::FromYamlText(yaml, "job.yaml");
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }

  TempDir tmp_{"job_spec"};
};

constexpr const char* kAutoJob =
    "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
    "        num_heads: 4, num_classes: 10}\n"
    "batch: {global: 8}\n"
    "parallel: auto\n"
    "cluster: {nodes: 1, devices_per_node: 1}\n";

TEST_F(JobSpecTest, ParsingLeavesParallelAutoForTheLauncher) {
  Result<TrainConfig> c = TrainConfig::FromYamlFile(Write(kAutoJob));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->parallel.automatic);
  EXPECT_FALSE(c->micro_batch_given);
  EXPECT_EQ(c->model.family, "dit");
}

// The defect of issue 18: the launchers pass --nodes, which `parallel: auto` refused.
TEST_F(JobSpecTest, ParallelAutoChoosesForTheLaunchersCluster) {
  const std::string path = Write(kAutoJob);
  Result<TrainConfig> one = LoadJob(path);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->parallel.tp * one->parallel.cp * one->parallel.pp * one->parallel.dp, 1);
  Result<TrainConfig> two = LoadJob(path, {.nodes = 2, .devices_per_node = 1});
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_EQ(two->cluster.nodes, 2);
  EXPECT_EQ(two->parallel.tp * two->parallel.cp * two->parallel.pp * two->parallel.dp, 2);
  EXPECT_TRUE(two->Validate(two->parallel.dp).ok());
}

TEST_F(JobSpecTest, RanksReceiveTheResolvedLayout) {
  const std::string path = Write(kAutoJob);
  std::string yaml;
  Result<TrainConfig> resolved = LoadJob(path, {.nodes = 2, .devices_per_node = 2}, &yaml);
  ASSERT_TRUE(resolved.ok()) << resolved.status().message();
  Result<std::string> shipped = ResolvedJobYaml(yaml, *resolved);
  ASSERT_TRUE(shipped.ok()) << shipped.status().message();
  Result<TrainConfig> rank = TrainConfig::FromYamlFile(Write(*shipped, "rank.yaml"));
  ASSERT_TRUE(rank.ok()) << rank.status().message() << "\n" << *shipped;
  EXPECT_FALSE(rank->parallel.automatic) << "a rank would choose a layout of its own";
  EXPECT_EQ(rank->parallel.tp, resolved->parallel.tp);
  EXPECT_EQ(rank->parallel.cp, resolved->parallel.cp);
  EXPECT_EQ(rank->parallel.pp, resolved->parallel.pp);
  EXPECT_EQ(rank->parallel.dp, resolved->parallel.dp);
  EXPECT_EQ(rank->parallel.zero1, resolved->parallel.zero1);
  EXPECT_EQ(rank->recompute, resolved->recompute);
  EXPECT_EQ(rank->micro_batch, resolved->micro_batch);
  EXPECT_EQ(rank->cluster.nodes, 2);
  EXPECT_EQ(rank->cluster.devices_per_node, 2);
  EXPECT_EQ(rank->model, resolved->model);
  // Everything else is the job as written.
  nlohmann::json a = rank->ToJson(), b = resolved->ToJson();
  a["parallel"].erase("auto");
  b["parallel"].erase("auto");
  EXPECT_EQ(a, b);
}

TEST_F(JobSpecTest, AnExplicitJobIsShippedAsWritten) {
  const std::string path = Write(
      "model: {name: DiT-S/8, input_size: 16, num_classes: 10}\n"
      "batch: {micro: 2, global: 8}\n"
      "parallel: {tp: 2, bucket_mb: 1.5, timeout_seconds: 9}\n"
      "cluster: {nodes: 2, devices_per_node: 2}\n"
      "checkpoint: {dir: /tmp/x, every: 3}\n");
  std::string yaml;
  Result<TrainConfig> job = LoadJob(path, {}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  Result<std::string> shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  Result<TrainConfig> rank = TrainConfig::FromYamlFile(Write(*shipped, "rank.yaml"));
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->ToJson(), job->ToJson());
}

// Under mpirun rank 0 sends the resolved job as text: it parses to the same job as the file
// the controller would have shipped, backend included.
TEST_F(JobSpecTest, AResolvedJobReceivedAsTextIsTheSameJob) {
  const std::string path = Write(
      "model: {name: DiT-S/8, input_size: 16, num_classes: 10}\n"
      "batch: {micro: 2, global: 8}\n"
      "parallel: {tp: 2, backend: mpi}\n");
  std::string yaml;
  Result<TrainConfig> job = LoadJob(path, {.nodes = 2, .devices_per_node = 2}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->parallel.backend, "mpi");
  Result<std::string> shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, path);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->ToJson(), job->ToJson());
  Result<TrainConfig> broken = TrainConfig::FromYamlText("model: [", "sent.yaml");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("sent.yaml:1:"), std::string::npos)
      << broken.status().message();
}

// train.device is auto unless the file says: the GPU where the device planned for has one
// (and this build has the CUDA backend), else the CPU; ranks receive the choice written in.
TEST_F(JobSpecTest, DeviceAutoIsTheGpuWhereThereIsOne) {
  const std::string job =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10}\n"
      "batch: {micro: 4, global: 8}\n";
  const PlanDevice cpu{"", 64.0 * (1 << 30)}, h200{"NVIDIA H200", 141.0 * (1 << 30)};
#ifdef DIFFTRAIN_HAVE_CUDA
  const std::string gpu_device = "cuda";
#else
  const std::string gpu_device = "cpu";  // no backend to run it: auto stays on the CPU
#endif
  Result<TrainConfig> parsed = TrainConfig::FromYamlText(job, "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->device, "auto");
  TrainConfig on_cpu = *parsed, on_gpu = *parsed;
  ASSERT_TRUE(ResolveJob(on_cpu, cpu).ok());
  EXPECT_EQ(on_cpu.device, "cpu");
  EXPECT_TRUE(on_cpu.device_automatic);
  ASSERT_TRUE(ResolveJob(on_gpu, h200).ok());
  EXPECT_EQ(on_gpu.device, gpu_device);
  // The controller resolves again for the worker daemons' device.
  ASSERT_TRUE(ResolveJob(on_gpu, cpu).ok());
  EXPECT_EQ(on_gpu.device, "cpu");
  ASSERT_TRUE(ResolveJob(on_gpu, h200).ok());
  Result<std::string> shipped = ResolvedJobYaml(job, on_gpu);
  ASSERT_TRUE(shipped.ok()) << shipped.status().message();
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, "rank.yaml");
  ASSERT_TRUE(rank.ok()) << rank.status().message() << "\n" << *shipped;
  EXPECT_EQ(rank->device, gpu_device);
  EXPECT_FALSE(rank->device_automatic);
  ASSERT_TRUE(ResolveJob(*rank, cpu).ok());
  EXPECT_EQ(rank->device, gpu_device) << "a rank chose a device of its own";

  // Written out, the device is kept whatever the machine.
  Result<TrainConfig> pinned =
      TrainConfig::FromYamlText(job + "train: {device: cpu}\n", "job.yaml");
  ASSERT_TRUE(pinned.ok()) << pinned.status().message();
  ASSERT_TRUE(ResolveJob(*pinned, h200).ok());
  EXPECT_EQ(pinned->device, "cpu");
  EXPECT_FALSE(pinned->device_automatic);
  Result<TrainConfig> typo = TrainConfig::FromYamlText(job + "train: {device: gpu}\n", "job.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("expected auto, cpu or cuda, found 'gpu'"),
            std::string::npos)
      << typo.status().message();
}

// train.precision: bf16 (the default) or fp8, which needs the GPU step and a family with FP8
// layers (DiT's and Latte's blocks); each refusal names the field and why, and ranks receive it
// written in.
TEST_F(JobSpecTest, PrecisionFp8NeedsTheGpuAndAFamilyWithFp8Layers) {
  const std::string job =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10}\n"
      "batch: {micro: 4, global: 8}\n";
  const PlanDevice cpu{"", 64.0 * (1 << 30)}, h200{"NVIDIA H200", 141.0 * (1 << 30)};
  Result<TrainConfig> plain = TrainConfig::FromYamlText(job, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->precision, "bf16");

  const std::string fp8_job = job + "train: {precision: fp8}\n";
  Result<TrainConfig> fp8 = TrainConfig::FromYamlText(fp8_job, "job.yaml");
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  EXPECT_EQ(fp8->precision, "fp8");
  TrainConfig on_cpu = *fp8;
  const Status no_gpu = ResolveJob(on_cpu, cpu);
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_NE(no_gpu.message().find("job.yaml:4:20: train.precision fp8 runs on train.device cuda"),
            std::string::npos)
      << no_gpu.message();
  EXPECT_NE(no_gpu.message().find("train.device auto found no GPU"), std::string::npos)
      << no_gpu.message();
#ifdef DIFFTRAIN_HAVE_CUDA
  TrainConfig on_gpu = *fp8;
  ASSERT_TRUE(ResolveJob(on_gpu, h200).ok());
  Result<std::string> shipped = ResolvedJobYaml(fp8_job, on_gpu);
  ASSERT_TRUE(shipped.ok()) << shipped.status().message();
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, "rank.yaml");
  ASSERT_TRUE(rank.ok()) << rank.status().message() << "\n" << *shipped;
  EXPECT_EQ(rank->device, "cuda");
  EXPECT_EQ(rank->precision, "fp8");
  EXPECT_EQ(rank->ToJson()["train"]["precision"], "fp8");
#endif
  Result<TrainConfig> pinned =
      TrainConfig::FromYamlText(job + "train: {device: cpu, precision: fp8}\n", "job.yaml");
  ASSERT_FALSE(pinned.ok());
  EXPECT_NE(pinned.status().message().find("this job trains on the cpu"), std::string::npos)
      << pinned.status().message();
  Result<TrainConfig> typo =
      TrainConfig::FromYamlText(job + "train: {precision: fp16}\n", "job.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("train.precision: expected bf16 or fp8, found 'fp16'"),
            std::string::npos)
      << typo.status().message();

  // The UNet's GPU step has no FP8 layers.
  std::ifstream file(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/unet-fashion.yaml");
  std::string unet((std::istreambuf_iterator<char>(file)), {});
  const std::string device = "  device: cpu";
  ASSERT_NE(unet.find(device), std::string::npos);
  unet.replace(unet.find(device), device.size(), "  device: cuda\n  precision: fp8");
  Result<TrainConfig> unet_fp8 = TrainConfig::FromYamlText(unet, "unet.yaml");
  ASSERT_FALSE(unet_fp8.ok());
  EXPECT_NE(unet_fp8.status().message().find(
                "train.precision fp8: the unet family has no FP8 layers (DiT and Latte do)"),
            std::string::npos)
      << unet_fp8.status().message();
}

// On a GPU, auto means the GPU step, which trains data-parallel layouts only: a fixed tp is
// refused naming train.device (rather than trained on the CPU unannounced), and `parallel:
// auto` plans without tp, cp, pp, ZeRO-1 and recompute.
TEST_F(JobSpecTest, DeviceAutoOnAGpuKeepsToDataParallelLayouts) {
#ifndef DIFFTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend: auto never chooses the GPU";
#else
  const PlanDevice h200{"NVIDIA H200", 141.0 * (1 << 30)};
  Result<TrainConfig> tp = TrainConfig::FromYamlText(
      "model: {name: DiT-S/8, input_size: 16, num_classes: 10}\n"
      "batch: {micro: 2, global: 8}\n"
      "parallel: {tp: 2}\n"
      "cluster: {nodes: 1, devices_per_node: 2}\n",
      "job.yaml");
  ASSERT_TRUE(tp.ok()) << tp.status().message();
  const Status refused = ResolveJob(*tp, h200);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("train.device cuda trains data-parallel layouts only; "
                                   "parallel.tp > 1 runs on the CPU"),
            std::string::npos)
      << refused.message();

  Result<TrainConfig> automatic = TrainConfig::FromYamlText(
      "model: {name: DiT-XL/2, input_size: 32, num_classes: 1000}\n"
      "batch: {global: 2048}\n"
      "parallel: auto\n"
      "cluster: {nodes: 2, devices_per_node: 8}\n",
      "job.yaml");
  ASSERT_TRUE(automatic.ok()) << automatic.status().message();
  const Status resolved = ResolveJob(*automatic, h200);
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(automatic->device, "cuda");
  EXPECT_EQ(automatic->parallel.dp, 16);
  EXPECT_FALSE(automatic->parallel.zero1);
  EXPECT_FALSE(automatic->recompute);
#endif
}

// checkpoint.init_from is checked against the model where the launcher can read it, and the
// error points at the field in the file; a path the launcher cannot see is left to the ranks.
TEST_F(JobSpecTest, InitFromIsCheckedAgainstTheModelWhereTheLauncherCanReadIt) {
  const std::string job =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10}\n"
      "checkpoint: {init_from: INIT}\n";
  const auto with = [&](const std::string& init) {
    std::string text = job;
    text.replace(text.find("INIT"), 4, init);
    return Write(text);
  };
  // The weights of that model, and of one with a block fewer.
  Result<TrainConfig> parsed = TrainConfig::FromYamlFile(with("x"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->checkpoint.init_from, "x");
  EXPECT_EQ(parsed->ToJson()["checkpoint"]["init_from"], "x");
  const auto weights = [&](const ModelSpec& spec, const std::string& name) {
    std::unique_ptr<Model> model = *FamilyOf(spec).Create(spec);
    io::SafetensorsWriter w;
    for (const TensorSpec& t : model->global_parameter_table().tensors())
      w.AddF32(t.name, t.shape, model->params() + t.offset);
    const std::string path = tmp_.path() + "/" + name;
    EXPECT_TRUE(w.WriteAtomic(path).ok());
    return path;
  };
  const std::string same = weights(parsed->model, "same.safetensors");
  ModelSpec shallower = parsed->model;
  shallower.config["depth"] = 1;
  const std::string other = weights(shallower, "shallower.safetensors");

  Result<TrainConfig> good = LoadJob(with(same));
  EXPECT_TRUE(good.ok()) << good.status().message();
  Result<TrainConfig> elsewhere = LoadJob(with("/nonexistent/weights.safetensors"));
  EXPECT_TRUE(elsewhere.ok()) << elsewhere.status().message();
  Result<TrainConfig> bad = LoadJob(with(other));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().substr(0, bad.status().message().find(" '")),
            tmp_.path() + "/job.yaml:3:25: checkpoint.init_from:");
  EXPECT_NE(bad.status().message().find("10 of the model's 31 tensors do not match (21 found in "
                                        "the file): 'blocks.1.attn.qkv.weight' missing"),
            std::string::npos)
      << bad.status().message();
}

TEST_F(JobSpecTest, TheBackendIsGlooOrMpi) {
  Result<TrainConfig> c = TrainConfig::FromYamlFile(
      Write("model: {name: DiT-S/8, input_size: 16}\nparallel: {backend: nccl}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("parallel.backend: expected gloo or mpi, found 'nccl'"),
            std::string::npos)
      << c.status().message();
}

// An image folder is packed, not trained on: the refusal says how to use it.
TEST_F(JobSpecTest, AnImageFolderIsPackedFirst) {
  Result<TrainConfig> c = TrainConfig::FromYamlFile(
      Write("model: {name: DiT-S/8, input_size: 16}\ndata: {kind: image_folder, path: /x}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("data.kind: image_folder is read by `difftrain data pack`"),
            std::string::npos)
      << c.status().message();
}

// The fine-tuning example (docs/finetuning.md) is a valid job: SD 1.5 from a pipeline's UNet.
TEST_F(JobSpecTest, TheFineTuningExampleIsValid) {
  Result<TrainConfig> c =
      TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/sd15-finetune.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.name(), "SD1.5");
  EXPECT_EQ(c->checkpoint.init_from, "stable-diffusion-v1-5/unet");
  // And its LoRA version: adapters of every attention projection of SD 1.5's UNet.
  c = TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/sd15-lora.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->lora.rank, 4);
  const Result<ModelPartition> whole = FamilyOf(c->model).Partition(c->model, {}, 0, 0, 0);
  ASSERT_TRUE(whole.ok());
  Result<std::vector<LoraModule>> modules = LoraModulesOf(c->lora, whole->parameters.table);
  ASSERT_TRUE(modules.ok());
  EXPECT_EQ(modules->size(), 16u * 2 * 4);  // 16 transformer blocks, 2 attentions, q k v out
  // SDXL's: 70 transformer blocks (2·1 + 2·10 down, 10 mid, 3·10 + 3·2 up).
  c = TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/sdxl-lora.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.name(), "SDXL");
  const Result<ModelPartition> xl = FamilyOf(c->model).Partition(c->model, {}, 0, 0, 0);
  ASSERT_TRUE(xl.ok());
  modules = LoraModulesOf(c->lora, xl->parameters.table);
  ASSERT_TRUE(modules.ok());
  EXPECT_EQ(modules->size(), 70u * 2 * 4);
  // DreamBooth's: a LoRA of SD 1.5 with the class's samples as the prior, one of each a forward.
  c = TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/sd15-dreambooth.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data.prior_path, "dog-class-latents");
  EXPECT_EQ(c->micro_batch, 2);
  EXPECT_EQ(c->lora.rank, 4);
  EXPECT_FALSE(c->lora.train_text_encoder);
  // And with the text encoder adapted too.
  c = TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) +
                                "/jobs/sd15-dreambooth-text-encoder.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->lora.train_text_encoder);
  EXPECT_EQ(c->lora.text_encoder_targets,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "out_proj"}));
  EXPECT_EQ(c->lora.text_encoder, "");
  EXPECT_EQ(c->ToJson()["lora"]["train_text_encoder"], true);
  // Textual inversion's: a token for SD 1.5's text encoder, the lr scaled by the step's samples.
  c = TrainConfig::FromYamlFile(std::string(DIFFTRAIN_SOURCE_DIR) +
                                "/jobs/sd15-textual-inversion.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->textual_inversion.token, "<cat-toy>");
  EXPECT_EQ(c->textual_inversion.templates.size(), 8u);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 0.002);
}

// An inpainting UNet (more input channels than it samples) samples only: its job is refused.
TEST_F(JobSpecTest, AnInpaintingUNetIsNotTrained) {
  std::ifstream file(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/unet-fashion.yaml");
  std::string unet((std::istreambuf_iterator<char>(file)), {});
  ASSERT_NE(unet.find("  in_channels: 1\n"), std::string::npos);
  ASSERT_TRUE(TrainConfig::FromYamlText(unet, "unet.yaml").ok());
  unet.replace(unet.find("  in_channels: 1\n"), 16, "  in_channels: 3\n");
  Result<TrainConfig> c = TrainConfig::FromYamlText(unet, "unet.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("takes 2 conditioning channels besides the 1 it samples"),
            std::string::npos)
      << c.status().message();
}

// Nor is a non-square one (diffusers' sample_size [height, width]), which samples only.
TEST_F(JobSpecTest, ANonSquareUNetIsNotTrained) {
  std::ifstream file(std::string(DIFFTRAIN_SOURCE_DIR) + "/jobs/unet-fashion.yaml");
  std::string unet((std::istreambuf_iterator<char>(file)), {});
  const std::string side = "  sample_size: 32\n";
  ASSERT_NE(unet.find(side), std::string::npos);
  unet.replace(unet.find(side), side.size(), "  sample_size: [32, 16]\n");
  Result<TrainConfig> c = TrainConfig::FromYamlText(unet, "unet.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(
      c.status().message().find("samples are 32x16 (height x width): difftrain trains square"),
      std::string::npos)
      << c.status().message();
}

// textual_inversion: read and shipped; refused, by name, for the models and layouts it does not
// train (a model without text, SDXL's pair of encoders, LoRA, a prior, split layouts, the GPU).
TEST_F(JobSpecTest, TextualInversionIsReadAndRefusedWhereItDoesNotTrain) {
  const std::string sd =
      "model: {name: SD1.5, text_dropout: 0}\n"
      "data: {kind: latent_folder, path: cat-latents}\n"
      "train: {device: cpu}\n"
      "textual_inversion: {token: '<cat-toy>', initializer_token: toy, vectors: 3,\n"
      "                    templates: ['a photo of a {}', 'a rendering of a {}']}\n";
  Result<TrainConfig> c = TrainConfig::FromYamlText(sd, "ti.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->textual_inversion.token, "<cat-toy>");
  EXPECT_EQ(c->textual_inversion.vectors, 3);
  EXPECT_EQ(c->textual_inversion.templates.size(), 2u);
  EXPECT_EQ(c->ToJson()["textual_inversion"]["initializer_token"], "toy");
  // A job without the section ships none.
  Result<TrainConfig> plain =
      TrainConfig::FromYamlText("model: {name: SD1.5}\ntrain: {device: cpu}\n", "plain.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->ToJson().contains("textual_inversion"));
  const auto refused = ExpectRefused;
  refused(sd + "lora: {rank: 4}\n", "without lora or a prior; not with lora");
  refused(sd + "parallel: {tp: 2}\n", "not with parallel.tp > 1");
  refused(sd + "parallel: {dp: 2, zero1: true}\n", "not with parallel.zero1");
  refused(std::string(sd).replace(sd.find("device: cpu"), 11, "device: cuda"),
          "not with train.device cuda");
  refused(std::string(sd).replace(sd.find("cat-latents}"), 12,
                                  "cat-latents, prior_path: cats}\nbatch: {micro: 2}"),
          "not with data.prior_path");
  refused(std::string(sd).replace(sd.find("SD1.5"), 5, "SDXL"), "SDXL's");
  refused(std::string(kAutoJob).replace(std::string(kAutoJob).find("parallel: auto\n"), 15, "") +
              "textual_inversion: {token: x, initializer_token: y}\n",
          "takes no text");
  refused(std::string(sd).replace(sd.find("{}', 'a rendering"), 2, ""), "should hold \"{}\" once");
  refused(std::string(sd).replace(sd.find("'<cat-toy>'"), 11, "'cat toy'"), "holds white space");
  refused(std::string(sd).replace(sd.find("vectors: 3"), 10, "vectors: 0"),
          "textual_inversion.vectors: expected a count >= 1");
  refused(std::string(sd).replace(sd.find("initializer_token: toy, "), 24, ""),
          "textual_inversion.initializer_token: required");
  refused("model: {name: SD1.5}\ntextual_inversion: {vectors: 2}\n",
          "textual_inversion.token: required");
  std::string automatic = std::string(sd).replace(sd.find("train: {device: cpu}"), 20,
                                                  "parallel: auto\nbatch: {micro: 1}");
  Result<TrainConfig> unresolved = TrainConfig::FromYamlText(automatic, "ti.yaml");
  ASSERT_TRUE(unresolved.ok()) << unresolved.status().message();
  const Status resolved = ResolveJob(*unresolved, PlanDevice{});
  ASSERT_FALSE(resolved.ok());
  EXPECT_NE(resolved.message().find("a textual_inversion job names its layout"), std::string::npos)
      << resolved.message();
}

// lora.train_text_encoder: read and shipped (a plain LoRA's section ships as it did); refused,
// by name, for the models it does not adapt (no text, SDXL's pair of encoders), context
// parallelism, and its settings without it.
TEST_F(JobSpecTest, TrainTextEncoderIsReadAndRefusedWhereItDoesNotTrain) {
  const std::string sd =
      "model: {name: SD1.5, text_dropout: 0}\n"
      "data: {kind: latent_folder, path: dog-latents}\n"
      "train: {device: cpu}\n"
      "lora: {rank: 4, train_text_encoder: true, text_encoder: sd15, "
      "text_encoder_targets: [q_proj, v_proj]}\n";
  Result<TrainConfig> c = TrainConfig::FromYamlText(sd, "te.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->lora.text_encoder, "sd15");
  EXPECT_EQ(c->lora.text_encoder_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  const nlohmann::json shipped = c->ToJson()["lora"];
  EXPECT_EQ(shipped["text_encoder"], "sd15");
  Result<LoraConfig> back = LoraConfig::FromJson(shipped);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), shipped);
  Result<TrainConfig> plain = TrainConfig::FromYamlText(
      "model: {name: SD1.5}\ntrain: {device: cpu}\nlora: {rank: 4}\n", "plain.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->ToJson()["lora"].contains("train_text_encoder"));
  const auto refused = ExpectRefused;
  refused(std::string(sd).replace(sd.find("SD1.5"), 5, "SDXL"), "SDXL's, whose two text encoders");
  refused(
      "model: {name: DiT-S/2}\ntrain: {device: cpu}\n"
      "lora: {rank: 4, targets: [qkv], train_text_encoder: true}\n",
      "takes no text");
  refused(sd + "parallel: {cp: 2}\n", "not with parallel.cp > 1");
  refused(
      std::string(sd).replace(sd.find("train_text_encoder: true"), 24, "train_text_encoder: false"),
      "lora.text_encoder: 'sd15' is given but lora.train_text_encoder is not set");
  refused(std::string(sd).replace(sd.find("[q_proj, v_proj]"), 16, "[]"),
          "lora.text_encoder_targets: name at least one module");
  refused("model: {name: SD1.5}\nlora: {rank: 0, train_text_encoder: true}\n",
          "the text encoder's adapters need lora.rank");
}

TEST_F(JobSpecTest, AnUnknownModelNamesTheFamiliesConfigs) {
  Result<TrainConfig> c = TrainConfig::FromYamlFile(Write("model: {name: DiT-M/3}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("job.yaml:1:15: model.name: unknown model 'DiT-M/3'"),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("DiT-XL/2"), std::string::npos);
}

// Frame-correlated noise is a video prior: a video model takes it (and ships it to its ranks),
// an image model's job is refused, naming the key.
TEST_F(JobSpecTest, FrameNoiseCorrelationIsForVideoModels) {
  Result<TrainConfig> video = TrainConfig::FromYamlFile(
      Write("model: {name: latte, input_size: 8, in_channels: 1, num_frames: 4, patch_size: 4,\n"
            "        hidden_size: 32, depth: 2, num_heads: 2, num_classes: 10}\n"
            "diffusion: {frame_noise_correlation: 0.5}\n"));
  ASSERT_TRUE(video.ok()) << video.status().message();
  EXPECT_EQ(video->diffusion.frame_noise_correlation, 0.5);
  Result<DiffusionConfig> shipped = DiffusionConfig::FromJson(video->diffusion.ToJson());
  ASSERT_TRUE(shipped.ok());
  EXPECT_EQ(shipped->frame_noise_correlation, 0.5);

  Result<TrainConfig> image = TrainConfig::FromYamlFile(
      Write(std::string(kAutoJob) + "diffusion: {frame_noise_correlation: 0.5}\n"));
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("diffusion.frame_noise_correlation"), std::string::npos)
      << image.status().message();
  EXPECT_NE(image.status().message().find("not videos"), std::string::npos);
}

// diffusers' learning-rate and EMA schedules and their parameters reach the ranks as written.
TEST_F(JobSpecTest, DiffusersSchedulesAreReadAndShipped) {
  const std::string path = Write(
      "model: {name: DiT-S/8, input_size: 16, num_classes: 10}\n"
      "optimizer: {lr_schedule: diffusers_cosine_with_restarts, lr_num_cycles: 3,\n"
      "            warmup_steps: 5, ema_schedule: diffusers_warmup, ema_inv_gamma: 2,\n"
      "            ema_power: 0.75}\n");
  std::string yaml;
  Result<TrainConfig> job = LoadJob(path, {}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->optimizer.lr_num_cycles, 3);
  EXPECT_EQ(job->optimizer.ema_inv_gamma, 2.0);
  const nlohmann::json written = job->ToJson()["optimizer"];
  EXPECT_EQ(written["lr_num_cycles"], 3);
  EXPECT_EQ(written["ema_power"], 0.75);
  EXPECT_FALSE(written.contains("lr_power"));  // only the schedule's own parameters
  Result<std::string> shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, path);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->ToJson(), job->ToJson());

  Result<TrainConfig> bad = TrainConfig::FromYamlFile(
      Write("optimizer: {lr_schedule: diffusers_cosine_with_restarts, lr_num_cycles: 0}\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optimizer.lr_num_cycles must be >= 1, got 0"),
            std::string::npos)
      << bad.status().message();
}

// train.epochs (diffusers' --num_train_epochs) is resolved where the job is launched, from the
// data if it can be read there, and the ranks receive the steps; data not readable there (on the
// compute nodes only) ships the epochs for each rank to resolve. Both fields, or no epoch, are
// refused at the field.
TEST_F(JobSpecTest, EpochsAreResolvedToStepsWhereTheDataCanBeRead) {
  const std::string model =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10, learn_sigma: false}\n"
      "batch: {micro: 4, global: 8}\n";
  const std::string path =
      Write(model + "data: {kind: synthetic, max_samples: 20}\ntrain: {epochs: 3}\n");
  std::string yaml;
  Result<TrainConfig> job = LoadJob(path, {}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->epochs, 3);
  EXPECT_EQ(job->epoch_samples, 20);
  EXPECT_EQ(job->steps, 8);  // 60 samples in steps of 8
  Result<std::string> shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  EXPECT_NE(shipped->find("# train.epochs: 3, resolved by the controller: 20 samples an epoch, "
                          "8 steps"),
            std::string::npos)
      << *shipped;
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, path);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->steps, 8);
  EXPECT_EQ(rank->epochs, 0);

  const std::string elsewhere = Write(
      model + "data: {kind: latent_folder, path: /nonexistent/latents}\ntrain: {epochs: 3}\n");
  job = LoadJob(elsewhere, {}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->steps, 0);
  shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  rank = TrainConfig::FromYamlText(*shipped, elsewhere);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->epochs, 3);
  EXPECT_EQ(rank->steps, 0);

  ExpectRefused("train: {steps: 10, epochs: 2}\n",
                "job.yaml:1:28: train.epochs: give train.steps or train.epochs, not both");
  ExpectRefused("train: {epochs: 0}\n",
                "train.epochs: expected a positive number of epochs, found 0");
  // Readable data that has no epochs is refused where the job is launched.
  Result<TrainConfig> endless =
      LoadJob(Write(model + "data: {kind: synthetic}\ntrain: {epochs: 3}\n"));
  ASSERT_FALSE(endless.ok());
  EXPECT_NE(endless.status().message().find("job.yaml:5:17: train.epochs: data.kind synthetic"),
            std::string::npos)
      << endless.status().message();
}

// optimizer.scale_lr is diffusers' --scale_lr: the rate times the samples of a step, not
// counting a prior's half; the ranks, parsing the same file, scale it the same once.
TEST_F(JobSpecTest, ScaleLrMultipliesByTheStepsSamplesOnce) {
  const std::string model =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10, learn_sigma: false}\n"
      "batch: {micro: 2, global: 8}\n"
      "optimizer: {lr: 1.0e-6, scale_lr: true}\n";
  const std::string path = Write(model);
  std::string yaml;
  Result<TrainConfig> job = LoadJob(path, {}, &yaml);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_DOUBLE_EQ(job->optimizer.lr, 8e-6);
  EXPECT_FALSE(job->ToJson()["optimizer"].contains("scale_lr"));
  Result<std::string> shipped = ResolvedJobYaml(yaml, *job);
  ASSERT_TRUE(shipped.ok());
  Result<TrainConfig> rank = TrainConfig::FromYamlText(*shipped, path);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  EXPECT_EQ(rank->optimizer.lr, job->optimizer.lr);

  Result<TrainConfig> prior =
      TrainConfig::FromYamlFile(Write(model + "data: {prior_path: class-latents}\n"));
  ASSERT_TRUE(prior.ok()) << prior.status().message();
  EXPECT_DOUBLE_EQ(prior->optimizer.lr, 4e-6);  // 4 subject samples a step, 4 of the class
}

// diffusers' training options: the noise offset and input perturbation, and DreamBooth's prior
// (recorded in the job's JSON only where set).
TEST_F(JobSpecTest, NoiseExtrasAndPriorPreservationAreRead) {
  Result<TrainConfig> c = TrainConfig::FromYamlFile(
      Write("model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
            "        num_heads: 4, num_classes: 10, learn_sigma: false}\n"
            "batch: {micro: 2, global: 4}\n"
            "data: {prior_path: class-latents, prior_loss_weight: 0.5}\n"
            "diffusion: {noise_offset: 0.05, input_perturbation: 0.1}\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data.prior_path, "class-latents");
  EXPECT_EQ(c->data.prior_loss_weight, 0.5);
  EXPECT_EQ(c->diffusion.noise_offset, 0.05);
  EXPECT_EQ(c->diffusion.input_perturbation, 0.1);
  EXPECT_EQ(c->ToJson()["data"]["prior_path"], "class-latents");
  EXPECT_EQ(c->ToJson()["diffusion"]["input_perturbation"], 0.1);
  EXPECT_FALSE(TrainConfig{}.ToJson()["data"].contains("prior_path"));

  Result<TrainConfig> odd = TrainConfig::FromYamlFile(
      Write("model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
            "        num_heads: 4, num_classes: 10, learn_sigma: false}\n"
            "batch: {micro: 3, global: 6}\n"
            "data: {prior_path: class-latents}\n"));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("expected an even number, found 3"), std::string::npos)
      << odd.status().message();

  // parallel: auto would choose any micro-batch: with a prior the job gives it.
  Result<TrainConfig> automatic = TrainConfig::FromYamlFile(
      Write(std::string(kAutoJob) + "data: {prior_path: class-latents}\n"
                                    "diffusion: {learn_sigma_loss: false}\n"));
  ASSERT_TRUE(automatic.ok()) << automatic.status().message();
  const Status resolved = ResolveJob(*automatic, PlanDevice{});
  EXPECT_NE(resolved.message().find("parallel: auto with data.prior_path needs batch.micro"),
            std::string::npos)
      << resolved.message();
}

// Zero terminal SNR is read, shipped to the ranks, and refused without v-prediction, naming the
// key.
TEST_F(JobSpecTest, ZeroTerminalSnrNeedsVPrediction) {
  constexpr const char* kJob =
      "model: {name: custom, input_size: 8, patch_size: 2, hidden_size: 32, depth: 2,\n"
      "        num_heads: 4, num_classes: 10}\n"
      "batch: {global: 8}\n";
  Result<TrainConfig> v = TrainConfig::FromYamlFile(
      Write(std::string(kJob) +
            "diffusion: {learn_sigma_loss: false, prediction: v, zero_terminal_snr: true}\n"));
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_TRUE(v->diffusion.zero_terminal_snr);
  Result<DiffusionConfig> shipped = DiffusionConfig::FromJson(v->diffusion.ToJson());
  ASSERT_TRUE(shipped.ok());
  EXPECT_TRUE(shipped->zero_terminal_snr);

  Result<TrainConfig> eps = TrainConfig::FromYamlFile(
      Write(std::string(kJob) + "diffusion: {zero_terminal_snr: true}\n"));
  ASSERT_FALSE(eps.ok());
  EXPECT_NE(eps.status().message().find("diffusion.zero_terminal_snr needs prediction v"),
            std::string::npos)
      << eps.status().message();
}

// The fuzzer's entry point: the text of a job file parses as the file does, and its errors name
// the source given with the line and column.
TEST_F(JobSpecTest, TextParsesAsTheFileAndErrorsNameTheSource) {
  Result<TrainConfig> file = TrainConfig::FromYamlFile(Write(kAutoJob));
  Result<TrainConfig> text = TrainConfig::FromYamlText(kAutoJob, "inline.yaml");
  ASSERT_TRUE(file.ok() && text.ok()) << text.status().message();
  EXPECT_EQ(text->ToJson(), file->ToJson());
  Result<TrainConfig> bad =
      TrainConfig::FromYamlText("model: {name: DiT-S/2}\nbatch: {micro: x}\n", "inline.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().message().starts_with("inline.yaml:2:16: batch.micro"))
      << bad.status().message();
  Result<TrainConfig> invalid = TrainConfig::FromYamlText("model: [\n", "inline.yaml");
  ASSERT_FALSE(invalid.ok());
  EXPECT_TRUE(invalid.status().message().starts_with("inline.yaml:2:1: invalid YAML"))
      << invalid.status().message();
  Result<TrainConfig> missing = TrainConfig::FromYamlFile(tmp_.path() + "/none.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

// Inputs that crashed or hung the job-spec fuzz target, kept as its seeds in
// tests/fuzz/job_spec_fuzz: each is refused or resolved at once, as a launcher resolves it.
TEST_F(JobSpecTest, InputsThatBrokeTheFuzzTargetAreRefusedOrResolvedAtOnce) {
  const std::string seeds = std::string(DIFFTRAIN_SOURCE_DIR) + "/tests/fuzz/job_spec_fuzz/";
  // An MLP width of 1e300 x 4 and 50,000² tokens overflowed an int.
  for (const auto& [seed, expected] :
       {std::pair{"mlp_ratio_overflow.yaml", "the MLP width hidden_size x mlp_ratio = 4e+300"},
        {"tokens_overflow.yaml", "the tokens (input_size / patch_size)^2 = 2500000000"}}) {
    Result<TrainConfig> c = TrainConfig::FromYamlFile(seeds + seed);
    ASSERT_FALSE(c.ok()) << seed;
    EXPECT_NE(c.status().message().find(expected), std::string::npos) << c.status().message();
  }
  // A global batch of 2e9 took the planner 40 s (every number up to it tried as a micro-batch).
  Result<TrainConfig> huge = TrainConfig::FromYamlFile(seeds + "planner_huge_batch.yaml");
  ASSERT_TRUE(huge.ok()) << huge.status().message();
  const auto start = std::chrono::steady_clock::now();
  const Status resolved = ResolveJob(*huge, PlanDevice{"", 64.0 * (1 << 30)});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(huge->global_batch % huge->micro_batch, 0);
}

}  // namespace
}  // namespace difftrain
