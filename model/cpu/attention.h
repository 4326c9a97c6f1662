// Multi-head self-attention core (timm's Attention between qkv and proj):
//   a qkv buffer [B, T, 3·D] holds q, k, v one after another, each split into H heads of
//   hd = D/H; per (b, h):  P = softmax(Q·Kᵀ / √hd)  [Tq, Tk],   O = P·V;
//   out [B, Tq, D] has the heads side by side (head h at columns h·hd … h·hd+hd−1).
//
// The queries come from the Q part of `q` [B, Tq, 3·D], the keys and values from the K and
// V parts of `kv` [B, Tk, 3·D]. Self-attention passes the same buffer twice (Tq = Tk);
// context parallelism passes this rank's tokens as `q` and the gathered sequence as `kv`.
//
// Forward writes out and the probabilities P [B, H, Tq, Tk] that backward reuses.
// Backward adds the Q gradient into the Q part of dq [B, Tq, 3·D] and the K and V gradients
// into the K and V parts of dkv [B, Tk, 3·D] (dq and dkv may be the same buffer).
//
// The general form takes the queries, keys and values at their own addresses with row strides
// ldq (queries) and ldkv (keys and values): the Stable Diffusion UNet's separate to_q, to_k
// and to_v projections, and cross-attention whose keys and values come from the text
// (Tk = the text length). Backward adds dq, dk and dv at the same strides.
#pragma once

namespace difftrain::cpu {

template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* kv, int B, int Tq, int Tk, int D,
                      int H);

template <typename T>
void AttentionBackward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* probs, int B,
                       int Tq, int Tk, int D, int H);

template <typename T>
void AttentionForward(T* out, T* probs, const T* q, int ldq, const T* k, const T* v, int ldkv,
                      int B, int Tq, int Tk, int D, int H);

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* q, int ldq, const T* k,
                       const T* v, int ldkv, const T* probs, int B, int Tq, int Tk, int D, int H);

}  // namespace difftrain::cpu
