// Multi-head self-attention core (timm's Attention between qkv and proj):
//   qkv [B, T, 3·D] holds q, k, v one after another, each split into H heads of hd = D/H;
//   per (b, h):  P = softmax(Q·Kᵀ / √hd)  [T, T],   O = P·V;
//   out [B, T, D] has the heads side by side (head h at columns h·hd … h·hd+hd−1).
//
// Forward writes out and the probabilities P [B, H, T, T] that backward reuses.
// Backward adds into dqkv [B, T, 3·D].
#pragma once

namespace difftrain::cpu {

template <typename T>
void AttentionForward(T* out, T* probs, const T* qkv, int B, int T_, int D, int H);

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* probs, int B, int T_, int D,
                       int H);

}  // namespace difftrain::cpu
