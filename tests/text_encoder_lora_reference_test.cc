// A LoRA of the UNet and the text encoder together (lora.train_text_encoder;
// model/train/text_encoder_lora.h) against diffusers 0.27.2's train_dreambooth_lora.py
// --train_text_encoder, with peft 0.10.0 (tests/reference/text_encoder_lora.py), on a small
// Stable Diffusion pipeline (tests/testing/sd_pipeline.h): captioned pictures packed through its
// VAE and text encoder, then
//   - two training steps on one batch, of LoRA and of DoRA: the loss of each, the second's
//   gradients of every
//     adapter (A's as well: after the first step B is no longer zero) and the adapters after it
//     are the script's in float64 (the gradient through the UNet's cross-attention and the CLIP
//     text model's attention);
//   - a run: two data-parallel ranks train what one process trains, a run resumed from a
//     checkpoint ends bit for bit where an unbroken one does, `export --format lora` writes what
//     diffusers' load_lora_weights fuses into the weights difftrain's checkpoint holds, and the
//     checkpoint samples with its text encoder adapted;
//   - and the jobs it refuses, by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "model/io/checkpoint.h"
#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/train/text_encoder_lora.h"
#include "model/train/trainer.h"
#include "tests/testing/python_reference.h"
#include "tests/testing/sd_pipeline.h"
#include "tests/testing/text_step.h"

namespace difftrain::testing {
namespace {

using ::testing::HasSubstr;

// rank 2 and alpha 4: a scale of 2, which the reference applies as peft's scaling.
constexpr char kLora[] =
    "lora: {rank: 2, alpha: 4, train_text_encoder: true}\n"
    "optimizer: {lr: 0.01, warmup_steps: 0, weight_decay: 0.01, ema_decay: 0}\n";

class TextEncoderLoraTest : public SdPipelineReferenceTest {
 protected:
  // The pipeline, its captioned pictures packed, and peft's Python.
  void SetUpRun() {
    const std::string text_python = TextPython();
    if (text_python.empty()) GTEST_SKIP() << "no transformers 4.40.2 environment";
    const CommandResult peft = RunCommand(
        ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/peft_env.sh") + " 2>/dev/null");
    if (peft.exit_code != 0) GTEST_SKIP() << "no peft 0.10.0 environment";
    peft_python_ = LastLine(peft.output);
    pipeline_ = MakePipeline(text_python);
    ASSERT_FALSE(pipeline_.empty());
    WriteCaptionedPictures(
        dir_ / "pictures", {{16, 16}, {20, 16}, {16, 24}, {16, 16}},
        {"a photo of sks dog", "sks dog on a table", "a photo of sks dog", "a small sks dog"});
    packed_ = (dir_ / "packed").string();
    PackCaptionedPictures((dir_ / "pictures").string(), pipeline_, packed_);
  }

  // A job of `steps` steps (checkpoints each step into NAME-ckpt) with the lora section `lora`
  // (kLora), texts never dropped, and the batch section `batch`.
  std::string WriteJob(const std::string& name, int steps, const std::string& lora = kLora,
                       const std::string& batch = "batch: {micro: 2, global: 2}") {
    const std::string job = (dir_ / (name + ".yaml")).string();
    WriteFineTuneJob(job, pipeline_, packed_, (dir_ / (name + "-ckpt")).string(), steps, 1, lora,
                     batch);
    // No text dropped: the reference encodes every text.
    std::ifstream in(job);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t model = text.find("\"name\":\"unet\"");
    EXPECT_NE(model, std::string::npos) << text;
    if (model != std::string::npos) text.insert(model, "\"text_dropout\":0,");
    std::ofstream(job) << text;
    return job;
  }

  CommandResult RunPeft(const std::string& args) {
    return RunCommand(ShellQuote(peft_python_) + " " +
                      ShellQuote(DIFFTRAIN_SOURCE_DIR "/tests/reference/text_encoder_lora.py") +
                      " " + args + " 2>&1");
  }

  // The adapters of the newest checkpoint of `ckpt` ("lora.…" tensors, by name).
  static std::map<std::string, std::vector<float>> Adapters(const std::string& ckpt) {
    const io::SafetensorsFile shard = NewestShard0(ckpt);
    std::map<std::string, std::vector<float>> adapters;
    for (const std::string& name : shard.Names()) {
      if (name.starts_with("lora.") && !name.starts_with("lora.base."))
        adapters[name] = ReferenceTensor(shard, name);
    }
    return adapters;
  }

  void ExpectTwoStepsAsTheScripts(const std::string& lora, double grad_bound, double update_bound);

  std::string peft_python_, pipeline_, packed_;
};

// The adapters' arena as one vector, and their names as the reference's file has them.
std::string ReferenceName(const LoraModule& m, const std::string& suffix) {
  return (m.part == 0 ? "unet." : "") + m.name + suffix;
}

// Two steps of a job with the lora section `lora` on one batch against the reference's, in
// float64: each step's loss, the second's gradients of each part's adapters and the adapters
// after it, within the bounds given (relative L2 over each part).
void TextEncoderLoraTest::ExpectTwoStepsAsTheScripts(const std::string& lora, double grad_bound,
                                                     double update_bound) {
  SetUpRun();
  if (IsSkipped()) return;
  Result<TrainConfig> config = TrainConfig::FromYamlFile(WriteJob("job", 2, lora));
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  Result<io::SafetensorsFile> unet =
      io::SafetensorsFile::Map(pipeline_ + "/unet/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(unet.ok());
  ASSERT_TRUE((*trainer)->InitializeFrom(*unet).ok());
  const LoraAdapters* lora = (*trainer)->lora();
  ASSERT_NE(lora, nullptr);
  ASSERT_NE((*trainer)->text_encoder_lora(), nullptr);
  int text_modules = 0;
  for (const LoraModule& m : lora->modules())
    text_modules += m.part == 1;
  EXPECT_EQ(text_modules, 2 * 4) << "q, k, v and out of the encoder's two layers";
  const std::vector<float> initial(lora->params(), lora->params() + lora->size());
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 2, batch).ok());
  for (uint8_t dropped : batch.text_dropped)
    ASSERT_EQ(dropped, 0);
  const StepStats first = (*trainer)->StepOn(batch);
  const StepStats second = (*trainer)->StepOn(batch);

