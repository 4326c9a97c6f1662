// A run's first weights from a file (checkpoint.init_from, docs/job-spec.md): fine-tuning from
// pretrained weights — a diffusers UNet2DConditionModel folder, DiT's released weights saved
// as safetensors or in diffusers' form (DiTPipeline's transformer/), another run's difftrain
// checkpoint — instead of the seed's initialisation.
// A run that resumes its own checkpoint never reads it: resuming wins.
//
// Tensors are matched by the reference state-dict names every family already uses (DiT's,
// Latte's, diffusers' for the UNet; docs/formats.md), a UNet's also by the names of an original
// Stable Diffusion checkpoint (model/io/ldm_checkpoint.h), a DiT's also by a diffusers
// Transformer2DModel's (model/io/diffusers_dit.h), and must have the model's shapes; any
// floating-point dtype is taken (F16, BF16, F32 exactly, F64 rounded). Tensors the model does
// not have are left alone and named in a warning; a missing or misshapen one is an error.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/family/family.h"
#include "model/io/safetensors.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

// The safetensors file `path` names: the file itself; in a directory, diffusers' weights
// (diffusion_pytorch_model.safetensors, else its .fp16 variant; in the directory or its unet/
// or transformer/, as a pipeline's folder holds them), else shard 0 of the newest complete
// checkpoint when the directory is a difftrain checkpoint directory, or shard 0 of the step a step
// directory
// (`.../step-00000020`) holds. The error says what was looked for.
Result<std::string> InitialWeightsFile(const std::string& path);

// The model's table `global` under the names `file` uses: an original Stable Diffusion
// checkpoint's for a UNet's (SpelledAsTheFile), else as it is; laid out alike.
Result<TensorTable> SpelledAsTheFile(const io::SafetensorsFile& file, const TensorTable& global);

// Whether `file` (its header suffices) holds every tensor of `global`, the whole model's
// parameters, under its name and shape as a floating-point tensor. The error names the file,
// how many are missing or misshapen, and the first few. Returns the file's tensors the model
// does not take: not in `global`, not in `ignored` (the model's fixed tensors, computed from
// its config) and, in a difftrain checkpoint shard, not its EMA and optimizer state.
Result<std::vector<std::string>> CheckInitialWeights(const io::SafetensorsFile& file,
                                                     const TensorTable& global,
                                                     const std::vector<std::string>& ignored = {});

// Reads `file`, once CheckInitialWeights passed it, into two whole-model arenas laid out as
// `global` (a tensor it would refuse is an error naming that tensor alone): the weights, and
// the EMA's start. A difftrain checkpoint shard gives its weights and its EMA; any other file
// its weights to both, as DiT's train.py starts the EMA from the model.
Status ReadInitialWeights(const io::SafetensorsFile& file, const TensorTable& global, float* params,
                          float* ema);

// The same into one arena: a difftrain checkpoint shard's EMA (`ema`) or weights, any other
// file's weights (what sampling from pretrained weights reads, without a second arena).
Status ReadPretrainedWeights(const io::SafetensorsFile& file, const TensorTable& global, bool ema,
                             float* params);

// An inference model's weights (the VAE, a text encoder) from `file`: the tensors of `spelled`
// (the model's table under the names the file uses), checked as CheckInitialWeights checks
// them, into one arena laid out as `spelled`. The file's tensors the model does not use are
// named in an info line of `what` (e.g. "VAE 'path'").
Result<std::vector<float>> ReadInferenceWeights(const io::SafetensorsFile& file,
                                                const TensorTable& spelled,
                                                const std::string& what);

// The config.json beside an inference model's weights, as JSON. Errors name the model
// (`kind` "VAE", "text encoder", and its `path`), the file, and who writes it (`writer`:
// "diffusers", "transformers").
Result<nlohmann::json> ReadModelConfigJson(const std::string& kind, const std::string& path,
                                           const std::string& config, const char* writer);

// The launcher's check of a job's init_from against its model (header only, no model built):
// the path resolves and the file holds the model's tensors.
Status CheckInitialWeightsForModel(const ModelSpec& model, const std::string& path);

}  // namespace difftrain
