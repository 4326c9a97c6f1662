// Textual inversion (model/train/textual_inversion.h) against diffusers 0.27.2's
// textual_inversion.py (tests/reference/textual_inversion.py), on a small Stable Diffusion
// pipeline (tests/testing/sd_pipeline.h): captioned pictures packed through its VAE and text
// encoder, then
//   - one training step: the texts' token ids are the script's, and the loss, the new tokens'
//     gradient and their AdamW update are its own in float64 (the gradient through the UNet's
//     cross-attention and the CLIP text model);
//   - a run: two data-parallel ranks train what one process trains, a run resumed from a
//     checkpoint ends bit for bit where an unbroken one does, `export --format
//     textual-inversion` writes the script's learned_embeds file, which diffusers'
//     load_textual_inversion takes and `sample --textual-inversion` samples with;
//   - and the jobs it refuses, by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "controller/plan.h"
#include "job/job_spec.h"
#include "model/data/text_table.h"
#include "model/io/checkpoint.h"
#include "model/io/safetensors.h"
#include "model/train/trainer.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/sd_pipeline.h"
#include "tests/testing/text_step.h"

namespace difftrain::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kInversion[] =
    "textual_inversion: {token: '<cat-toy>', initializer_token: toy, vectors: 2}\n"
    "optimizer: {lr: 0.002, warmup_steps: 0, weight_decay: 0.01, ema_decay: 0}\n";

class TextualInversionTest : public SdPipelineReferenceTest {
 protected:
  // The pipeline and its pictures, packed, with a job of `steps` steps checkpointing each step.
  void SetUpRun(int steps) {
    const std::string text_python = TextPython();
    if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment";
    pipeline_ = MakePipeline(text_python);
    ASSERT_FALSE(pipeline_.empty());
    WriteCaptionedPictures(dir_ / "pictures", {{16, 16}, {20, 16}, {16, 24}, {16, 16}},
                           {"a photo of <cat-toy>", "<cat-toy> on a table", "a photo of <cat-toy>",
                            "a small <cat-toy>"});
    packed_ = (dir_ / "packed").string();
    PackCaptionedPictures((dir_ / "pictures").string(), pipeline_, packed_);
    job_ = WriteJob("job", steps, kInversion);
  }

  // A job of `steps` steps with `extra` sections and the batch section `batch`, checkpointing
  // every step into NAME-ckpt.
  std::string WriteJob(const std::string& name, int steps, const std::string& extra,
                       const std::string& batch = "batch: {micro: 2, global: 2}") {
    const std::string job = (dir_ / (name + ".yaml")).string();
    WriteFineTuneJob(job, pipeline_, packed_, (dir_ / (name + "-ckpt")).string(), steps, 1, extra,
                     batch);
    return job;
  }

  // The vectors of the newest checkpoint of `ckpt`.
  static std::vector<float> Vectors(const std::string& ckpt) {
    const io::SafetensorsFile shard = NewestShard0(ckpt);
    return ReferenceTensor(shard, std::string(kInversionVectors));
  }

  std::string pipeline_, packed_, job_;
};

TEST_F(TextualInversionTest, StepIsDiffusersTextualInversion) {
  SetUpRun(1);
  if (IsSkipped()) return;
  // The trainer of the job, in process.
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job_);
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  Result<io::SafetensorsFile> unet =
      io::SafetensorsFile::Map(pipeline_ + "/unet/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(unet.ok());
  ASSERT_TRUE((*trainer)->InitializeFrom(*unet).ok());
  const TextualInversion* inversion = (*trainer)->textual_inversion();
  ASSERT_NE(inversion, nullptr);
  ASSERT_EQ(inversion->size(), 2u * 32);
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 2, batch).ok());
  const StepStats stats = (*trainer)->StepOn(batch);

  io::SafetensorsWriter step;
  const std::vector<float> ids = AddTextStep(batch, config->optimizer, step);
  Result<TextTable> table = ReadTextTable(packed_ + "/text.safetensors");
  ASSERT_TRUE(table.ok());
  step.SetMetadata("token", "<cat-toy>");
  step.SetMetadata("initializer_token", "toy");
  step.SetMetadata("vectors", "2");
  step.SetMetadata("captions", nlohmann::json(table->captions).dump());
  const std::string step_path = (dir_ / "step.safetensors").string();
  ASSERT_TRUE(step.WriteAtomic(step_path).ok());
  const std::string out = (dir_ / "expected.safetensors").string();
  const CommandResult ran = RunScript(
      "textual_inversion.py",
      fmt::format("step {} {} {}", ShellQuote(pipeline_), ShellQuote(step_path), ShellQuote(out)));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  Result<io::SafetensorsFile> expected = io::SafetensorsFile::Read(out);
  ASSERT_TRUE(expected.ok());
  const std::vector<float> grad(inversion->grads(), inversion->grads() + inversion->size());
  const std::vector<float> updated(inversion->params(), inversion->params() + inversion->size());
  const double loss = ReferenceTensor(*expected, "loss")[0];
  const double grad_error = RelativeL2(grad, ReferenceTensor(*expected, "grad"));
  const double update_error = RelativeL2(updated, ReferenceTensor(*expected, "updated"));
  std::cout << "loss " << stats.loss << " (diffusers " << loss << "); gradient relative L2 "
            << grad_error << "; updated vectors " << update_error << "\n";
  EXPECT_NEAR(stats.loss, loss, 1e-5 * loss);
  // Measured 1.3e-6 and 1.3e-7: fp32's rounding through the UNet and the encoder.
  EXPECT_LE(grad_error, 1e-5);
  EXPECT_LE(update_error, 1e-6);
}