  io::SafetensorsWriter step;
  const std::vector<float> ids = AddTextStep(batch, config->optimizer, step);
  const bool dora = config->lora.use_dora;
  std::vector<std::string> suffixes = {".lora_A.weight", ".lora_B.weight"};
  if (dora) suffixes.push_back(".lora_magnitude_vector");
  for (const LoraModule& m : lora->modules()) {
    const TensorTable& t = lora->table();
    for (const std::string& suffix : suffixes) {
      const TensorSpec* spec = t.Find(m.name + suffix);
      step.AddF32(ReferenceName(m, suffix), spec->shape, initial.data() + spec->offset);
    }
  }
  step.SetMetadata("rank", "2");
  step.SetMetadata("alpha", "4");
  if (dora) step.SetMetadata("use_dora", "true");
  step.SetMetadata("unet_targets", nlohmann::json(config->lora.targets).dump());
  step.SetMetadata("text_targets", nlohmann::json(config->lora.text_encoder_targets).dump());
  step.SetMetadata("steps", "2");
  const std::string step_path = (dir_ / "step.safetensors").string();
  ASSERT_TRUE(step.WriteAtomic(step_path).ok());
  const std::string out = (dir_ / "expected.safetensors").string();
  const CommandResult ran = RunPeft(
      fmt::format("step {} {} {}", ShellQuote(pipeline_), ShellQuote(step_path), ShellQuote(out)));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  Result<io::SafetensorsFile> expected = io::SafetensorsFile::Read(out);
  ASSERT_TRUE(expected.ok());
  const std::vector<float> losses = ReferenceTensor(*expected, "loss");
  ASSERT_EQ(losses.size(), 2u);
  // Each part's gradients and adapters, in the arena's order.
  for (int part : {0, 1}) {
    std::vector<float> grad, want_grad, updated, want_updated;
    for (const LoraModule& m : lora->modules()) {
      if (m.part != part) continue;
      for (const std::string& suffix : suffixes) {
        const TensorSpec* spec = lora->table().Find(m.name + suffix);
        grad.insert(grad.end(), lora->grads() + spec->offset,
                    lora->grads() + spec->offset + spec->numel);
        updated.insert(updated.end(), lora->params() + spec->offset,
                       lora->params() + spec->offset + spec->numel);
        const std::vector<float> g = ReferenceTensor(*expected, "grad." + ReferenceName(m, suffix));
        const std::vector<float> u = ReferenceTensor(*expected, ReferenceName(m, suffix));
        want_grad.insert(want_grad.end(), g.begin(), g.end());
        want_updated.insert(want_updated.end(), u.begin(), u.end());
      }
    }
    const double grad_error = RelativeL2(grad, want_grad);
    const double update_error = RelativeL2(updated, want_updated);
    std::cout << (part == 0 ? "UNet" : "text encoder") << " adapters: second step's gradient "
              << "relative L2 " << grad_error << ", after it " << update_error << "\n";
    EXPECT_LE(grad_error, grad_bound);
    EXPECT_LE(update_error, update_bound);
  }
  std::cout << "losses " << first.loss << ", " << second.loss << " (diffusers " << losses[0] << ", "
            << losses[1] << ")\n";
  EXPECT_NEAR(first.loss, losses[0], 1e-5 * losses[0]);
  EXPECT_NEAR(second.loss, losses[1], 1e-5 * losses[1]);
}

// Measured 6.8e-6 (UNet) and 5.3e-6 (text encoder) for the gradients: fp32's rounding through
// both models after a first step that moves every B by ±lr, whatever its gradient's size; and
// 2.2e-7, 2.4e-7 for the adapters after the second step.
TEST_F(TextEncoderLoraTest, TwoStepsAreTrainDreamboothLoraWithTheTextEncoder) {
  ExpectTwoStepsAsTheScripts(kLora, 2e-5, 1e-6);
}

// DoRA of both models (peft's use_dora=True on each): the magnitudes train beside A and B, each
// row's norm held constant in the backward pass as peft's is. Measured 9.0e-6 and 6.9e-6 for the
// gradients, 2.2e-7 and 1.9e-7 for the adapters after the second step.
TEST_F(TextEncoderLoraTest, TwoStepsOfDoraAreThePeftScripts) {
  ExpectTwoStepsAsTheScripts(
      "lora: {rank: 2, alpha: 4, use_dora: true, train_text_encoder: true}\n"
      "optimizer: {lr: 0.01, warmup_steps: 0, weight_decay: 0.01, ema_decay: 0}\n",
      2e-5, 1e-6);
}

// What `validate` and the controller count of the adapted text encoder (PlanMemory's
// text_encoder: TextEncoderMemory) is what the trainer holds: the encoder's weights; the
// encoder's share of the LoRA arenas (the adapters, their gradients, moments and EMA, the frozen
// copies) with the adapted weights' gradients; after a step what the micro-batch's pass keeps,
// the Linear layers' inputs with it.
TEST_F(TextEncoderLoraTest, ThePlanCountsTheAdaptedTextEncoderAsTheTrainerHoldsIt) {
  SetUpRun();
  if (IsSkipped()) return;
  const std::string job = WriteJob("plan", 1);
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job);
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  std::string why;
  const std::optional<TrainedEncoder> encoder = Trainer::TrainedTextEncoder(*config, &why);
  ASSERT_TRUE(encoder.has_value()) << why;
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 2, batch).ok());
  (*trainer)->StepOn(batch);
  const TextEncoderLora* text = (*trainer)->text_encoder_lora();
  const LoraAdapters* adapters = (*trainer)->lora();
  ASSERT_TRUE(text != nullptr && adapters != nullptr);

  const ModelFamily& family = FamilyOf(config->model);
  const int length = family.Samples(config->model).context_length;
  Result<TextEncoderMemory> plan =
      PlanTextEncoderMemory(encoder->config, &config->lora, 0, 2, 1, length, encoder->skip_layers);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->weights, text->table().total() * sizeof(float));
  Result<ModelPartition> whole = family.Partition(config->model, {}, 0, 0, 0);
  ASSERT_TRUE(whole.ok());
  Result<LoraElements> unet = CountLoraElements(config->lora, whole->parameters.table);
  ASSERT_TRUE(unet.ok());
  const size_t text_adapters = adapters->size() - unet->adapters;
  const size_t text_frozen = adapters->base_size() - unet->frozen;
  EXPECT_GT(text_adapters, 0u);
  // A checkpoint fuses the EMA's adapters into a copy of the UNet's adapted weights alone.
  EXPECT_EQ(adapters->model_base_size(), unet->frozen);
  EXPECT_EQ(plan->lora,
            sizeof(float) * (5 * text_adapters + text_frozen + text->trained_elements()));
  EXPECT_EQ(text->passes().HeldBytes(0),
            EncoderPassBytes(encoder->config, 2, length, encoder->skip_layers, true));

  const CommandResult r =
      RunCommand(fmt::format("{} validate {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("+ text encoder {:.1f} MiB ('{}': its weights, its "
                                              "adapters' state, the activations of its passes)",
                                              plan->total() / 1048576.0, encoder->path)));
}

