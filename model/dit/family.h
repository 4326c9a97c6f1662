// The transformer families over the DiT core (model/dit/dit.h), as model families
// (model/family/family.h): DiT itself (images; the named configs DiT-S/B/L/XL × 2/4/8 and
// `custom` shapes) and, built on the same class, Latte (videos; model/latte/family.h). Both
// take every parallel layout of model/dit/shard.h and the reference state-dict names.
#pragma once

#include <memory>
#include <string>

#include "model/dit/config.h"
#include "model/family/family.h"

namespace difftrain {

const ModelFamily& DiTFamily();

// What sets one transformer family apart from another.
struct TransformerFamilyKind {
  std::string name;          // the family ("dit")
  std::string prefix;        // of its named configs ("DiT": DiT-XL/2)
  std::string custom_name;   // of a config with every shape field given ("custom")
  std::string default_name;  // when a job's model section names none
  bool video = false;        // Latte: num_frames, alternating spatial and temporal blocks
};
// Both train on a GPU (train.device cuda) through the bf16 cuda::DiT of model/dit/cuda.
// A family of that kind; the caller keeps it for the program's life.
std::unique_ptr<ModelFamily> MakeTransformerFamily(TransformerFamilyKind kind);

// The spec of a DiT or Latte config (its family from config.video), and back; a spec of
// another family fails fast.
ModelSpec DiTSpec(const DiTConfig& config);
DiTConfig DiTConfigOf(const ModelSpec& spec);

}  // namespace difftrain
