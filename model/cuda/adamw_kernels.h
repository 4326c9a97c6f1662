// AdamW's elementwise pass, written once against the primitives P (model/cuda/simt_portable.h):
// nvcc compiles it for the GPU (model/cuda/optimizer.cu, device_primitives.cuh) and the CPU
// emulator runs it in every test run (model/simt/adamw_kernel_test.cc), so its vector and tail
// indexing is checked on every machine.
//
// Each thread of a grid-stride loop updates W consecutive parameters at a time: W = 4 reads and
// writes every fp32 array with 16-byte accesses and the bf16 copy with 8-byte ones (every
// array 16-byte aligned, the bf16 one 8), W = 1 one parameter at a time (any alignment). The
// last n % W parameters go one to a thread, after the loop. Per parameter the arithmetic is
// the same whatever W: PyTorch's AdamW (model/optim/adamw.cc is the reference) on the fp32
// master weight, its bf16 copy refreshed, and the EMA of the new weight where there is one.
//
// The primitives P provides (static): Thread(), BlockX(), LoadF32x4(v, p), StoreF32x4(p, v),
// StoreU16x4(p, bits) and RoundBf16(f) (round to nearest even, the bits).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "model/cuda/simt_portable.h"
#include "model/optim/adamw_scalars.h"

namespace difftrain::adamw {

struct Args {
  float* master;
  uint16_t* params_bf16;  // bf16 bits; null: no copy
  float* exp_avg;
  float* exp_avg_sq;
  const float* grads;
  const double* sum_of_squares;  // the squared global norm, read when max_norm > 0
  size_t n;
  AdamWScalars k;
  double max_norm;
  float* ema;  // null: no EMA
  float ema_decay, ema_keep;
  int blocks, threads;  // the grid
};

// The gradients' factor: min(1, max_norm / (norm + 1e-6)) when clipping (ClipScale's).
DT_SIMT float ClipFactor(const Args& a) {
  if (a.max_norm <= 0) return 1.0f;
  const double coef = a.max_norm / (sqrt(*a.sum_of_squares) + 1e-6);
  return static_cast<float>(coef < 1.0 ? coef : 1.0);
}

// One EMA value (EmaUpdate's arithmetic).
DT_SIMT float EmaOf(float ema, float param, float decay, float keep) {
  return decay * ema + keep * param;
}

// One parameter's update: p, m and v in place from its gradient g (already scaled).
DT_SIMT void Update(float& p, float& m, float& v, float g, const AdamWScalars& k) {
  p *= k.decay;
  m = k.beta1 * m + (1 - k.beta1) * g;
  v = k.beta2 * v + (1 - k.beta2) * g * g;
  p -= k.step_size * m / (sqrtf(v) / k.bias2_sqrt + k.eps);
}

template <class P>
DT_SIMT void Scalar(const Args& a, size_t i, float scale) {
  float p = a.master[i], m = a.exp_avg[i], v = a.exp_avg_sq[i];
  Update(p, m, v, a.grads[i] * scale, a.k);
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  a.master[i] = p;
  if (a.params_bf16 != nullptr) a.params_bf16[i] = P::RoundBf16(p);
  if (a.ema != nullptr) a.ema[i] = EmaOf(a.ema[i], p, a.ema_decay, a.ema_keep);
}

template <class P, int W>
DT_SIMT void Step(const Args& a) {
  const float scale = ClipFactor(a);
  const size_t first = size_t(P::BlockX()) * a.threads + P::Thread();
  const size_t stride = size_t(a.blocks) * a.threads;
  const size_t vectors = a.n / W;
  for (size_t j = first; j < vectors; j += stride) {
    const size_t i = j * W;
    if constexpr (W == 4) {
      // Every load before the first use: five 16-byte reads in flight a thread.
      float g[4], p[4], m[4], v[4], e[4];
      P::LoadF32x4(g, a.grads + i);
      P::LoadF32x4(p, a.master + i);
      P::LoadF32x4(m, a.exp_avg + i);
      P::LoadF32x4(v, a.exp_avg_sq + i);
      if (a.ema != nullptr) P::LoadF32x4(e, a.ema + i);
      uint16_t bits[4];
      DT_UNROLL
      for (int x = 0; x < 4; ++x) {
        Update(p[x], m[x], v[x], g[x] * scale, a.k);
        bits[x] = P::RoundBf16(p[x]);
        e[x] = a.ema != nullptr ? EmaOf(e[x], p[x], a.ema_decay, a.ema_keep) : 0.0f;
      }
      P::StoreF32x4(a.exp_avg + i, m);
      P::StoreF32x4(a.exp_avg_sq + i, v);
      P::StoreF32x4(a.master + i, p);
      if (a.params_bf16 != nullptr) P::StoreU16x4(a.params_bf16 + i, bits);
      if (a.ema != nullptr) P::StoreF32x4(a.ema + i, e);
    } else {
      Scalar<P>(a, i, scale);
    }
  }
  // The last n % W parameters, one to each of the first threads.
  if (first < a.n - vectors * W) Scalar<P>(a, vectors * W + first, scale);
}

}  // namespace difftrain::adamw