// `difftrain train` of the job: two data-parallel ranks end where one process does; a run
// broken after its first step and resumed ends bit for bit where the unbroken one does; the
// export is what diffusers' load_lora_weights fuses into the weights of the checkpoint's UNet and
// of the text encoder with the checkpoint's adapters; the checkpoint samples with them.
TEST_F(TextEncoderLoraTest, TrainsResumesExportsAndSamples) {
  SetUpRun();
  if (IsSkipped()) return;
  const std::string batch = "batch: {micro: 2, global: 4}";
  const std::string job = WriteJob("job", 3, kLora, batch);
  const std::string one = (dir_ / "job-ckpt").string();
  const CommandResult trained = TrainInOneProcess(job);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_THAT(trained.output, HasSubstr("is adapted too"));
  const auto final = Adapters(one);
  ASSERT_FALSE(final.empty());
  EXPECT_TRUE(
      final.contains("lora.text_encoder.text_model.encoder.layers.1.self_attn.out_proj."
                     "lora_B.weight"));

  // Broken after step 1: its later checkpoints removed, the run resumes from step 1.
  const std::string broken_job = WriteJob("broken", 3, kLora, batch);
  const std::string broken = (dir_ / "broken-ckpt").string();
  KeepTheFirstStep(one, broken);
  const CommandResult resumed = TrainInOneProcess(broken_job);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("step 1"));
  EXPECT_EQ(Adapters(broken), final);

  // Two data-parallel ranks against one process.
  const std::string dp_job = WriteJob("dp", 3, kLora + std::string("parallel: {dp: 2}\n"), batch);
  const CommandResult ranks = TrainOnTwoRanks(dp_job, dir_);
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  const auto two = Adapters((dir_ / "dp-ckpt").string());
  ASSERT_EQ(two.size(), final.size());
  std::vector<float> all_two, all_one;
  for (const auto& [name, values] : final) {
    all_one.insert(all_one.end(), values.begin(), values.end());
    all_two.insert(all_two.end(), two.at(name).begin(), two.at(name).end());
  }
  std::cout << "two ranks against one process: relative L2 " << RelativeL2(all_two, all_one)
            << "\n";
  // Measured 2.5e-7 on an AVX-512 machine and 3.2e-6 on an AVX2 one, whose BLAS rounds
  // otherwise: most of it in the text encoder's first q_proj's A (6.4e-5 at most an element).
  // CLIP's q and k gradients are small (clip_pass_test), and AdamW divides each update by its
  // gradient's own size, which is the likely way the all-reduce's rounding grows there. A
  // gradient not averaged over the ranks should differ by a part of the update itself (lr is
  // 1e-2; not measured).
  EXPECT_LE(RelativeL2(all_two, all_one), 3e-5);

  // The export, as the script writes it; diffusers fuses it into the pipeline.
  const std::string file = (dir_ / "pytorch_lora_weights.safetensors").string();
  const CommandResult exported = RunCommand(
      fmt::format("{} export --checkpoint {} --format lora --weights model --out {} 2>&1",
                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote(one), ShellQuote(file)));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  Result<io::SafetensorsFile> written = io::SafetensorsFile::Read(file);
  ASSERT_TRUE(written.ok());
  const std::vector<std::string> names = written->Names();
  EXPECT_THAT(names,
              ::testing::Contains("text_encoder.text_model.encoder.layers.0.self_attn.q_proj."
                                  "lora_linear_layer.down.weight"));
  const std::string fused = (dir_ / "fused.safetensors").string();
  const CommandResult loaded = RunPeft(
      fmt::format("load {} {} {}", ShellQuote(pipeline_), ShellQuote(file), ShellQuote(fused)));
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  Result<io::SafetensorsFile> by_diffusers = io::SafetensorsFile::Read(fused);
  ASSERT_TRUE(by_diffusers.ok());
  // The checkpoint's UNet (its adapters fused) and the pipeline's text encoder with the
  // checkpoint's adapters fused, as `sample --checkpoint` makes it.
  io::CheckpointStore checkpoints(one, 10);
  const io::SafetensorsFile shard = std::move(checkpoints.ReadShard(3, 0, 1)).value();
  Result<TextEmbedder> embedder = TextEmbedder::Load(pipeline_);
  ASSERT_TRUE(embedder.ok()) << embedder.status().message();
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(FuseCheckpointTextLora(shard, config->lora, /*ema=*/false, embedder->encoder()).ok());
  TextEncoder& encoder = embedder->encoder();
  int unet_weights = 0, text_weights = 0;
  for (const std::string& name : by_diffusers->Names()) {
    const std::vector<float> want = ReferenceTensor(*by_diffusers, name);
    std::vector<float> got;
    if (name.starts_with("unet.")) {
      got = ReferenceTensor(shard, name.substr(5));
      ++unet_weights;
    } else {
      ASSERT_TRUE(name.starts_with("text_encoder.")) << name;
      const TensorSpec* t = encoder.tensors().Find(name.substr(13));
      ASSERT_NE(t, nullptr) << name;
      got.assign(encoder.weights() + t->offset, encoder.weights() + t->offset + t->numel);
      ++text_weights;
    }
    EXPECT_LE(RelativeL2(got, want), 1e-6) << name;
  }
  int unet_modules = 0, text_modules = 0;
  for (const auto& [name, values] : final) {
    if (!name.ends_with(".lora_A.weight")) continue;
    (name.starts_with("lora.text_encoder.") ? text_modules : unet_modules) += 1;
  }
  EXPECT_EQ(unet_weights, unet_modules);
  EXPECT_EQ(text_weights, text_modules);
  EXPECT_EQ(text_modules, 8);
  // difftrain's own reading of the file: `sample --lora` fuses its text encoder part into the
  // encoder that embeds the prompts.
  const CommandResult with_lora = RunCommand(fmt::format(
      "{} sample --pretrained {} --lora {} --prompt 'a photo of sks dog' --steps 2 --vae none "
      "--raw {} 2>&1",
      ShellQuote(DIFFTRAIN_BINARY), ShellQuote(pipeline_), ShellQuote(file),
      ShellQuote((dir_ / "with_lora.safetensors").string())));
  EXPECT_EQ(with_lora.exit_code, 0) << with_lora.output;
  EXPECT_THAT(with_lora.output, HasSubstr("into 8 modules of the text encoder"));

  // The checkpoint samples with its adapted encoder; its export with a pipeline would not carry
  // it, and is refused.
  const CommandResult sampled = RunCommand(
      fmt::format("{} sample --checkpoint {} --prompt 'a photo of sks dog' --steps 2 --raw {} 2>&1",
                  ShellQuote(DIFFTRAIN_BINARY), ShellQuote(one),
                  ShellQuote((dir_ / "sampled.safetensors").string())));
  EXPECT_EQ(sampled.exit_code, 0) << sampled.output;
  EXPECT_THAT(sampled.output, HasSubstr("the checkpoint's text encoder adapters (ema weights)"));
  const CommandResult with_pipeline = RunCommand(fmt::format(
      "{} export --checkpoint {} --pipeline {} --out {} 2>&1", ShellQuote(DIFFTRAIN_BINARY),
      ShellQuote(one), ShellQuote(pipeline_), ShellQuote((dir_ / "pipeline-out").string())));
  EXPECT_NE(with_pipeline.exit_code, 0) << with_pipeline.output;
  EXPECT_THAT(with_pipeline.output, HasSubstr("adapted the text encoder too"));
}

