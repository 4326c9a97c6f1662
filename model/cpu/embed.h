// The DiT's input and output reshapes and its fixed embeddings.
//
// Patchify:   img [B, C, H, W] → patches [B, T, C·p·p], T = (H/p)·(W/p), token t = i·(W/p) + j,
//             feature c·p·p + ki·p + kj — the order of a Conv2d weight [D, C, p, p], so the
//             patch embed is a Linear over these features.
// Unpatchify: tokens [B, T, p·p·C] → img [B, C, H, W], feature (ki·p + kj)·C + c
//             (DiT's reshape(N, h, w, p, p, c) + einsum nhwpqc->nchpwq).
#pragma once

#include <cstdint>

namespace difftrain::cpu {

template <typename T>
void Patchify(T* patches, const T* img, int B, int C, int H, int W, int p);

template <typename T>
void UnpatchifyForward(T* img, const T* tokens, int B, int C, int H, int W, int p);
// Adds into dtokens.
template <typename T>
void UnpatchifyBackward(T* dtokens, const T* dimg, int B, int C, int H, int W, int p);

// MAE's fixed 2-D sin-cos position embedding [grid·grid, D]: the first D/2 features encode
// the column j, the last D/2 the row i; each half is [sin(pos·ω_k)…, cos(pos·ω_k)…] with
// ω_k = 10000^(−k/(D/4)). Computed in double precision.
void SinCos2DPositionEmbedding(float* out, int grid, int D);
// Latte's fixed temporal embedding [length, D]: row f is [sin(f·ω_k)…, cos(f·ω_k)…] with
// ω_k = 10000^(−k/(D/2)). Computed in double precision.
void SinCos1DEmbedding(float* out, int length, int D);

// DiT's timestep frequencies [B, dim] (dim = 256 in DiT): [cos(t·f_k)…, sin(t·f_k)…] with
// f_k = exp(−ln(10⁴)·k/(dim/2)).
// Computed in double precision and rounded once.
template <typename T>
void TimestepFrequencies(T* out, const T* t, int B, int dim);

// The embedding of a guidance scale g that a guidance-distilled model (LCM) takes, as
// diffusers' LatentConsistencyModelPipeline.get_guidance_scale_embedding makes it for
// w = g − 1: [sin(1000w·f_k)…, cos(1000w·f_k)…] with f_k = exp(−k·ln(10⁴)/(dim/2 − 1)),
// k < dim/2, and a 0 after them for an odd dim. In float32 as the pipeline computes it (at
// 1000w ≈ 7500 float32's phase is off by up to 5e-4, and the model was distilled with it).
// Needs dim ≥ 4.
void GuidanceScaleEmbedding(float* out, double scale, int dim);

// Label embedding: out[b] = table[labels[b]] ([B, D]); backward adds dout[b] into row labels[b].
template <typename T>
void EmbeddingForward(T* out, const T* table, const int32_t* labels, int B, int D);
template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* labels, int B, int D);

}  // namespace difftrain::cpu
