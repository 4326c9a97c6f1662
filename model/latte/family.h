// Latte (Ma et al.; Vchitect/Latte models/latte.py), the video diffusion transformer, as a
// model family (model/family/family.h): DiT's blocks over a video's frames, even blocks
// spatial (attention within a frame), odd blocks temporal (attention across the frames of
// one token position), a fixed 1-D sin-cos temporal embedding added before the first
// temporal block, and the conditioning of each video (timestep, class) shared by its frames.
//
// The model is the DiT core (model/dit/dit.h) with DiTConfig::video set: the same
// parameters under the same state-dict names (blocks.{i}.…; no y_embedder when num_classes
// is 0), plus the fixed `temp_embed` [1, F, D] beside `pos_embed`; the same tensor, pipeline
// and context parallel layouts, context parallelism splitting each frame's tokens
// (docs/parallelism.md). Configs: Latte-S/B/L/XL × patch 2/4/8 (the DiT paper's sizes) and
// `latte` custom shapes, with num_frames (16 unless given).
#pragma once

#include "model/family/family.h"

namespace difftrain {

const ModelFamily& LatteFamily();

}  // namespace difftrain
