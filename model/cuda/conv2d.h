// 2-D convolution on the GPU (PyTorch's nn.Conv2d over NCHW, groups 1; model/cpu/conv2d.h is
// the reference and gives the shape): im2col into bf16 columns, then one cuBLASLt GEMM with
// fp32 accumulation (model/cuda/gemm.h) for the whole micro-batch, and the GEMM's token-major
// result back to NCHW with the bias added in fp32.
//
//   forward:        col [B·Ho·Wo, Kp] = im2col(in)        tok [B·Ho·Wo, Cop] = col · wᵀ
//                   out [B, Co, Ho, Wo] (+)= tok + bias
//   backward:       dtok = dout as tokens (bf16)           dbias += Σ dout over b, y, x
//                   dw += dtokᵀ · col                      dcol = dtok · w
//                   din += col2im(dcol)                    (each input pixel gathers its taps)
//
// cuBLASLt needs the GEMM's leading dimensions to be multiples of 8: the patch width C·K·K is
// padded to Kp and the output channels to Cop (both multiples of 8) where they are not — conv_in
// (4 latent channels: 36 → 40) and conv_out (4 channels → 8) — through a zero-padded bf16 copy of
// the weight and an fp32 gradient scratch whose padding is dropped when it is added in.
// Both passes are deterministic (col2im gathers instead of scattering).
//
// Precision: in and out are fp32 (the UNet's values between layers); the GEMM reads bf16 (the
// columns and the bf16 copy of the weight) and accumulates in fp32; the bias and every
// gradient are fp32. Nothing is allocated: the caller passes a workspace of WorkspaceBytes.
#pragma once

#include <cstddef>

#include "model/cpu/conv2d.h"
#include "model/cuda/common.h"
#include "model/cuda/gemm.h"

namespace difftrain::cuda {

class Conv2d {
 public:
  explicit Conv2d(const cpu::Conv2dShape& shape);

  const cpu::Conv2dShape& shape() const { return s_; }
  // Bytes of the workspace Forward and Backward take (256-byte aligned pieces).
  size_t WorkspaceBytes() const;
  size_t out_size() const { return size_t(s_.B) * s_.Co * s_.Ho() * s_.Wo(); }
  size_t in_size() const { return size_t(s_.B) * s_.C * s_.H * s_.W; }

  // out [B, Co, Ho, Wo] = conv(in [B, C, H, W]) + bias, or += with `accumulate`; w is the bf16
  // weight [Co, C, K, K], bias fp32 [Co].
  void Forward(Gemm& gemm, float* out, const float* in, const bf16* w, const float* bias,
               bool accumulate, void* workspace, cudaStream_t stream) const;
  // din += ∂/∂in (null: skipped, e.g. conv_in whose input is data), dw += ∂/∂w (fp32
  // [Co, C·K·K]), dbias += ∂/∂bias, from dout [B, Co, Ho, Wo] and the forward's in.
  void Backward(Gemm& gemm, float* din, float* dw, float* dbias, const float* dout, const float* in,
                const bf16* w, void* workspace, cudaStream_t stream) const;

 private:
  struct Workspace;
  Workspace Bind(void* base) const;
  bool padded() const { return Kp_ != patch_ || Cop_ != s_.Co; }
  const bf16* Weight(const bf16* w, const Workspace& ws, cudaStream_t stream) const;

  cpu::Conv2dShape s_;
  int patch_ = 0, Kp_ = 0, Cop_ = 0, N_ = 0;  // C·K·K, padded; Co padded; B·Ho·Wo
};

// out[b·C + c] = Σ over the P values of plane (b, c) of x [B, C, P], plus out's own value with
// `accumulate`; with `over_batch`, out[c] sums over b too (a bias gradient). fp32, one block
// per output.
void SumPlanes(float* out, const float* x, int B, int C, int P, bool over_batch, bool accumulate,
               cudaStream_t stream);

}  // namespace difftrain::cuda
