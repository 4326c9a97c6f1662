// FP8 Linear layers (Hopper's FP8 tensor cores through cuBLASLt), Transformer Engine's "hybrid"
// recipe with delayed scaling, as Megatron-Core trains DiT with `--fp8-format hybrid`
// (../shared/MODELS.md, seed 004: 1.20x its bf16 iteration on DiT-B):
//
// - A layer's input and weight are quantised to E4M3, the gradient of its output to E5M2 (more
//   range, less precision), each tensor x as x · scale, saturated; a product of two FP8 operands
//   accumulates in fp32 and is multiplied by both operands' scale_inv (cuBLASLt's A/B scale
//   pointers), its output bf16 (or the fp32 weight gradient), bias and GELU in the epilogue as
//   in bf16.
// - Delayed scaling: a tensor's scale comes from the largest |x| of its last `history` steps
//   (scale = (448 or 57,344) / amax / 2^margin); each quantisation raises the tensor's running
//   amax, and UpdateScales, once a ForwardBackward, appends it to the history and sets the next
//   scales: no pass over a tensor before its quantisation, all on the device (a CUDA graph
//   captures it). Scales start at 1, so the first step saturates what exceeds the format.
// - cuBLASLt's FP8 products take A transposed and B not ("TN"). In PyTorch's layout that is
//   the forward (in · wᵀ) as it stands; the input gradient (dout · w) needs wᵀ, the weight
//   gradient (doutᵀ · in) needs doutᵀ and inᵀ: the quantising kernel writes the transpose
//   (or both layouts) from one read of the bf16 tensor. The forward quantises its input in
//   both layouts and keeps the transposed one, per layer, for the backward (N·I bytes a layer:
//   DiT-XL/2 at micro-batch 32, 66 MB a block), instead of reading the bf16 input again.
//
// What stays bf16: attention, the norms, the embedders, the adaLN and final layers (the
// recipe's usual first/last layers in higher precision), and any product cuBLASLt has no FP8
// algorithm for (then the layer runs that product in bf16). The master weights, gradients and
// optimizer are unchanged. Amaxes are per rank (Megatron reduces them over the data-parallel
// group; here each rank scales by its own, which changes rounding, never the all-reduced update).
// Needs compute capability 8.9 or later (Fp8Supported).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/cuda/common.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/fp8_format.h"
#include "model/cuda/gemm.h"

namespace difftrain::cuda {

struct Fp8Recipe {
  int history = 1024;  // steps of amax a scale looks back on (Megatron's --fp8-amax-history-len)
  int margin = 0;      // scale /= 2^margin (--fp8-margin)
};

// Whether a GPU of compute capability major.minor has FP8 tensor cores (8.9, Ada, or later).
constexpr bool Fp8Capable(int major, int minor) {
  return major * 10 + minor >= 89;
}

// OK where the current device runs cuBLASLt's FP8 products (Fp8Capable); else the error,
// naming the device's compute capability.
Status Fp8Supported();

// The scaling state of `formats.size()` tensors, on the device: scale, scale_inv (1 to
// start), running amax, amax history.
class Fp8Scaling {
 public:
  Fp8Scaling(std::vector<fp8::Format> formats, Fp8Recipe recipe);
  int tensors() const { return static_cast<int>(formats_.size()); }
  fp8::Format format(int i) const { return formats_[i]; }
  const float* scale(int i) const { return scale_.data() + i; }
  const float* scale_inv(int i) const { return scale_inv_.data() + i; }
  float* amax(int i) { return amax_.data() + i; }
  // The history step: one launch for every tensor.
  void Update(cudaStream_t stream);
  // For tests (synchronous): every tensor's scale, and its running amax.
  std::vector<float> DownloadScales() const;
  std::vector<float> DownloadAmax() const;

 private:
  std::vector<fp8::Format> formats_;
  Fp8Recipe recipe_;
  DeviceBuffer<float> scale_, scale_inv_, amax_, history_, limit_;
  DeviceBuffer<int> count_;
};

// in [rows, cols] bf16 → out [rows, cols] and/or out_t [cols, rows] FP8 (either null) with
// scaling tensor i: x · scale, its |x| raised into the running amax. rows and cols multiples of
// 16 (what an FP8 GEMM's operands need besides).
void QuantizeFp8(uint8_t* out, uint8_t* out_t, const bf16* in, int rows, int cols,
                 Fp8Scaling& scaling, int i, cudaStream_t stream);

// A model's Linear layers in FP8: each layer l owns three scaling tensors (its input and weight
// in E4M3, its output's gradient in E5M2) and its transposed quantised input, kept from its
// forward for its backward; the other quantised operands go through one workspace (its layers
// run one after another on one stream). Forward and Backward take the same bf16 tensors as
// Gemm's Forward / BackwardWeight + BackwardInput and quantise them on the way; a layer's
// Backward reads what its last Forward kept, so each Forward is followed by its Backward before
// the layer's next Forward (as a training step's are).
class Fp8Linears {
 public:
  // Layers of in_features[l] inputs each.
  Fp8Linears(std::vector<int> in_features, Fp8Recipe recipe);
  // The workspace for the layers over at most max_rows rows with at most max_out outputs (all
  // multiples of 16): the kept inputs, max_rows · Σ in_features bytes, and the scratch.
  static size_t WorkspaceBytes(const std::vector<int>& in_features, int max_rows, int max_out);
  void Bind(unsigned char* workspace, int max_rows, int max_out);

  // out[N, O] = epilogue(in · wᵀ) (Gemm::Forward's arguments), in and w quantised.
  void Forward(Gemm& gemm, int layer, bf16* out, const bf16* in, const bf16* w, const bf16* bias,
               int N, int I, int O, Epilogue epilogue, bf16* aux = nullptr);
  // dw (+)= doutᵀ · in and din = dout · w — times gelu'(gelu_pre) where gelu_pre is given, and
  // with dbias also dbias += din's column sums (as Gemm::BackwardInputGeluAndBias, scratch [I]
  // fp32) — dout, in and w quantised (dout once, in both layouts).
  void Backward(Gemm& gemm, int layer, float* dw, bool accumulate, bf16* din, const bf16* dout,
                const bf16* in, const bf16* w, int N, int I, int O, const bf16* gelu_pre = nullptr,
                float* dbias = nullptr, float* scratch = nullptr);
  // The scales' history step (once a ForwardBackward, after it).
  void UpdateScales(cudaStream_t stream) { scaling_.Update(stream); }
  Fp8Scaling& scaling() { return scaling_; }
  // Products that ran in bf16 because cuBLASLt had no FP8 algorithm for them, so far.
  int bf16_fallbacks() const { return fallbacks_; }

  // A layer's scaling tensors.
  static int InputTensor(int layer) { return 3 * layer; }
  static int WeightTensor(int layer) { return 3 * layer + 1; }
  static int GradTensor(int layer) { return 3 * layer + 2; }

 private:
  void CheckShape(int layer, int N, int I, int O) const;

  int layers_;
  std::vector<int> in_features_;
  int max_in_;
  Fp8Scaling scaling_;
  int max_rows_ = 0, max_out_ = 0;
  // Workspace: each layer's kept input (transposed), then the forward's input (row-major), the
  // weight (forward: row-major; backward: transposed), the output's gradient row-major and
  // transposed.
  std::vector<uint8_t*> kept_;
  uint8_t *in_ = nullptr, *w_ = nullptr, *dout_ = nullptr, *dout_t_ = nullptr;
  int fallbacks_ = 0;
};

}  // namespace difftrain::cuda