// `difftrain train` of the job: two data-parallel ranks end where one process does; a run
// broken after its first step and resumed ends bit for bit where the unbroken one does; the
// export is diffusers' learned_embeds, which diffusers loads and `sample` samples with.
TEST_F(TextualInversionTest, TrainsResumesExportsAndSamples) {
  SetUpRun(3);
  if (IsSkipped()) return;
  // Global batches of 4 (two micro-batches of 2 in one process; one each on two ranks).
  job_ = WriteJob("job", 3, kInversion, "batch: {micro: 2, global: 4}");
  const std::string one = (dir_ / "job-ckpt").string();
  const CommandResult trained = TrainInOneProcess(job_);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::vector<float> final = Vectors(one);
  ASSERT_EQ(final.size(), 2u * 32);

  // Broken after step 1: its later checkpoints removed, the run resumes from step 1.
  const std::string broken_job = WriteJob("broken", 3, kInversion, "batch: {micro: 2, global: 4}");
  const std::string broken = (dir_ / "broken-ckpt").string();
  KeepTheFirstStep(one, broken);
  const CommandResult resumed = TrainInOneProcess(broken_job);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("step 1"));
  EXPECT_EQ(Vectors(broken), final);

  // Two data-parallel ranks against one process.
  const std::string dp_job = WriteJob("dp", 3, kInversion + std::string("parallel: {dp: 2}\n"),
                                      "batch: {micro: 2, global: 4}");
  const CommandResult ranks = TrainOnTwoRanks(dp_job, dir_);
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  const std::vector<float> two = Vectors((dir_ / "dp-ckpt").string());
  std::cout << "two ranks against one process: relative L2 " << RelativeL2(two, final) << "\n";
  EXPECT_LE(RelativeL2(two, final), 1e-6);
  // The UNet is frozen: the checkpoint's is the pipeline's, and its EMA the same.
  io::CheckpointStore checkpoints(one, 10);
  const io::SafetensorsFile shard = std::move(checkpoints.ReadShard(3, 0, 1)).value();
  Result<io::SafetensorsFile> base =
      io::SafetensorsFile::Read(pipeline_ + "/unet/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(base.ok());
  for (const char* name :
       {"conv_in.weight", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"}) {
    EXPECT_EQ(ReferenceTensor(shard, name), ReferenceTensor(*base, name)) << name;
    EXPECT_EQ(ReferenceTensor(shard, std::string("ema.") + name), ReferenceTensor(*base, name))
        << name;
  }

  // The export, as diffusers' script writes it and its loader reads it.
  const std::string learned = (dir_ / "learned_embeds.safetensors").string();
  const CommandResult exported = RunCommand(fmt::format(
      "{} export --checkpoint {} --format textual-inversion --weights model --out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(one), ShellQuote(learned)));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  Result<io::SafetensorsFile> file = io::SafetensorsFile::Read(learned);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->Names(), std::vector<std::string>{"<cat-toy>"});
  EXPECT_EQ(ReferenceTensor(*file, "<cat-toy>"), final);
  io::SafetensorsWriter vectors;
  vectors.AddF32("vectors", {2, 32}, final.data());
  const std::string vectors_path = (dir_ / "vectors.safetensors").string();
  ASSERT_TRUE(vectors.WriteAtomic(vectors_path).ok());
  const CommandResult loaded =
      RunScript("textual_inversion.py", fmt::format("load {} {} {}", ShellQuote(pipeline_),
                                                    ShellQuote(learned), ShellQuote(vectors_path)));
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  const CommandResult sampled = RunCommand(fmt::format(
      "{} sample --pretrained {} --textual-inversion {} --prompt 'a photo of <cat-toy>' --steps 2 "
      "--vae none --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline_), ShellQuote(learned),
      ShellQuote((dir_ / "sampled.safetensors").string())));
  EXPECT_EQ(sampled.exit_code, 0) << sampled.output;
  // The checkpoint samples with its token: every prompt embedded with the trained vectors.
  const CommandResult from_checkpoint = RunCommand(fmt::format(
      "{} sample --checkpoint {} --prompt 'a photo of <cat-toy>' --steps 2 --raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(one),
      ShellQuote((dir_ / "from_checkpoint.safetensors").string())));
  EXPECT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.output;
  EXPECT_THAT(from_checkpoint.output,
              HasSubstr("the checkpoint's textual inversion: the token <cat-toy> (2 ema vectors)"));
  const CommandResult table_refused = RunCommand(fmt::format(
      "{} sample --checkpoint {} --prompt 'a photo of <cat-toy>' --text-table {} --steps 2 --raw "
      "{} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(one), ShellQuote(packed_ + "/text.safetensors"),
      ShellQuote((dir_ / "refused.safetensors").string())));
  EXPECT_NE(table_refused.exit_code, 0) << table_refused.output;
  EXPECT_THAT(table_refused.output, HasSubstr("trained the textual inversion <cat-toy>"));
  // A whole-model checkpoint has no vectors to export.
  const CommandResult refused =
      RunCommand(fmt::format("{} export --checkpoint {} --format textual-inversion --out {} 2>&1",
                             ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline_ + "/unet"),
                             ShellQuote((dir_ / "none.safetensors").string())));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
}

// Texts from templates, for pictures packed without captions: each sample's text is one of the
// templates with the token (all its vectors spelled), and the run trains; and what does not fit
// the pipeline is refused by name.
// What `validate` and the controller count of the text encoder a textual inversion trains
// through (PlanMemory's text_encoder: TextEncoderMemory) is what the trainer holds: the
// encoder's weights with the new rows, and after a step what its micro-batch's pass keeps. An
// encoder not readable where the job is planned is said not to be counted.
TEST_F(TextualInversionTest, ThePlanCountsTheTextEncoderAsTheTrainerHoldsIt) {
  SetUpRun(1);
  if (IsSkipped()) return;
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job_);
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  std::string why;
  const std::optional<TrainedEncoder> encoder = Trainer::TrainedTextEncoder(*config, &why);
  ASSERT_TRUE(encoder.has_value()) << why;
  Result<TextTable> table = ReadTextTable(packed_ + "/text.safetensors");
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(encoder->path, table->text_encoder);  // the job names none: the data's
  EXPECT_EQ(encoder->skip_layers, table->skip_layers);

  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 2, batch).ok());
  (*trainer)->StepOn(batch);
  const TextualInversion* inversion = (*trainer)->textual_inversion();
  const int length = FamilyOf(config->model).Samples(config->model).context_length;
  Result<TextEncoderMemory> plan =
      PlanTextEncoderMemory(encoder->config, nullptr, 2, 2, 1, length, encoder->skip_layers);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->weights, inversion->embedder().encoder().tensors().total() * sizeof(float));
  EXPECT_EQ(inversion->passes().HeldBytes(0),
            EncoderPassBytes(encoder->config, 2, length, encoder->skip_layers, false));
  EXPECT_GT(plan->activations, inversion->passes().HeldBytes(0));
  const Result<MemoryBytes> with =
      PlanMemory(config->model, {}, 0, 2, 1, false, 1, config->parallel.bucket_elements(), false,
                 config->lora, config->textual_inversion, &*encoder);
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_EQ(with->text_encoder, plan->total());
  // The controller's check that a node holds its ranks counts it.
  Result<controller::JobPlan> job_plan = controller::MakePlan(*config);
  ASSERT_TRUE(job_plan.ok()) << job_plan.status().message();
  EXPECT_EQ(job_plan->text_encoder_bytes_per_rank, static_cast<int64_t>(plan->total()));
  const int64_t need = static_cast<int64_t>(with->total());
  EXPECT_TRUE(controller::CheckNodeHostMemory(*config, *job_plan, 0, "n0", need, "").ok());
  EXPECT_FALSE(controller::CheckNodeHostMemory(*config, *job_plan, 0, "n0", need - 1, "").ok());
  // And the trainer's out-of-memory error.
  const std::string arenas = DescribeHostArenas(*config, {});
  EXPECT_NE(arenas.find(fmt::format(", text encoder {:.2f} GiB)", plan->total() / double(1 << 30))),
            std::string::npos)
      << arenas;
  EXPECT_NE(arenas.find(fmt::format("{:.2f} GiB of host memory", need / double(1 << 30))),
            std::string::npos)
      << arenas;

  const auto validate = [](const std::string& job) {
    return RunCommand(
        fmt::format("{} validate {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
  };
  CommandResult r = validate(job_);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("+ text encoder {:.1f} MiB ('{}': its weights, the "
                                              "activations of its passes)",
                                              plan->total() / 1048576.0, encoder->path)));
  const std::string elsewhere =
      WriteJob("elsewhere", 1,
               "textual_inversion: {token: '<cat-toy>', initializer_token: toy, text_encoder: "
               "/on/the/nodes/sd15}\n");
  r = validate(elsewhere);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("+ text encoder: not counted (text encoder '/on/the/nodes/sd15': "
                                  "no such file or directory)"));
}

