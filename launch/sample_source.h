// What `difftrain sample` samples from (launch/sample_command.cc): a difftrain checkpoint,
// whose metadata says the model and the diffusion, or pretrained weights (--pretrained: DiT's
// released weights as safetensors, a diffusers UNet folder, another run's checkpoint) with the
// model and diffusion given on the command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/family/family.h"
#include "model/family/model.h"
#include "model/io/safetensors.h"

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
};

// A checkpoint directory (its newest complete step) or one step directory: rank 0's shard,
// the model from its `config` metadata and the diffusion from its `train` metadata.
Result<SampleSource> LoadCheckpointSource(const std::string& path);

// Weights at `path` (the forms checkpoint.init_from takes: docs/job-spec.md) for `model`,
// sampled with `diffusion`. The file is read whole; its tensors are checked when the model is
// filled (FillModelWeights).
Result<SampleSource> LoadPretrainedSource(const std::string& path, ModelSpec model,
                                          DiffusionConfig diffusion);

// Fills `model`'s whole parameter arena with the source's weights: a checkpoint shard's
// EMA (`ema`) or trained weights; pretrained weights as they are (a difftrain shard among them
// gives its EMA or weights alike). Errors name the file and what does not match.
Status FillModelWeights(const SampleSource& source, bool ema, Model& model);

}  // namespace difftrain::launch
