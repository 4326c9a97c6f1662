// `difftrain debug-dump`: one training step's inputs, output, loss and every gradient in one
// safetensors file, for checking against a reference implementation (docs/formats.md).
#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "launch/command.h"
#include "launch/model_options.h"
#include "model/data/latent_folder.h"
#include "model/io/safetensors.h"
#include "model/train/checkpointing.h"
#include "model/train/trainer.h"

namespace difftrain::launch {
namespace {

struct DebugDumpOptions {
  ModelOptions model;
  uint64_t seed = 0;
  int batch = 4;
  bool random_weights = false;
  std::string init_from;  // the weights to start from (checkpoint.init_from's forms)
  DiffusionConfig diffusion;
  std::vector<int64_t> timesteps;  // the batch's, one per sample; empty: drawn as in training
  LoraConfig lora;                 // LoRA adapters: their gradients instead of the model's
  std::string data;                // a latent folder to take the batch from; empty: synthetic
  std::string out;
};

// [B, C, H, W] for images, [B, F, C, H, W] for videos.
std::vector<int64_t> BatchShape(int64_t B, const SampleSchema& x, int channels) {
  if (!x.video) return {B, channels, x.height, x.width};
  return {B, x.frames, channels, x.height, x.width};
}

int RunDebugDump(const DebugDumpOptions& o) {
  Result<ModelSpec> model = o.model.Build();
  if (!model.ok()) return ReportBadInput("debug-dump", model.status().message());
  if (o.batch < 1) return ReportBadInput("debug-dump", "--batch must be positive");

  TrainConfig config;
  config.model = *model;
  config.seed = o.seed;
  config.micro_batch = config.global_batch = o.batch;
  config.diffusion = o.diffusion;
  config.lora = o.lora;
  if (Status valid = o.diffusion.Validate(); !valid.ok()) {
    return ReportBadInput("debug-dump", valid.message());
  }
  if (Status valid = config.lora.Validate(); !valid.ok()) {
    return ReportBadInput("debug-dump", valid.message());
  }
  if (config.lora.enabled()) {
    if (Status valid = config.ValidateLora(); !valid.ok()) {
      return ReportBadInput("debug-dump", valid.message());
    }
  }
  SampleSchema x = FamilyOf(*model).Samples(*model);
  // The batch is the training data's first, as a run with this seed draws it, or synthetic.
  std::unique_ptr<Dataset> data =
      std::make_unique<SyntheticDataset>(o.seed, x.channels, x.height, x.num_classes, x.frames);
  if (!o.data.empty()) {
    Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(o.data);
    if (!folder.ok()) return ReportBadInput("debug-dump", "--data: " + folder.status().message());
    if (Status fits = CheckDataFitsModel(**folder, x, "latent_folder"); !fits.ok())
      return ReportBadInput("debug-dump", "--data: " + fits.message());
    if (Status fits = CheckBucketsFitTraining(**folder, config, "latent_folder"); !fits.ok())
      return ReportBadInput("debug-dump", "--data: " + fits.message());
    data = std::move(folder).value();
  }
  Trainer trainer(config, std::move(data));
  if (o.random_weights) trainer.InitializeRandom(o.seed);
  if (!o.init_from.empty()) {
    Result<std::string> from = InitializeFromWeights(trainer, o.init_from);
    if (!from.ok()) return ReportBadInput("debug-dump", "--init-from: " + from.status().message());
  }

  MicroBatch batch;
  Status made = trainer.MakeMicroBatch(0, o.batch, batch);
  if (!made.ok()) return ReportBadInput("debug-dump", made.message());
  // The batch's size: a bucketed folder's first batch is of its bucket's.
  x.height = batch.sample_size.height;
  x.width = batch.sample_size.width;
  if (!o.timesteps.empty()) {
    if (o.timesteps.size() != size_t(o.batch)) {
      return ReportBadInput("debug-dump", fmt::format("--timesteps: {} given for a batch of {}",
                                                      o.timesteps.size(), o.batch));
    }
    for (int64_t t : o.timesteps) {
      if (t < 0 || t >= o.diffusion.steps) {
        return ReportBadInput(
            "debug-dump", fmt::format("--timesteps: {} is outside [0, {})", t, o.diffusion.steps));
      }
    }
    // The batch again at these timesteps: x_t from the same x0 and noise.
    batch.t = o.timesteps;
    std::transform(batch.t.begin(), batch.t.end(), batch.t_float.begin(),
                   [](int64_t t) { return static_cast<float>(t); });
    GaussianDiffusion(o.diffusion)
        .QSample(batch.x_t.data(), batch.x0.data(), batch.noise.data(), batch.t.data(), o.batch,
                 batch.x0.size() / o.batch,
                 batch.perturbation.empty() ? nullptr : batch.perturbation.data());
  }
  std::memset(trainer.model().grads(), 0, trainer.model().num_params() * sizeof(float));
  const float loss = static_cast<float>(trainer.ForwardBackward(batch, 1.0f));

  const int64_t B = o.batch;
  io::SafetensorsWriter file;
  const Model& m = trainer.model();
  // With LoRA the model's weights are the frozen ones, the adapters beside them.
  LoraAdapters* lora = trainer.lora();
  std::map<std::string, const float*> frozen;
  if (lora != nullptr) {
    for (const LoraModule& module : lora->modules())
      frozen[module.name + ".weight"] = lora->base() + module.base;
  }
  for (const TensorSpec& t : m.parameter_table().tensors()) {
    const auto base = frozen.find(t.name);
    file.AddF32(t.name, t.shape, base != frozen.end() ? base->second : m.params() + t.offset);
  }
  for (const FixedTensor& f : m.fixed_tensors())
    file.AddF32(f.name, f.shape, f.data);
  file.AddF32("input.x0", BatchShape(B, x, x.channels), batch.x0.data());
  file.AddF32("input.noise", BatchShape(B, x, x.channels), batch.noise.data());
  file.Add("input.t", io::DType::kI64, {B}, batch.t.data());
  std::vector<int64_t> labels(batch.y.begin(), batch.y.end());
  if (x.num_classes > 0) file.Add("input.y", io::DType::kI64, {B}, labels.data());
  if (x.context_length > 0) {
    file.AddF32("input.context", {B, x.context_length, x.context_dim}, batch.context.data());
  }
  if (x.pooled_text_dim > 0) {
    file.AddF32("input.pooled_text", {B, x.pooled_text_dim}, batch.pooled_text.data());
    file.AddF32("input.time_ids", {B, int64_t(x.time_ids.size())}, batch.time_ids.data());
  }
  if (!batch.perturbation.empty()) {
    file.AddF32("input.perturbation", BatchShape(B, x, x.channels), batch.perturbation.data());
  }
  file.AddF32("input.x_t", BatchShape(B, x, x.channels), batch.x_t.data());
  file.AddF32("output", BatchShape(B, x, x.out_channels), trainer.last_output());
  file.AddF32("loss", {1}, &loss);
  if (lora != nullptr) {
    lora->Gradients(trainer.model().grads());
    for (const TensorSpec& t : lora->table().tensors()) {
      file.AddF32("lora." + t.name, t.shape, lora->params() + t.offset);
      file.AddF32("grad.lora." + t.name, t.shape, lora->grads() + t.offset);
    }
    file.SetMetadata("lora", config.lora.ToJson().dump());
  } else {
    for (const TensorSpec& t : m.parameter_table().tensors())
      file.AddF32("grad." + t.name, t.shape, trainer.model().grads() + t.offset);
  }
  file.SetMetadata("format", "difftrain-debug-dump");
  file.SetMetadata("version", "1");
  file.SetMetadata("family", model->family);
  file.SetMetadata("config", model->config.dump());
  file.SetMetadata("diffusion", config.diffusion.ToJson().dump());
  file.SetMetadata("seed", std::to_string(o.seed));
  Status written = file.WriteAtomic(o.out);
  if (!written.ok()) {
    std::fprintf(stderr, "difftrain debug-dump: %s\n", written.message().c_str());
    return kExitJobFailed;
  }
  spdlog::info("wrote {} (loss {:.6f}, {} parameters)", o.out, loss, m.num_params());
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(kDebugDump,
                  {"debug-dump",
                   "Write one training step (inputs, output, loss, every gradient) "
                   "to a safetensors file for reference checks",
                   [](CLI::App& app) {
                     auto o = std::make_shared<DebugDumpOptions>();
                     o->model.AddTo(app);
                     app.add_option("--seed", o->seed, "seed of weights and inputs");
                     app.add_option("--batch", o->batch, "micro-batch size")->capture_default_str();
                     app.add_flag("--random-weights", o->random_weights,
                                  "draw every parameter at random (also the "
                                  "zero-initialised ones)");
                     app.add_option("--init-from", o->init_from,
                                    "start from these weights: a safetensors file, a diffusers "
                                    "model folder or a checkpoint directory, as the job's "
                                    "checkpoint.init_from")
                         ->excludes("--random-weights");
                     AddDiffusionOptions(app, o->diffusion);
                     app.add_option("--noise-offset", o->diffusion.noise_offset,
                                    "offset noise: each channel's noise shifted by this times "
                                    "N(0, 1) (the job's diffusion.noise_offset)");
                     app.add_option("--input-perturbation", o->diffusion.input_perturbation,
                                    "x_t from the noise plus this times N(0, 1) "
                                    "(`input.perturbation`; the job's "
                                    "diffusion.input_perturbation)");
                     app.add_option("--timesteps", o->timesteps,
                                    "the batch's timesteps, one per sample: 999,500,0 "
                                    "(default: drawn as training draws them)")
                         ->delimiter(',');
                     app.add_option("--lora-rank", o->lora.rank,
                                    "train LoRA adapters of this rank: the dump holds their "
                                    "gradients (`lora.`, `grad.lora.`), the model's weights "
                                    "frozen");
                     app.add_option("--lora-alpha", o->lora.alpha,
                                    "the adapters' alpha (default: the rank)");
                     app.add_option("--lora-targets", o->lora.targets,
                                    "the modules adapted (default to_q,to_k,to_v,to_out.0)")
                         ->delimiter(',');
                     app.add_flag("--lora-use-dora", o->lora.use_dora,
                                  "DoRA adapters: a trained magnitude per output row besides A "
                                  "and B (`lora.M.lora_magnitude_vector`)");
                     app.add_flag("--lora-use-rslora", o->lora.use_rslora,
                                  "rsLoRA's scale alpha / sqrt(rank) instead of alpha / rank");
                     app.add_option("--data", o->data,
                                    "take the batch from this latent folder (its pictures, texts, "
                                    "pooled texts and SDXL time ids), as training with this "
                                    "--seed draws it (default: synthetic samples)");
                     app.add_option("--out", o->out, "output .safetensors file")->required();
                     return [o] { return RunDebugDump(*o); };
                   }});

}  // namespace difftrain::launch
