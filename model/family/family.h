// A model family (DiT, Latte, the Stable Diffusion UNet) behind one interface: the job spec,
// the trainer, the planner, the checkpoints and every subcommand reach a model only through
// it, so a new family is one folder under model/ and one line in model/family/registry.cc.
//
// A model is named by a ModelSpec: the family's name and its config as JSON, the same JSON
// that checkpoints and debug dumps carry under "config" (for DiT: model/dit/config.h's). The
// spec is a value: copied into jobs, compared when a checkpoint is restored, shipped to ranks.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/yaml_fields.h"
#include "model/family/model.h"

namespace difftrain {

struct TrainConfig;  // job/job_spec.h
class GpuStep;       // model/train/gpu_step.h

struct ModelSpec {
  std::string family;     // "dit"
  nlohmann::json config;  // the family's config, every field explicit

  // The config's name ("DiT-XL/2", "custom").
  std::string name() const;
  bool operator==(const ModelSpec&) const = default;
};

// Parameters and compute of one model (FLOP conventions: docs/metrics.md).
struct ModelCost {
  int64_t parameters = 0;  // as PyTorch's model.parameters() counts them
  int64_t trainable = 0;   // without the fixed tensors
  double forward_macs_per_sample = 0;
  // 3 × forward FLOPs = 6 × forward MACs; recomputation is not counted.
  double training_flops_per_sample() const { return 6 * forward_macs_per_sample; }
};

// What one training sample is, for the data a family trains on: the diffusion target x0 of
// `frames` × channels × height × width (frames 1: an image), a label when the family is
// class-conditional, a text embedding when it is text-conditional.
struct SampleSchema {
  int frames = 1;
  bool video = false;  // samples are videos [frames, C, H, W], even of one frame
  int channels = 4, height = 32, width = 32;
  int out_channels = 4;  // of the model's output, per frame (2 × channels: learned σ)
  // The model's input has these channels after the sampled ones, which the pipeline fills (an
  // inpainting UNet's mask and masked image latents: 1 + channels); 0: none.
  int conditioning_channels = 0;
  int num_classes = 0;       // labels in [0, num_classes); 0: no labels
  double label_dropout = 0;  // probability that a label becomes the null class (num_classes)
  int context_length = 0;    // text embedding [context_length, context_dim]; 0: none
  int context_dim = 0;
  // Probability that a sample's text embedding becomes the unconditional one (all zeros).
  double context_dropout = 0;
  // A guidance-distilled model (an LCM UNet's time_cond_proj_dim) takes the guidance scale as
  // an embedding of this width (ModelInputs::guidance) in place of classifier-free guidance;
  // 0: none.
  int guidance_embedding_dim = 0;
  // SDXL's micro-conditioning: each text also has a pooled embedding of this width
  // (ModelInputs::pooled_text; zeros where the text is dropped), and each sample the time ids
  // `time_ids` (ModelInputs::time_ids: original height, width, crop top, left, target height,
  // width, in pixels; here a whole uncropped image at the model's size; SDXL's refiner has the
  // aesthetic score in place of the target size); 0 and empty: none.
  int pooled_text_dim = 0;
  std::vector<float> time_ids;
  // The time ids end in an aesthetic score in place of the target size (SDXL's refiner: five).
  bool aesthetic_score = false;

  bool learn_sigma() const { return out_channels == 2 * channels; }
  size_t elements() const { return size_t(frames) * channels * height * width; }
  size_t output_elements() const { return size_t(frames) * out_channels * height * width; }
  // Of the model's input: the sampled channels and the conditioning ones.
  size_t input_elements() const {
    return size_t(frames) * (channels + conditioning_channels) * height * width;
  }
};

// A rank's share of a model under a layout: its place, its parameters, its fixed tensors.
struct ModelPartition {
  ModelShard shard;
  int first_block = 0, end_block = 0;  // the stage's blocks (or the family's stage units)
  ShardedParameters parameters;
  size_t fixed_elements = 0;
};

// The knobs of a named config that the command line sets (`--model DiT-XL/2 --image-size
// 256`), and config fields overridden by name (`--depth 2` is {"depth": 2}); a family
// refuses a field it does not have, by name.
struct ModelRequest {
  std::string name;
  std::optional<int> input_size;  // latent side
  nlohmann::json overrides = nlohmann::json::object();
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  virtual std::string_view name() const = 0;
  // The named configs ("DiT-S/2" …).
  virtual std::vector<std::string> ConfigNames() const = 0;
  // The name with which a job or the command line gives every shape field ("custom").
  virtual std::string_view custom_name() const = 0;
  // Whether `config_name` is one of the named configs or the custom name.
  bool Knows(const std::string& config_name) const;

  // The job's model section; errors name the field and its place in the file.
  virtual Result<ModelSpec> FromYaml(YamlFields& fields) const = 0;
  // A named or custom config with the command line's knobs.
  virtual Result<ModelSpec> FromRequest(const ModelRequest& request) const = 0;
  // A config as checkpoints and debug dumps carry it, checked.
  virtual Result<ModelSpec> FromJson(const nlohmann::json& config) const = 0;

