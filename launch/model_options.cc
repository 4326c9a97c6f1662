#include "launch/model_options.h"

#include <algorithm>

namespace difftrain::launch {

void ModelOptions::AddTo(CLI::App& app) {
  const size_t before = app.get_options().size();
  app.add_option("--model", model_,
                 "a named config (DiT-S|B|L|XL/2|4|8, Latte-S|B|L|XL/2|4|8 …), or a family's "
                 "custom name ('custom' for DiT, 'latte' for Latte) with the shape flags")
      ->capture_default_str();
  app.add_option("--config", config_, "take the model section of this job file (any family)");
  app.add_option("--image-size", image_size_, "image side in pixels (latents are 8x smaller)");
  app.add_option("--input-size", input_size_, "latent side (default 32: 256 px images)");
  app.add_option("--patch", patch_, "patch_size");
  app.add_option("--in-channels", in_channels_, "in_channels (4 for SD-VAE latents)");
  app.add_option("--hidden", hidden_, "hidden_size D");
  app.add_option("--depth", depth_, "depth (blocks)");
  app.add_option("--heads", heads_, "num_heads (attention heads)");
  app.add_option("--mlp-ratio", mlp_ratio_, "mlp_ratio (MLP hidden size / D)");
  app.add_option("--num-classes", num_classes_, "num_classes (class labels; Latte: 0 = none)");
  app.add_option("--frames", frames_, "num_frames (frames per video; Latte)");
  app.add_option("--class-dropout", class_dropout_, "class_dropout_prob (label dropout, CFG)");
  app.add_option("--learn-sigma", learn_sigma_, "learn_sigma (predict the variance too)");
  const std::vector<CLI::Option*> all = app.get_options();
  options_.assign(all.begin() + before, all.end());
}

bool ModelOptions::given() const {
  return std::any_of(options_.begin(), options_.end(),
                     [](const CLI::Option* o) { return o->count() > 0; });
}

std::vector<CLI::Option*> AddDiffusionOptions(CLI::App& app, DiffusionConfig& diffusion) {
  return {
      app.add_option("--schedule", diffusion.schedule,
                     "beta schedule: linear, scaled_linear or cosine")
          ->capture_default_str(),
      app.add_option("--beta-start", diffusion.beta_start)->capture_default_str(),
      app.add_option("--beta-end", diffusion.beta_end)->capture_default_str(),
      app.add_option("--prediction", diffusion.prediction, "what the model predicts: epsilon or v")
          ->capture_default_str(),
      app.add_flag("--zero-terminal-snr", diffusion.zero_terminal_snr,
                   "the schedule rescaled to zero terminal SNR (diffusers' "
                   "rescale_betas_zero_snr; needs --prediction v)")};
}

Result<ModelRequest> ModelOptions::Request() const {
  if (image_size_ && input_size_)
    return Status::Error("give --image-size or --input-size, not both");
  ModelRequest r;
  r.name = model_;
  r.input_size = input_size_;
  if (image_size_) {
    if (*image_size_ <= 0 || *image_size_ % kVaeDownsample != 0) {
      return Errorf("--image-size must be a positive multiple of {}, got {}", kVaeDownsample,
                    *image_size_);
    }
    r.input_size = *image_size_ / kVaeDownsample;
  }
  // Each flag overrides the config field it is named after.
  auto set = [&r](const char* field, const auto& flag) {
    if (flag) r.overrides[field] = *flag;
  };
  set("patch_size", patch_);
  set("in_channels", in_channels_);
  set("hidden_size", hidden_);
  set("depth", depth_);
  set("num_heads", heads_);
  set("mlp_ratio", mlp_ratio_);
  set("num_classes", num_classes_);
  set("num_frames", frames_);
  set("class_dropout_prob", class_dropout_);
  set("learn_sigma", learn_sigma_);
  return r;
}

Result<std::optional<int>> ModelOptions::SizeOnly() const {
  for (const CLI::Option* o : options_) {
    if (o->count() > 0 && o->get_name() != "--image-size" && o->get_name() != "--input-size")
      return std::optional<int>();
  }
  DT_ASSIGN_OR_RETURN(const ModelRequest r, Request());
  return r.input_size;
}

Result<ModelSpec> ModelOptions::Build() const {
  if (!config_.empty()) {
    DT_ASSIGN_OR_RETURN(YAML::Node root, YamlFields::LoadFile(config_));
    YamlFields top(config_, root, "");
    if (!top.Has("model")) return Errorf("{}: the job has no model section", config_);
    return ModelSpecFromYaml(top.Section("model"));
  }
  DT_ASSIGN_OR_RETURN(const ModelRequest r, Request());
  Result<ModelSpec> spec = ModelSpecFromRequest(r);
  if (!spec.ok()) return spec.status().WithContext("--model");
  return spec;
}

Result<std::vector<ModelSpec>> ModelOptions::BuildAllNamed() const {
  DT_ASSIGN_OR_RETURN(const ModelSpec chosen, Build());
  const ModelFamily& family = FamilyOf(chosen);
  DT_ASSIGN_OR_RETURN(const ModelRequest base, Request());
  std::vector<ModelSpec> all;
  for (const std::string& name : family.ConfigNames()) {
    ModelRequest r;
    r.name = name;
    r.input_size = base.input_size;
    DT_ASSIGN_OR_RETURN(ModelSpec spec, family.FromRequest(r));
    all.push_back(std::move(spec));
  }
  return all;
}

}  // namespace difftrain::launch
