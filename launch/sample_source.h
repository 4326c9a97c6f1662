// What `difftrain sample` samples from (launch/sample_command.cc): a difftrain checkpoint,
// whose metadata says the model and the diffusion, or pretrained weights (--pretrained: DiT's
// released weights as safetensors, a diffusers UNet folder or pipeline, another run's
// checkpoint) with the model and diffusion given on the command line, or read from the
// diffusers folder the weights are in.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/diffusion/dpm_solver.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/diffusion/timestep_spacing.h"
#include "model/diffusion/unipc.h"
#include "model/family/family.h"
#include "model/family/model.h"
#include "model/io/safetensors.h"
#include "model/train/lora_adapters.h"

namespace difftrain::launch {

struct SampleSource {
  std::string path;                         // the step directory, or the pretrained weights file
  int64_t step = -1;                        // the checkpoint's step; -1 for pretrained weights
  std::optional<io::SafetensorsFile> file;  // rank 0's shard, or the weights file
  bool pretrained = false;
  ModelSpec model;
  DiffusionConfig diffusion;
  std::string data_kind;  // the dataset it was trained on ("" if unknown)
  std::string data_path;
  // Pretrained weights in a diffusers pipeline's unet/ (transformer/): the pipeline's folder, whose
  // text_encoder/ and vae/ sampling takes by default.
  std::string pipeline;
  // The pipeline's scheduler: its timestep spacing, which sampling follows by default, and
  // its _class_name (DDIMScheduler, PNDMScheduler …; "" without one).
  std::optional<TimestepSpacing> spacing;
  std::string scheduler_class;
  // Its scheduler_config.json ({} without one): the DPM-Solver++ and UniPC samplers read their
  // options from it, as the class chosen would take them from_config.
  nlohmann::json scheduler_config = nlohmann::json::object();
  // An SDXL pipeline guides with zeros where no negative prompt is given, unless its
  // model_index.json says force_zeros_for_empty_prompt false (the refiner's): then with the
  // empty prompt's embeddings.
  bool zeros_for_empty_prompt = true;
  // A DiTPipeline's class names (model_index.json's id2label, each of its comma-separated
  // synonyms, as DiTPipeline.get_label_ids reads them) and their numbers; empty without.
  std::map<std::string, int> class_names;
  // Pretrained weights in an original Stable Diffusion checkpoint (model/io/ldm_checkpoint.h):
  // its UNet's config read from its tensors, the scheduler diffusers' from_single_file gives
  // it; and whether it holds a VAE, which sampling takes by default.
  bool single_file = false;
  bool single_file_vae = false;
  // A textual inversion's checkpoint (model/train/textual_inversion.h): its token ("" otherwise);
  // the vectors are the shard's.
  std::string inversion_token;
  // A LoRA checkpoint that adapted the text encoder too (lora.train_text_encoder): its config;
  // the adapters are the shard's. Unset otherwise.
  std::optional<LoraConfig> text_lora;
  // The text encoder a textual inversion or a text encoder LoRA trained through ("" otherwise).
  std::string trained_text_encoder;
};

// What a diffusers folder says beside the weights file `weights`: the model, from a
// UNet2DConditionModel's or DiT's Transformer2DModel's config.json beside it (a family's
// FromDiffusersConfig); where that folder is a pipeline's unet/ or transformer/
// (the folder above holds model_index.json), the pipeline's folder; and where the folder above
// it holds scheduler/scheduler_config.json (a pipeline, or `difftrain export`'s UNet), the
// diffusion and timestep spacing it describes. Each is empty where the files are
// not there; a file that is there and says what difftrain does not implement is an error
// naming it.
struct DiffusersFolder {
  std::optional<ModelSpec> model;
  std::optional<DiffusionConfig> diffusion;
  std::optional<TimestepSpacing> spacing;
  std::string scheduler_class;
  nlohmann::json scheduler_config = nlohmann::json::object();
  std::string pipeline;
  bool zeros_for_empty_prompt = true;      // model_index.json's force_zeros_for_empty_prompt
  std::map<std::string, int> class_names;  // its id2label's (SampleSource::class_names)
};
Result<DiffusersFolder> ReadDiffusersFolder(const std::string& weights);

// A checkpoint directory (its newest complete step) or one step directory: rank 0's shard,
// the model from its `config` metadata and the diffusion from its `train` metadata.
Result<SampleSource> LoadCheckpointSource(const std::string& path);

// Weights at `path` (the forms checkpoint.init_from takes: docs/job-spec.md) for `model`,
// sampled with `diffusion`; where either is not given, the diffusers folder's (above) or an
// original Stable Diffusion checkpoint's (its UNet from its tensors, diffusers' single-file
// DDIM scheduler), the model required, the diffusion DiT's defaults without a scheduler
// config. `latent_size`
// (the size flags given alone) resizes the folder's model (its sample_size) where the folder
// has one, in place of `model`. The file is read whole; its tensors are
// checked when the model is filled (FillModelWeights).
Result<SampleSource> LoadPretrainedSource(const std::string& path, std::optional<ModelSpec> model,
                                          std::optional<DiffusionConfig> diffusion,
                                          std::optional<int> latent_size = std::nullopt);

// Fills `model`'s whole parameter arena with the source's weights: a checkpoint shard's
// EMA (`ema`) or trained weights; pretrained weights as they are (a difftrain shard among them
// gives its EMA or weights alike). Errors name the file and what does not match.
Status FillModelWeights(const SampleSource& source, bool ema, Model& model);

// --classes as numbers: each a number, or a name of the source's class_names. Errors name the
// one that is neither, with a few of the names there are.
Result<std::vector<int>> ClassNumbers(const std::vector<std::string>& classes,
                                      const SampleSource& source);

}  // namespace difftrain::launch
