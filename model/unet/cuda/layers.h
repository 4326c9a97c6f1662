// The UNet's layers on the GPU (model/unet/cuda/unet.h), one class per node kind of the plan
// (model/unet/plan.h), each the twin of its CPU layer (model/unet/layers.cc, resnet.cc,
// transformer.cc) with forward and backward side by side. A layer is built for one micro-batch
// size: it takes byte offsets of what it keeps for backward from the activation space and of
// its temporaries from the scratch space, which all layers share, and reports the shared
// workspaces it needs (convolution, norm, attention). Internal to model/unet/cuda.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/conv2d.h"
#include "model/cpu/groupnorm.h"
#include "model/cuda/common.h"
#include "model/cuda/conv2d.h"
#include "model/cuda/gemm.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain::cuda {
class CudnnAttentionSet;
}  // namespace difftrain::cuda

namespace difftrain::cuda::unet {

// Hands out 256-byte aligned ranges of an arena, as byte offsets.
struct Space {
  size_t used = 0;
  template <typename T>
  size_t Take(size_t n) {
    const size_t at = (used + 255) / 256 * 256;
    used = at + n * sizeof(T);
    return at;
  }
};

// The workspaces every layer shares, sized to the largest user.
struct Workspaces {
  size_t conv_bytes = 0, norm_floats = 0, attention_floats = 0;
};

// Where one micro-batch's tensors are while a layer runs.
struct Run {
  int B = 0;
  const float* P = nullptr;  // fp32 master weights (norms' affine, convolutions' biases)
  const bf16* W = nullptr;   // their bf16 copy (what the GEMMs read)
  float* G = nullptr;        // gradients (`+=`)
  unsigned char* acts = nullptr;
  unsigned char* scratch = nullptr;
  const std::vector<float*>* values = nullptr;  // [B, C, H, W] fp32 each
  const std::vector<float*>* grads = nullptr;   // their gradients (value 0's: null)
  const bf16* context = nullptr;                // [B, L, D_text]
  const bf16* temb_silu = nullptr;              // SiLU(time embedding) [B, E]
  float* dtemb_silu = nullptr;                  // its gradient (`+=`)
  bf16* temb_scratch = nullptr;                 // [B, E]
  void* conv_workspace = nullptr;
  float* norm_workspace = nullptr;
  float* attention_workspace = nullptr;
  Gemm* gemm = nullptr;
  cudaStream_t stream = nullptr;

  template <typename T>
  T* A(size_t offset) const {
    return reinterpret_cast<T*>(acts + offset);
  }
  template <typename T>
  T* S(size_t offset) const {
    return reinterpret_cast<T*>(scratch + offset);
  }
  float* value(int id) const { return (*values)[id]; }
  float* grad(int id) const { return (*grads)[id]; }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual void Forward(const Run& r) = 0;
  // Adds into the gradients of the layer's inputs and parameters.
  virtual void Backward(const Run& r) = 0;
};

// A GroupNorm (or, over rows of HW = 1 in one group, a LayerNorm) with affine weights, fused
// with the SiLU after it where `silu`.
struct Norm {
  size_t w = 0, b = 0, mean = 0, rstd = 0;
  cpu::GroupNormShape s{};
  float eps = 0;
  bool silu = false;

  Norm(const UNetPlan& plan, const std::string& prefix, cpu::GroupNormShape shape, float e,
       bool with_silu, Space& acts, Workspaces& ws);
  size_t size() const { return size_t(s.B) * s.C * s.HW; }
  template <typename Out>
  void Forward(const Run& r, Out* out, const float* x) const;
  template <typename Dout>
  void Backward(const Run& r, float* dx, const Dout* dout, const float* x) const;
};

struct Conv {
  size_t w = 0, b = 0;
  Conv2d conv;
  Conv(const UNetPlan& plan, const std::string& prefix, const cpu::Conv2dShape& shape,
       Workspaces& ws);
  void Forward(const Run& r, float* out, const float* in, bool accumulate = false) const;
  // din: null skips the input gradient.
  void Backward(const Run& r, float* din, const float* dout, const float* in) const;
};

// nn.Linear over N rows of bf16; `bias` false for the attention's q, k and v.
struct Linear {
  size_t w = 0, b = 0;
  bool has_bias = true;
  int I = 0, O = 0;
  Linear(const UNetPlan& plan, const std::string& prefix, int in, int out, bool bias = true);
  template <typename Out>
  void Forward(const Run& r, Out* out, const bf16* in, int N) const;
  // dw += doutᵀ·in, dbias += Σ dout (from dout_f32 where given, else from dout), din = dout·w
  // (null: skipped).
  void Backward(const Run& r, bf16* din, const bf16* dout, const bf16* in, int N,
                const float* dout_f32 = nullptr) const;
};

// Which kernels the layers run where there is a choice (UNet::Options).
struct Kernels {
  // The transformers' attention on the flash kernels wherever they take the head dim (else,
  // and with false everywhere, the fused kernels).
  bool flash_attention = true;
  // The self-attention on cuDNN's fused attention wherever it takes the head dim (a layer asks
  // the set for its shape; the cross-attention stays on the kernels above); null: not.
  CudnnAttentionSet* cudnn = nullptr;
};

// The layer of `node` for micro-batches of B.
std::unique_ptr<Layer> MakeLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& node,
                                 int B, Space& acts, Space& scratch, Workspaces& ws,
                                 const Kernels& kernels);
std::unique_ptr<Layer> MakeTransformerLayer(const UNetConfig& c, const UNetPlan& plan,
                                            const UNetNode& node, int B, Space& acts,
                                            Space& scratch, Workspaces& ws, const Kernels& kernels);

}  // namespace difftrain::cuda::unet
