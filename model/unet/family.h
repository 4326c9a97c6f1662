// The Stable Diffusion UNet as a model family (model/family/family.h): the named configs SD1.5,
// SD2-base and SD2-v and custom UNets (`name: unet` with diffusers' UNet2DConditionModel keys),
// diffusers' state-dict names, data-parallel layouts only.
#pragma once

#include "model/family/family.h"
#include "model/unet/config.h"

namespace difftrain {

const ModelFamily& UNetFamily();

// The spec of a UNet config, and back (a spec of another family fails fast).
ModelSpec UNetSpec(const UNetConfig& config);
UNetConfig UNetConfigOf(const ModelSpec& spec);

}  // namespace difftrain
