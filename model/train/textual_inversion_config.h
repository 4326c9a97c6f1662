// A textual inversion's settings (the job's `textual_inversion` section), apart from its
// training (model/train/textual_inversion.h), for the job parser and the planner.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain {

// A textual inversion's checkpoint: its vectors [vectors, D] (and "ema." + that), and the
// shard's metadata key holding its config (ToJson, text_encoder as resolved).
inline constexpr std::string_view kInversionVectors = "textual_inversion.vectors";
inline constexpr std::string_view kInversionMetadata = "textual_inversion";

struct TextualInversionConfig {
  std::string token;              // the script's --placeholder_token; "": no textual inversion
  std::string initializer_token;  // --initializer_token
  int vectors = 1;                // --num_vectors
  // The text encoder (a diffusers pipeline's folder, or its text_encoder/); "": the one the
  // data's text table records (data pack --text-encoder).
  std::string text_encoder;
  // Prompt templates, each with one "{}" for the tokens; empty: the data's captions, which
  // name the token.
  std::vector<std::string> templates;

  bool enabled() const { return !token.empty(); }
  Status Validate() const;
  nlohmann::json ToJson() const;
};

}  // namespace difftrain