// DreamBooth's prior preservation (data.prior_path) with the text encoder adapted: each half of
// a micro-batch is encoded from its own folder's captions (the class prompt for the prior's),
// and the run trains.
TEST_F(TextEncoderLoraTest, APriorsHalfIsEncodedFromItsOwnCaptions) {
  SetUpRun();
  if (IsSkipped()) return;
  WriteCaptionedPictures(dir_ / "class", {{16, 16}, {16, 16}},
                         {"a photo of dog", "a photo of dog"});
  const std::string prior = (dir_ / "class-packed").string();
  PackCaptionedPictures((dir_ / "class").string(), pipeline_, prior);
  const std::string job = WriteJob("prior", 2);
  std::ifstream in(job);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string data = "path: " + packed_ + "}";
  const size_t at = text.find(data);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, data.size(), "path: " + packed_ + ", prior_path: " + prior + "}");
  std::ofstream(job) << text;
  Result<TrainConfig> config = TrainConfig::FromYamlFile(job);
  ASSERT_TRUE(config.ok()) << config.status().message();
  config->device = "cpu";
  Result<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  const TextEncoderLora* encoder = (*trainer)->text_encoder_lora();
  ASSERT_NE(encoder, nullptr);
  MicroBatch batch;
  ASSERT_TRUE((*trainer)->MakeMicroBatch(0, 2, batch).ok());
  ASSERT_EQ(batch.texts.size(), 2u);
  std::vector<std::vector<int32_t>> subject;
  for (const char* caption : {"a photo of sks dog", "sks dog on a table", "a small sks dog"})
    subject.push_back(encoder->Tokenize(caption).ids);
  EXPECT_THAT(subject, ::testing::Contains(batch.texts[0].ids));
  EXPECT_EQ(batch.texts[1].ids, encoder->Tokenize("a photo of dog").ids);
  EXPECT_EQ(batch.sample_weights, (std::vector<double>{2.0, 2.0}));
  const CommandResult trained = TrainInOneProcess(job);
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_FALSE(Adapters((dir_ / "prior-ckpt").string()).empty());
}

