// The UNet's data movement between its layers on the GPU, over NCHW fp32 values
// (model/cpu/upsample.h and model/unet/parts.h are the references):
//   - nearest ×2 upsampling (the up blocks' upsamplers) and its backward;
//   - concatenation on channels of an up resnet's input and its skip, and its backward;
//   - [B, C, T] planes ↔ [B, T, C] tokens around a transformer (proj_in and proj_out are
//     token-major GEMMs);
//   - a value per (sample, channel) added over its plane (the resnets' time embedding);
//   - y += x.
// Backwards add (`+=`) into the gradients they are given, as on the CPU.
#pragma once

#include <cstddef>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// out [P, 2H, 2W] = in [P, H, W] repeated over each 2 × 2 block; din [P, H, W] += the sum of
// its block of dout.
void Upsample2xForward(float* out, const float* in, int P, int H, int W, cudaStream_t stream);
void Upsample2xBackward(float* din, const float* dout, int P, int H, int W, cudaStream_t stream);

// out [B, Ca + Cb, HW] = [a [B, Ca, HW], b [B, Cb, HW]] on channels; da += its part of dout,
// db += the other.
void ConcatChannels(float* out, const float* a, int Ca, const float* b, int Cb, int B, int HW,
                    cudaStream_t stream);
void ConcatChannelsBackward(float* da, float* db, const float* dout, int Ca, int Cb, int B, int HW,
                            cudaStream_t stream);

// tok [B, T, C] (bf16, a GEMM's input) = x [B, C, T] transposed per sample.
void ToTokens(bf16* tok, const float* x, int B, int C, int T, cudaStream_t stream);
// x [B, C, T] += tok [B, T, C] transposed per sample.
void AddFromTokens(float* x, const float* tok, int B, int C, int T, cudaStream_t stream);
void AddFromTokens(float* x, const bf16* tok, int B, int C, int T, cudaStream_t stream);

// x [B·C, P] += v [B·C] over each plane.
void AddToPlanes(float* x, const float* v, int BC, int P, cudaStream_t stream);

// y += x over n values.
void AddInto(float* y, const float* x, size_t n, cudaStream_t stream);

}  // namespace difftrain::cuda
