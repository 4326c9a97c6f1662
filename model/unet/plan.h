// The Stable Diffusion UNet as a list of nodes in forward order, built once from a config:
// the one walk of the architecture that the parameter table (diffusers' state-dict names and
// shapes), the multiply-accumulate count and the CPU model (model/unet/unet.h) all read.
//
// Values are the tensors that pass between nodes ([B, C, H, W] each, value 0 the model's input
// x_t); a node reads one value (two for an up block's resnet: its input and the skip it
// concatenates after it on channels) and writes one. The skips are the outputs of conv_in, of
// every down resnet/transformer pair and of every downsampler; each up resnet takes the last
// one not yet taken.
#pragma once

#include <string>
#include <vector>

#include "model/tensor/tensor_table.h"
#include "model/unet/config.h"

namespace difftrain {

enum class UNetNodeKind {
  kConv,          // 3×3 convolution, stride 1 or 2 (conv_in, downsamplers)
  kUpsampleConv,  // nearest ×2, then a 3×3 convolution (upsamplers)
  kResnet,        // ResnetBlock2D with the time embedding
  kTransformer,   // Transformer2DModel: GroupNorm, proj_in, self-, cross-attention, GEGLU, proj_out
  kOutput,        // conv_norm_out, SiLU, conv_out
};

struct UNetValue {
  int C, H, W;
};

struct UNetNode {
  UNetNodeKind kind;
  std::string prefix;       // state-dict name prefix ("down_blocks.0.resnets.1.")
  std::vector<int> inputs;  // value ids: [input] or [input, skip]
  int output = 0;
  int stride = 1;  // kConv
  int heads = 0;   // kTransformer
  int depth = 0;   // kTransformer: its BasicTransformerBlocks
};

struct UNetPlan {
  std::vector<UNetValue> values;
  std::vector<UNetNode> nodes;
  TensorTable table;  // every parameter, time embedding first, then node by node

  explicit UNetPlan(const UNetConfig& c);

  const UNetValue& in(const UNetNode& n, int i = 0) const { return values[n.inputs[i]]; }
  const UNetValue& out(const UNetNode& n) const { return values[n.output]; }
  // Channels a node reads: its input's, plus its skip's.
  int in_channels(const UNetNode& n) const;
};

// Forward multiply-accumulates per sample of one node (as ForwardMacs counts them, which adds
// the time embedding), and those of them that activation recomputation runs again: all but the
// last convolution or projection, whose output is kept (model/unet/unet.h).
struct UNetNodeMacs {
  UNetMacs forward;
  double recomputed = 0;
};
UNetNodeMacs NodeMacs(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n);

// Bytes per sample that one node's memory-bound kernels read and write in the GPU step
// (model/unet/cuda): GroupNorms, LayerNorms, SiLU, residual adds, concatenations, upsampling,
// GEGLU's gate, casts, layout transposes and the convolutions' im2col and col2im, in the
// precision the step keeps them (fp32 values, bf16 columns and GEMM inputs). Not counted: what
// the GEMMs and the fused attention read and write (their MACs price them; attention's
// probabilities are never materialised). `forward` is also what recomputation runs again.
struct UNetNodeBytes {
  double forward = 0, backward = 0;
  double total() const { return forward + backward; }
};
UNetNodeBytes NodeBytes(const UNetPlan& plan, const UNetNode& n);

}  // namespace difftrain
