// A DiT config in diffusers' form: the config.json of the Transformer2DModel (norm_type
// "ada_norm_zero") that DiTPipeline keeps in transformer/, both ways (docs/export.md). The
// tensors' names: model/io/diffusers_dit.h.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/dit/config.h"

namespace difftrain {

// The config.json of `c` as diffusers 0.27.2 writes a DiT's. Refused, by name, where diffusers'
// DiT cannot hold the model: a video model, an MLP other than 4× wide, no labels, or no null
// class (diffusers' class embedder always has one).
Result<nlohmann::json> DiffusersDitConfig(const DiTConfig& c);

// The DiT a diffusers config.json describes (named, as DiT-XL/2, where it is a named config's
// shape): nullopt where it is not a DiT's (another class, or a Transformer2DModel that does
// not take patches with adaLN-Zero); an error naming the key where it is one difftrain's DiT
// differs from.
Result<std::optional<DiTConfig>> DiTConfigFromDiffusers(const nlohmann::json& config);

}  // namespace difftrain