  // The same model (the same parameters) sampling at another latent size, height × width; by
  // default an error saying the family samples at its own size only.
  virtual Result<ModelSpec> Resized(const ModelSpec& spec, int height, int width) const;

  // Export (`difftrain export`): the model's config.json in diffusers' form (its class and
  // keys), and the names an original single-file checkpoint gives the tensors named `names`; by
  // default an error saying the family has no such form.
  virtual Result<nlohmann::json> DiffusersConfig(const ModelSpec& spec) const;
  virtual Result<std::vector<std::string>> SingleFileNames(
      const std::vector<std::string>& names) const;
  // The model's folder in a diffusers pipeline ("unet"; DiT's "transformer").
  virtual std::string_view diffusers_component() const { return "unet"; }
  // The tensors of the diffusers form, each cut from one of the model's parameters (`global`:
  // the whole model's table); by default the parameters under their own names.
  struct DiffusersTensor {
    std::string name;
    std::string source;  // the model's parameter
    int64_t first_row = 0;
    int64_t rows = -1;  // -1: all of it
  };
  virtual Result<std::vector<DiffusersTensor>> DiffusersTensors(const TensorTable& global) const;
  // The model a diffusers config.json describes where it is of this family's class (a
  // UNet2DConditionModel, DiT's Transformer2DModel), nullopt where it is not; an error names
  // what the family cannot take.
  virtual Result<std::optional<ModelSpec>> FromDiffusersConfig(const nlohmann::json& config) const {
    return std::optional<ModelSpec>();
  }

  virtual ModelCost Cost(const ModelSpec& spec) const = 0;
  virtual SampleSchema Samples(const ModelSpec& spec) const = 0;

  // Whether the model can be split so; a family that cannot be split along an axis refuses
  // it with a message naming the axis.
  virtual Status ValidateLayout(const ModelSpec& spec, const LayoutShape& layout) const = 0;
  virtual Result<ModelPartition> Partition(const ModelSpec& spec, const LayoutShape& layout,
                                           int tp_rank, int cp_rank, int stage) const = 0;
  // Whether Model::Reserve implements `recompute` (TrainConfig refuses it otherwise).
  virtual bool recomputes() const { return true; }
  // Whether the family's GPU step has FP8 layers (train.precision fp8; TrainConfig refuses it
  // otherwise).
  virtual bool trains_fp8() const { return false; }
  // Bytes of a rank's activation arena: `slots` micro-batches of B in flight.
  virtual size_t ActivationBytes(const ModelSpec& spec, const LayoutShape& layout, int stage, int B,
                                 int slots, bool recompute) const = 0;

  // One rank's model (the whole model: the default layout and coordinates).
  virtual Result<std::unique_ptr<Model>> Create(const ModelSpec& spec,
                                                const LayoutShape& layout = {}, int tp_rank = 0,
                                                int cp_rank = 0, int stage = 0,
                                                const ModelComms& comms = {}) const = 0;
  // A whole model that only runs forward (sampling): the family may leave out its gradient
  // arena (as large as the parameters'), whose Backward then fails a check.
  virtual Result<std::unique_ptr<Model>> CreateForInference(const ModelSpec& spec) const {
    return Create(spec);
  }

  // The family's GPU step (train.device cuda) on GPU `device`; by default, an error saying
  // the family has none.
  virtual Result<std::unique_ptr<GpuStep>> CreateGpuStep(const TrainConfig& config,
                                                         int device) const;
  // What that GPU step allocates on its GPU for micro-batches of B, counted without one: the
  // training state (parameters in fp32 and bf16, gradients, AdamW moments, EMA, fixed
  // embeddings) and the activations. None where the family has no GPU step or the build no
  // CUDA backend (the planner then counts the CPU model's memory).
  struct GpuStepMemory {
    size_t state = 0, activations = 0;
  };
  // fp8: with the FP8 layers' workspace (train.precision fp8, where trains_fp8()).
  virtual std::optional<GpuStepMemory> GpuStepBytes(const ModelSpec& spec, int B,
                                                    bool fp8 = false) const {
    return std::nullopt;
  }
};

// Every family, in registry order (model/family/registry.cc).
const std::vector<const ModelFamily*>& ModelFamilies();
// The family called `name` ("dit"), or an error listing the families.
Result<const ModelFamily*> FindModelFamily(std::string_view name);
// The family of a spec; the spec must come from a family (fails fast otherwise).
const ModelFamily& FamilyOf(const ModelSpec& spec);
// The family that knows a config name ("DiT-XL/2", "custom"), or an error listing the names.
Result<const ModelFamily*> FamilyForConfigName(const std::string& config_name);

// The model section of a job: `name` picks the family (docs/job-spec.md).
Result<ModelSpec> ModelSpecFromYaml(YamlFields fields);
// A checkpoint's or dump's model: `family` (absent in checkpoints written before families
// existed: dit) and its config.
Result<ModelSpec> ModelSpecFromJson(const std::string& family, const nlohmann::json& config);
// `--model NAME` and the knobs.
Result<ModelSpec> ModelSpecFromRequest(const ModelRequest& request);

}  // namespace difftrain