// What does not fit is refused by `difftrain train` with a message naming it.
TEST_F(TextEncoderLoraTest, MisfitsAreRefusedByName) {
  SetUpRun();
  if (IsSkipped()) return;
  const auto refused = [&](const std::string& name, const std::string& lora,
                           const std::string& message) {
    const std::string job = WriteJob(name, 1, lora);
    const CommandResult r = RunCommand(
        fmt::format("{} train --config {} 2>&1", ShellQuote(DIFFTRAIN_BINARY), ShellQuote(job)));
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_THAT(r.output, HasSubstr(message)) << name;
  };
  refused("targets", "lora: {rank: 2, train_text_encoder: true, text_encoder_targets: [to_q]}\n",
          "lora.text_encoder_targets [to_q] match no module of the text encoder");
  refused("norm",
          "lora: {rank: 2, train_text_encoder: true, text_encoder_targets: [layer_norm1]}\n",
          "lora.text_encoder_targets [layer_norm1] match no module");
  refused("no-flag", fmt::format("lora: {{rank: 2, text_encoder: {}}}\n", pipeline_),
          "lora.text_encoder: '" + pipeline_ + "' is given but lora.train_text_encoder is not set");
  refused("cp", "lora: {rank: 2, train_text_encoder: true}\nparallel: {cp: 2}\n",
          "not with parallel.cp > 1");
}

}  // namespace
}  // namespace difftrain::testing
