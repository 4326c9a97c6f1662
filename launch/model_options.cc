#include "launch/model_options.h"

namespace difftrain::launch {

void ModelOptions::AddTo(CLI::App& app) {
  app.add_option("--model", model_, "DiT-S|B|L|XL/2|4|8, or 'custom' with every shape flag")
      ->capture_default_str();
  app.add_option("--image-size", image_size_, "image side in pixels (latents are 8x smaller)");
  app.add_option("--input-size", input_size_, "latent side (default 32: 256 px images)");
  app.add_option("--patch", patch_, "patch size");
  app.add_option("--in-channels", in_channels_, "input channels (4 for SD-VAE latents)");
  app.add_option("--hidden", hidden_, "hidden size D");
  app.add_option("--depth", depth_, "number of DiT blocks");
  app.add_option("--heads", heads_, "attention heads");
  app.add_option("--mlp-ratio", mlp_ratio_, "MLP hidden size / D");
  app.add_option("--num-classes", num_classes_, "class labels");
  app.add_option("--class-dropout", class_dropout_, "label dropout probability (CFG)");
  app.add_option("--learn-sigma", learn_sigma_, "predict the variance too (2x output channels)");
}

Result<DiTConfig> ModelOptions::Build() const {
  if (image_size_ && input_size_)
    return Status::Error("give --image-size or --input-size, not both");
  int input_size = input_size_.value_or(32);
  if (image_size_) {
    if (*image_size_ <= 0 || *image_size_ % kVaeDownsample != 0) {
      return Errorf("--image-size must be a positive multiple of {}, got {}", kVaeDownsample,
                    *image_size_);
    }
    input_size = *image_size_ / kVaeDownsample;
  }
  DiTConfig c;
  if (model_ == "custom") {
    if (!patch_ || !hidden_ || !depth_ || !heads_) {
      return Status::Error("--model custom needs --patch, --hidden, --depth and --heads");
    }
    c.input_size = input_size;
  } else {
    Result<DiTConfig> named = DiTConfigByName(model_, input_size);
    if (!named.ok()) return named.status().WithContext("--model");
    c = *named;
  }
  const bool overridden = patch_ || in_channels_ || hidden_ || depth_ || heads_ || mlp_ratio_ ||
                          num_classes_ || class_dropout_ || learn_sigma_;
  if (overridden) c.name = "custom";
  c.patch_size = patch_.value_or(c.patch_size);
  c.in_channels = in_channels_.value_or(c.in_channels);
  c.hidden_size = hidden_.value_or(c.hidden_size);
  c.depth = depth_.value_or(c.depth);
  c.num_heads = heads_.value_or(c.num_heads);
  c.mlp_ratio = mlp_ratio_.value_or(c.mlp_ratio);
  c.num_classes = num_classes_.value_or(c.num_classes);
  c.class_dropout_prob = class_dropout_.value_or(c.class_dropout_prob);
  c.learn_sigma = learn_sigma_.value_or(c.learn_sigma);
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace difftrain::launch
