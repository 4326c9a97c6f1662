// A tiny UNet for the family's tests: two levels, a plain and a cross-attention block each
// way (up resnets concatenate skips, an upsampler), two heads, 1×1-conv projections
// (`linear_projection`: linear ones), a 3-token text of 6 features.
#pragma once

#include "model/unet/config.h"

namespace difftrain::testing {

inline UNetConfig TinyUNetConfig(bool linear_projection = false) {
  UNetConfig c;
  c.block_out_channels = {4, 8};
  c.down_block_types = {kCrossAttnDown, kDown};
  c.up_block_types = {kUp, kCrossAttnUp};
  c.layers_per_block = 1;
  c.attention_head_dim = {2};
  c.cross_attention_dim = 6;
  c.norm_num_groups = 2;
  c.use_linear_projection = linear_projection;
  c.sample_size = 8;
  c.text_length = 3;
  return c;
}

// SDXL's shape, tiny: a plain first level then cross-attention levels whose transformers have
// 2 and 3 blocks (the mid block's 3, the up blocks' mirrored), linear projections, and its
// micro-conditioning (a 4-feature pooled text, six time ids of 2 features each).
inline UNetConfig TinySdxlConfig() {
  UNetConfig c;
  c.block_out_channels = {4, 8, 8};
  c.down_block_types = {kDown, kCrossAttnDown, kCrossAttnDown};
  c.up_block_types = {kCrossAttnUp, kCrossAttnUp, kUp};
  c.layers_per_block = 1;
  c.attention_head_dim = {1, 2, 2};
  c.transformer_layers_per_block = {1, 2, 3};
  c.cross_attention_dim = 6;
  c.norm_num_groups = 2;
  c.use_linear_projection = true;
  c.addition_time_embed_dim = 2;
  c.projection_class_embeddings_input_dim = 4 + UNetConfig::kTimeIds * 2;
  c.sample_size = 8;
  c.text_length = 3;
  return c;
}

}  // namespace difftrain::testing
