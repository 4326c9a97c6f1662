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

}  // namespace difftrain::testing
