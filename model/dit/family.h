// DiT as a model family (model/family/family.h): the named configs DiT-S/B/L/XL × 2/4/8 and
// `custom` shapes, the reference state-dict names, every parallel layout (model/dit/shard.h).
#pragma once

#include "model/dit/config.h"
#include "model/family/family.h"

namespace difftrain {

const ModelFamily& DiTFamily();

// The spec of a DiT config, and back (a spec of another family fails fast).
ModelSpec DiTSpec(const DiTConfig& config);
DiTConfig DiTConfigOf(const ModelSpec& spec);

}  // namespace difftrain