TEST_F(TextualInversionTest, TemplatesMakeTheTextsAndMisfitsAreRefused) {
  SetUpRun(1);
  if (IsSkipped()) return;
  const std::string bare = (dir_ / "bare").string();
  const CommandResult pack = RunCommand(fmt::format(
      "{} data pack --dataset image_folder --path {} --image-size 16 --crop square --vae {} "
      "--out {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote((dir_ / "pictures").string()), ShellQuote(pipeline_),
      ShellQuote(bare)));
  ASSERT_EQ(pack.exit_code, 0) << pack.output;
  packed_ = bare;
  const std::string templates = fmt::format(
      "textual_inversion: {{token: '<cat-toy>', initializer_token: toy, vectors: 2, "
      "text_encoder: {}, templates: ['a photo of a {{}}', 'a rendering of the {{}}']}}\n"
      "optimizer: {{lr: 0.002, warmup_steps: 0, ema_decay: 0}}\n",
      pipeline_);
  const std::string job = WriteJob("templates", 1, templates, "batch: {micro: 4, global: 4}");
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job);
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  const TextEmbedder& embedder = (*trainer)->textual_inversion()->embedder();
  const text::Tokens photo = embedder.tokenizer().Encode("a photo of a <cat-toy> <cat-toy>_1", 77);
  const text::Tokens rendering =
      embedder.tokenizer().Encode("a rendering of the <cat-toy> <cat-toy>_1", 77);
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 4, batch).ok());
  for (const text::Tokens& t : batch.texts)
    EXPECT_TRUE(t.ids == photo.ids || t.ids == rendering.ids);
  const CommandResult trained = RunCommand(
      fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;

  // Misfits, each refused by `difftrain train` with a message naming it.
  packed_ = (dir_ / "packed").string();
  const auto refused = [&](const std::string& name, const std::string& inversion,
                           const std::string& why) {
    const std::string bad = WriteJob(name, 1, "textual_inversion: " + inversion + "\n");
    const CommandResult r = RunCommand(
        fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(bad)));
    EXPECT_NE(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(why)) << name;
  };
  refused("known", "{token: toy, initializer_token: cat}", "the token 'toy' is already in");
  refused("long", "{token: '<cat-toy>', initializer_token: 'cat toy'}",
          "'cat toy' is 2 tokens to the tokenizer");
  refused("unnamed", "{token: '<dog>', initializer_token: dog}",
          "none of the data's 3 captions names '<dog>'");
  packed_ = bare;
  refused("uncaptioned", "{token: '<cat-toy>', initializer_token: toy}",
          "textual_inversion.text_encoder: required");
  refused(
      "no_texts",
      fmt::format("{{token: '<cat-toy>', initializer_token: toy, text_encoder: {}}}", pipeline_),
      "carry no captions; give textual_inversion.templates");
}

}  // namespace
}  // namespace difftrain::testing
