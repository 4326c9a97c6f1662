#include "job/job_spec.h"

#include "common/yaml_fields.h"

namespace difftrain {

Result<int> TrainConfig::DataParallelSize(int world) const {
  const int model_parallel = parallel.tp * parallel.cp * parallel.pp;
  const int dp = parallel.dp > 0 ? parallel.dp : world / model_parallel;
  if (dp < 1 || world != model_parallel * dp) {
    return Errorf("the world of {} ranks is not tp · cp · dp · pp = {} · {} · {} · {}{}", world,
                  parallel.tp, parallel.cp, parallel.dp > 0 ? std::to_string(parallel.dp) : "dp",
                  parallel.pp, parallel.dp > 0 ? "" : " for any dp");
  }
  return dp;
}

Status TrainConfig::RefuseSettings(
    const std::string& field, const std::string& trains,
    std::initializer_list<std::pair<const char*, bool>> unsupported) const {
  for (const auto& [what, set] : unsupported) {
    if (set) {
      return Errorf("{}: {}; not with {}{}", cluster.Where(field), trains, what,
                    device_automatic && device == "cuda" ? " (train.device auto found a GPU: set "
                                                           "train.device: cpu)"
                                                         : "");
    }
  }
  return Status::Ok();
}

Status TrainConfig::ValidateLora() const {
  // The adapters are one replicated arena beside the model's: layouts that split the model's
  // weights (tp, pp) or shard the moments (ZeRO-1) do not apply, nor the GPU step yet.
  DT_RETURN_IF_ERROR(RefuseSettings("lora.rank",
                                    "lora trains on the CPU in data and context parallel layouts",
                                    {{"parallel.tp > 1", parallel.tp > 1},
                                     {"parallel.pp > 1", parallel.pp > 1},
                                     {"parallel.zero1", parallel.zero1},
                                     {"train.device cuda", device == "cuda"}}));
  DT_ASSIGN_OR_RETURN(const ModelPartition whole, FamilyOf(model).Partition(model, {}, 0, 0, 0));
  Result<std::vector<LoraModule>> modules = LoraModulesOf(lora, whole.parameters.table);
  if (!modules.ok()) {
    return Errorf("{}: {}", cluster.Where("lora.targets"), modules.status().message());
  }
  if (!lora.train_text_encoder) return Status::Ok();
  const SampleSchema s = FamilyOf(model).Samples(model);
  if (model.family != "unet" || s.context_length == 0 || s.pooled_text_dim > 0) {
    return Errorf("{}: adapts the Stable Diffusion 1.x/2.x UNet's text encoder; the {} model {}",
                  cluster.Where("lora.train_text_encoder"), model.name(),
                  s.pooled_text_dim > 0 ? "is SDXL's, whose two text encoders are not trained here"
                                        : "takes no text");
  }
  // The encoder runs on the CPU beside the model, its texts whole on every rank.
  return RefuseSettings("lora.train_text_encoder",
                        "the text encoder's adapters train data parallel",
                        {{"parallel.cp > 1", parallel.cp > 1}});
}

Status TrainConfig::ValidateTextualInversion() const {
  DT_RETURN_IF_ERROR(textual_inversion.Validate());
  const SampleSchema s = FamilyOf(model).Samples(model);
  if (model.family != "unet" || s.context_length == 0 || s.pooled_text_dim > 0) {
    return Errorf(
        "textual_inversion: trains a token for the Stable Diffusion 1.x/2.x UNet's text encoder; "
        "the {} model {}",
        model.name(),
        s.pooled_text_dim > 0 ? "is SDXL's, whose two text encoders are not trained here"
                              : "takes no text");
  }
  // The vectors are one replicated arena, as LoRA's adapters; the text encoder runs on the CPU.
  return RefuseSettings(
      "textual_inversion.token",
      "textual_inversion trains on the CPU, data parallel, without lora or a prior",
      {{"lora", lora.enabled()},
       {"data.prior_path", data.has_prior()},
       {"parallel.tp > 1", parallel.tp > 1},
       {"parallel.cp > 1", parallel.cp > 1},
       {"parallel.pp > 1", parallel.pp > 1},
       {"parallel.zero1", parallel.zero1},
       {"train.device cuda", device == "cuda"}});
}

Status TrainConfig::ValidatePrior() const {
  if (!(data.prior_loss_weight >= 0 && std::isfinite(data.prior_loss_weight))) {
    return Errorf("data.prior_loss_weight: expected a number >= 0, found {}",
                  data.prior_loss_weight);
  }
  if (!data.has_prior()) return Status::Ok();
  if (micro_batch % 2 != 0) {
    return Errorf(
        "batch.micro: with data.prior_path every micro-batch is half the data's samples and half "
        "the prior's: expected an even number, found {}",
        micro_batch);
  }
  if (learn_sigma_loss) {
    return Status::Error(
        "data.prior_path: prior preservation weighs the MSE objective; not with "
        "diffusion.learn_sigma_loss (set it false to train the noise alone)");
  }
  return Status::Ok();
}

Status TrainConfig::Validate(int dp) const {
  DT_RETURN_IF_ERROR(ModelSpecFromJson(model.family, model.config).status());
  DT_RETURN_IF_ERROR(diffusion.Validate());
  DT_RETURN_IF_ERROR(optimizer.Validate());
  DT_RETURN_IF_ERROR(lora.Validate());
  if (data.kind == "image_folder") {
    return Status::Error(
        "data.kind: image_folder is read by `difftrain data pack`, not by training: pack the "
        "images into a latent_folder (through a VAE with --vae for latents) and train on that");
  }
  if (data.kind != "synthetic" && data.kind != "fashion_mnist" &&
      data.kind != "moving_fashion_mnist" && data.kind != "latent_folder") {
    return Errorf(
        "data.kind: unknown dataset '{}' (expected synthetic, fashion_mnist, "
        "moving_fashion_mnist or latent_folder)",
        data.kind);
  }
  if (data.kind == "latent_folder" && data.path.empty()) {
    return Status::Error("data.path: required for data.kind latent_folder");
  }
  if (data.max_samples < 0)
    return Errorf("data.max_samples: expected a count >= 0 (0: all), found {}", data.max_samples);
  DT_RETURN_IF_ERROR(ValidatePrior());
  if (const SampleSchema s = FamilyOf(model).Samples(model); s.height != s.width) {
    return Errorf(
        "model: the {} model's samples are {}x{} (height x width): difftrain trains square "
        "samples; other sizes are for sampling (`difftrain sample --height --width`)",
        model.name(), s.height, s.width);
  }
  if (const int c = FamilyOf(model).Samples(model).conditioning_channels; c > 0) {
    return Errorf(
        "model: the {} model takes {} conditioning channels besides the {} it samples (an "
        "inpainting UNet: in_channels > out_channels), which difftrain samples from (`difftrain "
        "sample --mask`) but does not train",
        model.name(), c, FamilyOf(model).Samples(model).channels);
  }
  if (learn_sigma_loss && !FamilyOf(model).Samples(model).learn_sigma()) {
    return Status::Error(
        "diffusion.learn_sigma_loss needs model.learn_sigma: true (the variance channels)");
  }
  if (learn_sigma_loss && diffusion.prediction != "epsilon") {
    return Status::Error("diffusion.learn_sigma_loss is for epsilon-prediction");
  }
  if (recompute && !FamilyOf(model).recomputes()) {
    return Errorf("train.recompute: the {} family does not implement activation recomputation",
                  model.family);
  }
  if (micro_batch < 1) return Errorf("batch.micro must be positive, got {}", micro_batch);
  if (global_batch < 1) return Errorf("batch.global must be positive, got {}", global_batch);
  if (global_batch % (int64_t{micro_batch} * dp) != 0) {
    return Errorf(
        "{}: batch.global: expected a multiple of batch.micro × data-parallel size = {} × {} = "
        "{} (global = micro × dp × accumulation steps), found {}",
        cluster.Where("batch.global"), micro_batch, dp, int64_t{micro_batch} * dp, global_batch);
  }
  // Steps of 0 with epochs: not resolved yet (ResolveEpochs).
  if (steps < 1 && epochs < 1) return Errorf("train.steps must be positive, got {}", steps);
  if (log_every < 1) return Errorf("train.log_every must be positive, got {}", log_every);
  for (auto [field, v] : {std::pair{"tp", parallel.tp}, {"cp", parallel.cp}, {"pp", parallel.pp}}) {
    if (v < 1) return Errorf("parallel.{} must be positive, got {}", field, v);
  }
  if (parallel.dp < 0)
    return Errorf("parallel.dp must be positive (or 0: derived), got {}", parallel.dp);
  if (!(parallel.bucket_mb > 0)) {
    return Errorf("parallel.bucket_mb must be positive, got {}", parallel.bucket_mb);
  }
  if (!(parallel.timeout_seconds > 0)) {
    return Errorf("parallel.timeout_seconds must be positive, got {}", parallel.timeout_seconds);
  }
  if (parallel.backend != "gloo" && parallel.backend != "mpi") {
    return Errorf("{}: parallel.backend: expected gloo or mpi, found '{}'",
                  cluster.Where("parallel.backend"), parallel.backend);
  }
  if (checkpoint.every < 0)
    return Errorf("checkpoint.every must be >= 0, got {}", checkpoint.every);
  if (checkpoint.keep < 1) return Errorf("checkpoint.keep must be >= 1, got {}", checkpoint.keep);
  if (device != "cpu" && device != "cuda" && device != "auto") {
    return Errorf("{}: train.device: expected auto, cpu or cuda, found '{}'",
                  cluster.Where("train.device"), device);
  }
  if (precision != "bf16" && precision != "fp8") {
    return Errorf("{}: train.precision: expected bf16 or fp8, found '{}'",
                  cluster.Where("train.precision"), precision);
  }
  if (precision == "fp8" && !FamilyOf(model).trains_fp8()) {
    return Errorf("train.precision fp8: the {} family has no FP8 layers (DiT and Latte do)",
                  model.family);
  }
  if (precision == "fp8" && device == "cpu") {
    return Errorf(
        "{}: train.precision fp8 runs on train.device cuda (FP8 tensor cores, compute capability "
        "8.9 or later); this job trains on the cpu{}",
        cluster.Where("train.precision"),
        device_automatic ? " (train.device auto found no GPU)" : "");
  }
  if (lora.enabled()) {
    DT_RETURN_IF_ERROR(ValidateLora());
  }
  if (textual_inversion.enabled()) {
    DT_RETURN_IF_ERROR(ValidateTextualInversion());
  }
  if (device == "cuda") {
    // What the GPU step does not do yet (docs/cuda.md).
    const std::pair<const char*, bool> unsupported[] = {{"parallel.tp > 1", parallel.tp > 1},
                                                        {"parallel.cp > 1", parallel.cp > 1},
                                                        {"parallel.pp > 1", parallel.pp > 1},
                                                        {"parallel.zero1", parallel.zero1},
                                                        {"train.recompute", recompute}};
    for (const auto& [what, set] : unsupported) {
      if (set) {
        return Errorf("{}: train.device cuda trains data-parallel layouts only; {} runs on the CPU",
                      cluster.Where("train.device"), what);
      }
    }
  }
  return Status::Ok();
}

nlohmann::json TrainConfig::ToJson() const {
  nlohmann::json json = {{"family", model.family},
                         {"model", model.config},
                         {"data",
                          {{"kind", data.kind},
                           {"path", data.path},
                           {"split", data.split},
                           {"shuffle", data.shuffle},
                           {"horizontal_flip", data.horizontal_flip}}},
                         {"diffusion", diffusion.ToJson()},
                         {"learn_sigma_loss", learn_sigma_loss},
                         {"optimizer", optimizer.ToJson()},
                         {"lora", lora.ToJson()},
                         {"batch", {{"micro", micro_batch}, {"global", global_batch}}},
                         {"train",
                          {{"steps", steps},
                           {"seed", seed},
                           {"log_every", log_every},
                           {"metrics_file", metrics_file},
                           {"recompute", recompute},
                           {"device", device},
                           {"precision", precision}}},
                         {"parallel",
                          {{"tp", parallel.tp},
                           {"cp", parallel.cp},
                           {"pp", parallel.pp},
                           {"dp", parallel.dp},
                           {"stage_blocks", parallel.stage_blocks},
                           {"zero1", parallel.zero1},
                           {"overlap", parallel.overlap},
                           {"bucket_mb", parallel.bucket_mb},
                           {"timeout_seconds", parallel.timeout_seconds},
                           {"backend", parallel.backend},
                           {"auto", parallel.automatic}}},
                         {"checkpoint",
                          {{"dir", checkpoint.dir},
                           {"every", checkpoint.every},
                           {"keep", checkpoint.keep},
                           {"init_from", checkpoint.init_from}}}};
  if (data.has_prior()) {
    json["data"]["prior_path"] = data.prior_path;
    json["data"]["prior_loss_weight"] = data.prior_loss_weight;
  }
  if (!tensorboard_dir.empty()) json["train"]["tensorboard_dir"] = tensorboard_dir;
  if (epochs > 0) {
    json["train"]["epochs"] = epochs;
    json["train"]["epoch_samples"] = epoch_samples;
  }
  if (data.max_samples > 0) json["data"]["max_samples"] = data.max_samples;
  if (textual_inversion.enabled()) json["textual_inversion"] = textual_inversion.ToJson();
  return json;
}

Result<TrainConfig> TrainConfig::FromYamlFile(const std::string& path) {
  DT_ASSIGN_OR_RETURN(std::string text, YamlFields::ReadFile(path));
  return FromYamlText(text, path);
}

Result<TrainConfig> TrainConfig::FromYamlText(const std::string& text, const std::string& source) {
  DT_ASSIGN_OR_RETURN(YAML::Node root, YamlFields::LoadText(text, source));
  YamlFields top(source, root, "");
  TrainConfig c;
  DT_ASSIGN_OR_RETURN(c.model, ModelSpecFromYaml(top.Section("model")));

  YamlFields data = top.Section("data");
  data.String("kind", c.data.kind)
      .String("path", c.data.path)
      .String("split", c.data.split)
      .Bool("shuffle", c.data.shuffle)
      .Bool("horizontal_flip", c.data.horizontal_flip)
      .String("prior_path", c.data.prior_path)
      .Double("prior_loss_weight", c.data.prior_loss_weight)
      .Int64("max_samples", c.data.max_samples);
  DT_RETURN_IF_ERROR(data.Finish());

  YamlFields diffusion = top.Section("diffusion");
  // DiT trains the variance whenever it has one.
  c.learn_sigma_loss = FamilyOf(c.model).Samples(c.model).learn_sigma();
  diffusion.Bool("learn_sigma_loss", c.learn_sigma_loss)
      .Int("steps", c.diffusion.steps)
      .String("schedule", c.diffusion.schedule)
      .Double("beta_start", c.diffusion.beta_start)
      .Double("beta_end", c.diffusion.beta_end)
      .String("loss_weighting", c.diffusion.loss_weighting)
      .Double("min_snr_gamma", c.diffusion.min_snr_gamma)
      .String("prediction", c.diffusion.prediction)
      .Double("frame_noise_correlation", c.diffusion.frame_noise_correlation)
      .Bool("zero_terminal_snr", c.diffusion.zero_terminal_snr)
      .Double("noise_offset", c.diffusion.noise_offset)
      .Double("input_perturbation", c.diffusion.input_perturbation);
  DT_RETURN_IF_ERROR(diffusion.Finish());
  if (c.diffusion.frame_noise_correlation != 0 && !FamilyOf(c.model).Samples(c.model).video) {
    return Errorf(
        "diffusion.frame_noise_correlation: the {} model's samples are images, not "
        "videos: there are no frames to correlate",
        c.model.name());
  }

  YamlFields opt = top.Section("optimizer");
  opt.Double("lr", c.optimizer.lr)
      .Double("beta1", c.optimizer.beta1)
      .Double("beta2", c.optimizer.beta2)
      .Double("eps", c.optimizer.eps)
      .Double("weight_decay", c.optimizer.weight_decay)
      .Int64("warmup_steps", c.optimizer.warmup_steps)
      .String("lr_schedule", c.optimizer.lr_schedule)
      .Double("grad_clip", c.optimizer.grad_clip)
      .Double("ema_decay", c.optimizer.ema_decay)
      .String("ema_schedule", c.optimizer.ema_schedule)
      .Int64("lr_num_cycles", c.optimizer.lr_num_cycles)
      .Double("lr_power", c.optimizer.lr_power)
      .Double("ema_inv_gamma", c.optimizer.ema_inv_gamma)
      .Double("ema_power", c.optimizer.ema_power);
  bool scale_lr = false;
  opt.Bool("scale_lr", scale_lr);
  DT_RETURN_IF_ERROR(opt.Finish());

  YamlFields lora = top.Section("lora");
  lora.Int("rank", c.lora.rank)
      .Double("alpha", c.lora.alpha)
      .StringList("targets", c.lora.targets)
      .Bool("use_dora", c.lora.use_dora)
      .Bool("use_rslora", c.lora.use_rslora)
      .Bool("train_text_encoder", c.lora.train_text_encoder)
      .StringList("text_encoder_targets", c.lora.text_encoder_targets)
      .String("text_encoder", c.lora.text_encoder);
  DT_RETURN_IF_ERROR(lora.Finish());
  if (top.Has("lora") && !lora.Has("rank")) {
    return top.ErrorAt("lora", "lora.rank: required (the adapters' rank, e.g. 4)");
  }

  YamlFields inversion = top.Section("textual_inversion");
  inversion.String("token", c.textual_inversion.token)
      .String("initializer_token", c.textual_inversion.initializer_token)
      .Int("vectors", c.textual_inversion.vectors)
      .String("text_encoder", c.textual_inversion.text_encoder)
      .StringList("templates", c.textual_inversion.templates);
  DT_RETURN_IF_ERROR(inversion.Finish());
  if (top.Has("textual_inversion") && !inversion.Has("token")) {
    return top.ErrorAt("textual_inversion",
                       "textual_inversion.token: required (the new token, e.g. <cat-toy>)");
  }

  YamlFields batch = top.Section("batch");
  batch.Int("micro", c.micro_batch);
  c.global_batch = c.micro_batch;  // default: no accumulation
  batch.Int("global", c.global_batch);
  DT_RETURN_IF_ERROR(batch.Finish());
  if (scale_lr) {
    // diffusers' --scale_lr: lr × accumulation × train_batch_size × processes, the samples of
    // a step, of which a prior's half is not counted (train_dreambooth.py's batch is the
    // instance images'). Applied here, once: the job's lr is the scaled one from then on.
    c.optimizer.lr *= static_cast<double>(c.global_batch) / (c.data.has_prior() ? 2.0 : 1.0);
  }

  YamlFields train = top.Section("train");
  int64_t seed = 0;
  c.device = "auto";  // a job file's default, resolved with the layout (ResolveJob)
  train.Int64("steps", c.steps)
      .Int64("epochs", c.epochs)
      .Int64("seed", seed)
      .Int("log_every", c.log_every)
      .String("metrics_file", c.metrics_file)
      .String("tensorboard_dir", c.tensorboard_dir)
      .Bool("recompute", c.recompute)
      .String("device", c.device)
      .String("precision", c.precision);
  c.seed = static_cast<uint64_t>(seed);
  DT_RETURN_IF_ERROR(train.Finish());
  if (train.Has("epochs")) {
    // diffusers' --num_train_epochs; its steps depend on the data, read where it can be.
    if (train.Has("steps")) {
      return train.ErrorAt("epochs", "give train.steps or train.epochs, not both");
    }
    if (c.epochs < 1) {
      return train.ErrorAt("epochs",
                           fmt::format("expected a positive number of epochs, found {}", c.epochs));
    }
    c.steps = 0;
  }

  // `parallel: auto`: the planner chooses the layout once the cluster section is read.
  YamlFields parallel = top.Section("parallel");
  c.parallel.automatic =
      top.Has("parallel") && root["parallel"].IsScalar() && root["parallel"].Scalar() == "auto";
  if (c.parallel.automatic) {
    c.cluster.where["parallel"] = top.Location("parallel");
    parallel = YamlFields(source, YAML::Node(), "parallel");
  } else if (top.Has("parallel") && root["parallel"].IsScalar()) {
    return top.ErrorAt("parallel", fmt::format("expected a mapping of fields or 'auto', found '{}'",
                                               root["parallel"].Scalar()));
  }
  parallel.Int("tp", c.parallel.tp)
      .Int("cp", c.parallel.cp)
      .Int("pp", c.parallel.pp)
      .Int("dp", c.parallel.dp)
      .IntList("stage_blocks", c.parallel.stage_blocks)
      .Bool("zero1", c.parallel.zero1)
      .Bool("overlap", c.parallel.overlap)
      .Double("bucket_mb", c.parallel.bucket_mb)
      .Double("timeout_seconds", c.parallel.timeout_seconds)
      .String("backend", c.parallel.backend);
  DT_RETURN_IF_ERROR(parallel.Finish());

  YamlFields ckpt = top.Section("checkpoint");
  ckpt.String("dir", c.checkpoint.dir)
      .Int64("every", c.checkpoint.every)
      .Int("keep", c.checkpoint.keep)
      .String("init_from", c.checkpoint.init_from);
  DT_RETURN_IF_ERROR(ckpt.Finish());

  // The fields that are checked against each other later (the batch arithmetic, the
  // layout), located so that those errors point into the file as well.
  c.cluster.Locate(top.Section("model"), "model", {"num_heads", "hidden_size"});
  c.cluster.Locate(batch, "batch", {"micro", "global"});
  c.cluster.Locate(parallel, "parallel", {"tp", "backend"});
  c.cluster.Locate(train, "train", {"device", "precision", "epochs"});
  c.cluster.Locate(ckpt, "checkpoint", {"init_from"});
  c.cluster.Locate(lora, "lora", {"rank", "targets", "train_text_encoder"});
  c.cluster.Locate(inversion, "textual_inversion", {"token"});
  DT_RETURN_IF_ERROR(ReadClusterConfig(top, c.cluster));
  DT_RETURN_IF_ERROR(top.Finish());
  c.micro_batch_given = batch.Has("micro");
  // A `parallel: auto` job is checked once its layout is chosen (ResolveJob).
  if (c.parallel.automatic) return c;
  Status valid = c.Validate();
  // Errors located in the file already name it.
  if (!valid.ok()) return valid.message().starts_with(source) ? valid : valid.WithContext(source);
  return c;
}

namespace {

#ifdef DIFFTRAIN_HAVE_CUDA
constexpr bool kCudaBackend = true;
#else
constexpr bool kCudaBackend = false;
#endif

}  // namespace

Status ResolveJob(TrainConfig& c, const PlanDevice& device) {
  // train.device auto, as torch users write `"cuda" if torch.cuda.is_available() else "cpu"`:
  // the GPU wherever there is one to train on. What the GPU step does not train (tp, cp, pp,
  // ZeRO-1, recompute) is then refused by Validate, naming train.device, rather than run on
  // the CPU of a GPU machine unannounced; `parallel: auto` plans data-parallel layouts for it.
  if (c.device == "auto") c.device_automatic = true;
  if (c.device_automatic) c.device = !device.gpu.empty() && kCudaBackend ? "cuda" : "cpu";
  if (!c.parallel.automatic) return c.device_automatic ? c.Validate() : Status::Ok();
  if (c.lora.enabled() || c.textual_inversion.enabled()) {
    // The planner's memory and time models are of whole-model training.
    return Errorf(
        "{}: parallel: auto plans whole-model training; a {} job names its layout "
        "(parallel: {{dp: N}}, or none for one process)",
        c.cluster.Where("parallel"), c.lora.enabled() ? "lora" : "textual_inversion");
  }
  if (c.data.has_prior() && !c.micro_batch_given) {
    // The planner's micro-batches are any divisor; a prior's halves need an even one.
    return Errorf(
        "{}: parallel: auto with data.prior_path needs batch.micro, an even number (half of "
        "each micro-batch is the prior's)",
        c.cluster.Where("batch.micro"));
  }
  const std::optional<int> micro =
      c.micro_batch_given ? std::optional<int>(c.micro_batch) : std::nullopt;
  Result<PlannedLayout> chosen =
      ChooseLayout(c.model, c.global_batch, micro, c.cluster.nodes, c.cluster.devices_per_node,
                   device, /*data_parallel_only=*/c.device == "cuda",
                   /*fp8=*/c.device == "cuda" && c.precision == "fp8");
  if (!chosen.ok()) {
    return Errorf("{}: parallel: auto for {} node(s) x {} device(s) ({}): {}",
                  c.cluster.Where("parallel"), c.cluster.nodes, c.cluster.devices_per_node,
                  DescribePlanDevice(device), chosen.status().message());
  }
  const Layout& l = chosen->layout;
  c.parallel.tp = l.tp;
  c.parallel.cp = l.cp;
  c.parallel.pp = l.pp;
  c.parallel.dp = l.dp;
  c.parallel.zero1 = l.zero1;
  c.recompute = l.recompute;
  c.micro_batch = l.micro_batch;
  return c.Validate(l.dp);
}

Result<std::string> ResolvedJobYaml(const std::string& original_yaml, const TrainConfig& c) {
  YAML::Node root;
  try {
    root = YAML::Load(original_yaml);
  } catch (const YAML::Exception& e) {
    return Errorf("the job file is not YAML: {}", e.what());
  }
  if (!root.IsMap()) return Status::Error("the job file is not a mapping of sections");
  // Each section is rebuilt as a mapping with the resolved values over the user's own.
  auto section = [&root](const char* name) {
    if (!root[name] || !root[name].IsMap()) root[name] = YAML::Node(YAML::NodeType::Map);
    return root[name];
  };
  YAML::Node cluster = section("cluster");
  cluster["nodes"] = c.cluster.nodes;
  cluster["devices_per_node"] = c.cluster.devices_per_node;
  YAML::Node parallel = section("parallel");
  parallel["tp"] = c.parallel.tp;
  parallel["cp"] = c.parallel.cp;
  parallel["pp"] = c.parallel.pp;
  parallel["dp"] = c.parallel.dp;
  parallel["zero1"] = c.parallel.zero1;
  section("batch")["micro"] = c.micro_batch;
  section("train")["recompute"] = c.recompute;
  section("train")["device"] = c.device;
  // Epochs resolved where the job was launched arrive as steps; otherwise each rank resolves
  // them from the data it reads.
  const bool epochs_resolved = c.epochs > 0 && c.steps > 0;
  if (epochs_resolved) {
    section("train").remove("epochs");
    section("train")["steps"] = c.steps;
  }
  YAML::Emitter out;
  out << root;
  if (!out.good()) return Errorf("writing the resolved job: {}", out.GetLastError());
  std::string text;
  if (c.parallel.automatic) {
    text = fmt::format("# parallel: auto, resolved by the controller: {}\n",
                       "tp, cp, pp, dp, zero1, batch.micro and train.recompute");
  }
  if (c.device_automatic) text += "# train.device: auto, resolved by the controller\n";
  if (epochs_resolved) {
    text += fmt::format(
        "# train.epochs: {}, resolved by the controller: {} samples an epoch, {} steps\n", c.epochs,
        c.epoch_samples, c.steps);
  }
  return text + out.c_str() + "\n";
}

}  // namespace difftrain
