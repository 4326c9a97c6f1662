// DiT's input and output layers on the GPU (model/cpu/embed.h is the reference).
#pragma once

#include <cstdint>

#include "model/cuda/common.h"

namespace difftrain::cuda {

// x [B, C, S, S] fp32 → patches [B·T, C·p·p] bf16, T = (S/p)², tokens row-major over the
// patch grid and features in the order of the conv weight [D, C, p, p] (c, then row, then
// column), so the patch embedding is one GEMM with that weight viewed as [D, C·p·p].
void Patchify(bf16* patches, const float* x, int B, int C, int S, int p, cudaStream_t stream);

// The inverse for the final layer: tokens [B·T, p·p·C] (DiT's unpatchify order: row, column,
// then channel) → out [B, C, S, S]; and its gradient (both fp32, written).
void Unpatchify(float* out, const float* tokens, int B, int C, int S, int p, cudaStream_t stream);
void UnpatchifyBackward(float* dtokens, const float* dout, int B, int C, int S, int p,
                        cudaStream_t stream);

// resid[b, t, :] = emb[b, t, :] + pos[t, :] : the residual stream (fp32) from the patch
// embedding (fp32, the GEMM's output with its bias) and the fixed position embedding [T, D].
void AddPositionEmbedding(float* resid, const float* emb, const float* pos, int B, int T, int D,
                          cudaStream_t stream);

// out [B, Y, X, w] = in [B, X, Y, w] with the middle axes swapped (bf16): a video's tokens
// from frame-major [F, T] to token-major [T, F] for Latte's temporal attention, and back
// with X and Y swapped (model/dit/dit.cc's SwapAxes is the reference).
void SwapAxes(bf16* out, const bf16* in, int B, int X, int Y, int w, cudaStream_t stream);

// DiT's sinusoidal timestep features [B, dim] (cos half first, max period 10000), bf16.
void TimestepFrequencies(bf16* out, const float* t, int B, int dim, cudaStream_t stream);

// c[b, :] = t_emb[b, :] + table[y[b], :] (table fp32 [classes + 1, D], the last row the
// null class); and dtable[y[b], :] += dc[b, :].
void AddLabelEmbedding(float* c, const float* t_emb, const float* table, const int32_t* y, int B,
                       int D, cudaStream_t stream);
void LabelEmbeddingBackward(float* dtable, const float* dc, const int32_t* y, int B, int D,
                            cudaStream_t stream);

}  // namespace difftrain::cuda
