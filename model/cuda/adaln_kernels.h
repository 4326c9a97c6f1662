// DiT's adaLN-Zero elementwise work between two GEMMs, written once against primitives so that
// nvcc compiles it for the GPU (model/cuda/modulate.cu, device_primitives.cuh) and the CPU emulator
// runs it in every test run (model/simt): the gated residual that ends one branch fused with the
// LayerNorm-modulate that starts the next, so the residual stream is read once between them.
//
// Forward, for token row t of sample b (samples of T rows, features D):
//   x' = x + gate[b] · y  (+ add[t])                      fp32; the branch y (bf16) and add
//                                                          ([T, D] fp32) are each optional
//   h  = (x' − mean) · rstd · (1 + scale[b]) + shift[b]    bf16; LayerNorm without affine,
//                                                          two-pass variance, eps 1e-6
// Backward, given dh (bf16) and dx, the stream's gradient so far (fp32):
//   dx += LayerNorm's backward of g = dh · (1 + scale[b])
//   dy  = bf16(gate[b] · dx)                               the branch's output gradient
//   and, per sample, sums over its T rows: Σ dh (shift), Σ dh · x̂ (scale), Σ dx · y (gate) and
//   Σ dy (the branch's output bias; the caller sums it over samples).
//
// One block per run of `rows` rows of one sample (kRowsPerBlock unless the launcher says
// otherwise): grid (Chunks(T, rows), B). A row is spread
// over the whole block, each thread owning V groups of W consecutive features (W = 4: 16-byte
// fp32 and 8-byte bf16 vector accesses) at the same place in every row. So a row is read from
// memory once and held in registers; its mean, variance and backward sums are block
// reductions in a fixed order; and each thread adds up its own features' per-sample sums over
// the block's rows, which the backward writes as the block's partial rows. ReduceAdaGrads adds
// each sample's partials in chunk order. No atomics anywhere, so results are deterministic.
//
// The primitives P provides (static): Thread(), BlockX(), BlockY(), Smem() (kSmemBytes),
// SyncThreads(), ShflXor(v, mask), LoadF32x4(v, p), StoreF32x4(p, v), LoadU16x4(bits, p),
// StoreU16x4(p, bits) (16- and 8-byte aligned), RoundBf16(f) (round to nearest even, the bits)
// and Bf16ToFloat(bits).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "model/cuda/simt_portable.h"

namespace difftrain::adaln {

inline constexpr int kRowsPerBlock = 16;
// The launchers' defaults, from bench_cuda_norms on an H100 (DiT-XL/2's rows, micro-batch 32;
// docs/benchmarks.md): the forward took 49.6, 50.5 and 64.8 us at 8, 16 and 32 rows a block,
// the backward 94.6, 96.1 and 88.8 us (a fourth of the partial rows of 8).
inline constexpr int kForwardRowsPerBlock = 16;
inline constexpr int kBackwardRowsPerBlock = 32;
inline constexpr int kMaxThreads = 512;
inline constexpr int kMaxWarps = kMaxThreads / 32;
inline constexpr int kReduceThreads = 256;
inline constexpr int kSums = 4;  // the backward's partial sums a feature: shift, scale, gate, bias
inline constexpr float kEps = 1e-6f;
// Two alternating slots of kMaxWarps pairs of floats: a block reduction's warp sums.
inline constexpr size_t kSmemBytes = 2 * kMaxWarps * 2 * sizeof(float);

// How a row of D features spreads over a block: W features a group, V groups a thread,
// `threads` a multiple of 32. V = 0 when D needs more than kMaxThreads · 4 groups.
struct Layout {
  int W, V, threads;
};
constexpr Layout LayoutFor(int D, bool vector) {
  const int W = vector ? 4 : 1;
  const int groups = (D + W - 1) / W;
  for (const int V : {1, 2, 4}) {
    const int threads = ((groups + V - 1) / V + 31) / 32 * 32;
    if (threads <= kMaxThreads) return {W, V, threads};
  }
  return {W, 0, 0};
}
// Returns f(integral_constant W, integral_constant V) for the layout's template arguments.
template <class F>
void WithLayout(const Layout& layout, F&& f) {
  const auto with_v = [&](auto w) {
    switch (layout.V) {
      case 1:
        return f(w, std::integral_constant<int, 1>());
      case 2:
        return f(w, std::integral_constant<int, 2>());
      default:
        return f(w, std::integral_constant<int, 4>());
    }
  };
  if (layout.W == 4) {
    with_v(std::integral_constant<int, 4>());
  } else {
    with_v(std::integral_constant<int, 1>());
  }
}
constexpr int MaxFeatures(bool vector) {
  return kMaxThreads * 4 * (vector ? 4 : 1);
}
constexpr int Chunks(int T, int rows = kRowsPerBlock) {
  return (T + rows - 1) / rows;
}
// The backward's partial rows, in floats: [B][Chunks(T, rows)][kSums][D].
constexpr size_t PartialFloats(int B, int T, int D, int rows = kRowsPerBlock) {
  return size_t(B) * Chunks(T, rows) * kSums * D;
}

// Sample b's shift is shift[b·stride …], its scale scale[b·stride …] (slices of the adaLN
// output).
struct Modulation {
  const float* shift;
  const float* scale;
  int stride;
};
// The gated residual x' = x + gate[b] · y whose output the LayerNorm reads; y null for none.
struct Branch {
  const uint16_t* y;  // bf16 bits [B·T, D]
  const float* gate;  // sample b's at gate[b·stride …]
  int stride;
};

struct ForwardArgs {
  float* x_out;  // x' [B·T, D]; may be x; null when there is neither branch nor add (x' = x)
  uint16_t* h;   // bf16 bits [B·T, D]
  float* mean;   // [B·T]
  float* rstd;
  const float* x;
  Branch branch;
  const float* add;  // null, or [T, D]
  Modulation mod;
  int B, T, D, threads;
  int rows = kRowsPerBlock;  // a block's
};

struct BackwardArgs {
  float* dx;        // [B·T, D], added into
  uint16_t* dy;     // bf16 bits [B·T, D]; may be dh; unused without a branch
  float* partials;  // [B][Chunks(T, rows)][kSums][D]
  const uint16_t* dh;
  const float* x;  // x', the LayerNorm's input
  const float* mean;
  const float* rstd;
  Modulation mod;  // its scale is read
  Branch branch;
  int B, T, D, threads;
  int rows = kRowsPerBlock;
};

// Grid (⌈D / kReduceThreads⌉, B). d_shift, d_scale and d_gate are slices of adaLN gradients
// (sample b's at [b·stride …]), added into; bias_rows [B, D] is written (Σ dy of each sample).
// Without a branch d_gate and bias_rows are null.
struct ReduceArgs {
  const float* partials;
  float* d_shift;
  float* d_scale;
  int mod_stride;
  float* d_gate;
  int gate_stride;
  float* bias_rows;
  int B, T, D;
  int rows = kRowsPerBlock;  // the backward's
};

template <class P, int W>
DT_SIMT void LoadVec(float (&v)[W], const float* p) {
  if constexpr (W == 4) {
    P::LoadF32x4(v, p);
  } else {
    v[0] = *p;
  }
}
template <class P, int W>
DT_SIMT void LoadVec(float (&v)[W], const uint16_t* p) {
  if constexpr (W == 4) {
    uint16_t bits[4];
    P::LoadU16x4(bits, p);
    DT_UNROLL
    for (int e = 0; e < 4; ++e)
      v[e] = P::Bf16ToFloat(bits[e]);
  } else {
    v[0] = P::Bf16ToFloat(*p);
  }
}
template <class P, int W>
DT_SIMT void LoadBits(uint16_t (&bits)[W], const uint16_t* p) {
  if constexpr (W == 4) {
    P::LoadU16x4(bits, p);
  } else {
    bits[0] = *p;
  }
}
template <class P, int W>
DT_SIMT void StoreVec(float* p, const float (&v)[W]) {
  if constexpr (W == 4) {
    P::StoreF32x4(p, v);
  } else {
    *p = v[0];
  }
}
template <class P, int W>
DT_SIMT void StoreBits(uint16_t* p, const uint16_t (&bits)[W]) {
  if constexpr (W == 4) {
    P::StoreU16x4(p, bits);
  } else {
    *p = bits[0];
  }
}

// Sums each of v's N (≤ 2) values over the block's threads: within each warp by shuffles, then
// the warps' sums in warp order, so every thread ends with the same bits. Calls alternate
// between slots 0 and 1 of shared memory, so one barrier a call suffices: a slot is written
// again only two calls later, after every thread has passed the next call's barrier.
template <class P, int N>
DT_SIMT void BlockSum(float (&v)[N], int slot, int threads) {
  float* sums = reinterpret_cast<float*>(P::Smem()) + slot * kMaxWarps * 2;
  const int warp = P::Thread() / 32, lane = P::Thread() % 32;
  DT_UNROLL
  for (int k = 0; k < N; ++k) {
    for (int mask = 16; mask > 0; mask /= 2)
      v[k] += P::ShflXor(v[k], mask);
    if (lane == 0) sums[warp * 2 + k] = v[k];
  }
  P::SyncThreads();
  DT_UNROLL
  for (int k = 0; k < N; ++k) {
    v[k] = 0;
    for (int w = 0; w < threads / 32; ++w)
      v[k] += sums[w * 2 + k];
  }
}

// Loads the per-sample vector `p` (sample b's at p[b·stride …]) at the thread's groups.
template <class P, int W, int V>
DT_SIMT void LoadSampleVector(float (&v)[V][W], const float* p, int b, int stride, int D,
                              int threads) {
  DT_UNROLL
  for (int j = 0; j < V; ++j) {
    const int d = (P::Thread() + j * threads) * W;
    if (d < D) LoadVec<P, W>(v[j], p + size_t(b) * stride + d);
  }
}

template <class P, int W, int V>
DT_SIMT void Forward(const ForwardArgs& a) {
  const int b = P::BlockY(), t0 = P::BlockX() * a.rows;
  const int t_end = t0 + a.rows < a.T ? t0 + a.rows : a.T;
  const int D = a.D, threads = a.threads;
  const bool gated = a.branch.y != nullptr;
  float shift[V][W] = {}, scale[V][W] = {}, gate[V][W] = {};
  LoadSampleVector<P, W, V>(shift, a.mod.shift, b, a.mod.stride, D, threads);
  LoadSampleVector<P, W, V>(scale, a.mod.scale, b, a.mod.stride, D, threads);
  if (gated) LoadSampleVector<P, W, V>(gate, a.branch.gate, b, a.branch.stride, D, threads);
  // A row's x and y at the thread's features, as loaded; the next row's are loaded before this
  // row's reductions, so that two rows' loads are in flight at their barriers (as in Backward).
  struct Row {
    float x[V][W];
    uint16_t y[V][W];  // bf16 bits
  };
  const auto load = [&](Row& r, int t) {
    const size_t base = (size_t(b) * a.T + t) * D;
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      LoadVec<P, W>(r.x[j], a.x + base + d);
      if (gated) LoadBits<P, W>(r.y[j], a.branch.y + base + d);
    }
  };
  int slot = 0;
  Row cur = {}, next = {};
  if (t0 < t_end) load(cur, t0);
  for (int t = t0; t < t_end; ++t) {
    const size_t row = size_t(b) * a.T + t, base = row * D;
    if (t + 1 < t_end) load(next, t + 1);
    float v[V][W] = {}, sum[1] = {0};
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      DT_UNROLL
      for (int e = 0; e < W; ++e) {
        v[j][e] = cur.x[j][e];
        if (gated) v[j][e] += gate[j][e] * P::Bf16ToFloat(cur.y[j][e]);
      }
      if (a.add != nullptr) {
        float add[W];
        LoadVec<P, W>(add, a.add + size_t(t) * D + d);
        DT_UNROLL
        for (int e = 0; e < W; ++e)
          v[j][e] += add[e];
      }
      if (a.x_out != nullptr) StoreVec<P, W>(a.x_out + base + d, v[j]);
      DT_UNROLL
      for (int e = 0; e < W; ++e)
        sum[0] += v[j][e];
    }
    cur = next;
    BlockSum<P, 1>(sum, slot, threads);
    slot ^= 1;
    const float mean = sum[0] / D;
    float var[1] = {0};
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      if ((P::Thread() + j * threads) * W >= D) continue;
      DT_UNROLL
      for (int e = 0; e < W; ++e)
        var[0] += (v[j][e] - mean) * (v[j][e] - mean);
    }
    BlockSum<P, 1>(var, slot, threads);
    slot ^= 1;
    const float rstd = 1.0f / sqrtf(var[0] / D + kEps);
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      uint16_t h[W];
      DT_UNROLL
      for (int e = 0; e < W; ++e)
        h[e] = P::RoundBf16((v[j][e] - mean) * rstd * (1.0f + scale[j][e]) + shift[j][e]);
      StoreBits<P, W>(a.h + base + d, h);
    }
    if (P::Thread() == 0) {
      a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
}

template <class P, int W, int V>
DT_SIMT void Backward(const BackwardArgs& a) {
  const int b = P::BlockY(), chunk = P::BlockX(), t0 = chunk * a.rows;
  const int t_end = t0 + a.rows < a.T ? t0 + a.rows : a.T;
  const int D = a.D, threads = a.threads;
  const bool gated = a.branch.y != nullptr;
  float scale[V][W] = {}, gate[V][W] = {};
  LoadSampleVector<P, W, V>(scale, a.mod.scale, b, a.mod.stride, D, threads);
  if (gated) LoadSampleVector<P, W, V>(gate, a.branch.gate, b, a.branch.stride, D, threads);
  // The thread's features' sums over the block's rows: shift, scale, gate, bias.
  float acc[kSums][V][W];
  DT_UNROLL
  for (int k = 0; k < kSums; ++k) {
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      DT_UNROLL
      for (int e = 0; e < W; ++e)
        acc[k][j][e] = 0;
    }
  }
  // A row's inputs at the thread's features, as loaded: x', dh, dx, y, mean and rstd. The next
  // row's are loaded before this row's block reduction, so that two rows' loads are in flight
  // at its barrier (one row's alone left the H100 at 1.9 TB/s of the copy's 3.0: two blocks an
  // SM, 48 bytes a thread, too few bytes in flight to cover the memory's latency).
  struct Row {
    float x[V][W], dx[V][W];
    uint16_t dh[V][W], y[V][W];  // bf16 bits, widened where used (fewer registers)
    float mean, rstd;
  };
  const auto load = [&](Row& r, int t) {
    const size_t row = size_t(b) * a.T + t, base = row * D;
    r.mean = a.mean[row];
    r.rstd = a.rstd[row];
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      LoadVec<P, W>(r.x[j], a.x + base + d);
      LoadBits<P, W>(r.dh[j], a.dh + base + d);
      LoadVec<P, W>(r.dx[j], a.dx + base + d);
      if (gated) LoadBits<P, W>(r.y[j], a.branch.y + base + d);
    }
  };
  int slot = 0;
  Row cur = {}, next = {};
  if (t0 < t_end) load(cur, t0);
  for (int t = t0; t < t_end; ++t) {
    const size_t base = (size_t(b) * a.T + t) * D;
    if (t + 1 < t_end) load(next, t + 1);
    const float mean = cur.mean, rstd = cur.rstd;
    // x̂ and g = dh · (1 + scale) of the thread's features.
    float xhat[V][W] = {}, g[V][W] = {};
    float sums[2] = {0, 0};  // Σ g and Σ g · x̂ over the row
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      DT_UNROLL
      for (int e = 0; e < W; ++e) {
        const float dh = P::Bf16ToFloat(cur.dh[j][e]);
        xhat[j][e] = (cur.x[j][e] - mean) * rstd;
        g[j][e] = dh * (1.0f + scale[j][e]);
        sums[0] += g[j][e];
        sums[1] += g[j][e] * xhat[j][e];
        acc[0][j][e] += dh;
        acc[1][j][e] += dh * xhat[j][e];
      }
    }
    BlockSum<P, 2>(sums, slot, threads);
    slot ^= 1;
    const float mean_g = sums[0] / D, mean_gx = sums[1] / D;
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d >= D) continue;
      float dx[W];
      DT_UNROLL
      for (int e = 0; e < W; ++e)
        dx[e] = cur.dx[j][e] + rstd * (g[j][e] - mean_g - xhat[j][e] * mean_gx);
      StoreVec<P, W>(a.dx + base + d, dx);
      if (!gated) continue;
      uint16_t dy[W];
      DT_UNROLL
      for (int e = 0; e < W; ++e) {
        dy[e] = P::RoundBf16(gate[j][e] * dx[e]);
        acc[2][j][e] += dx[e] * P::Bf16ToFloat(cur.y[j][e]);
        acc[3][j][e] += P::Bf16ToFloat(dy[e]);
      }
      StoreBits<P, W>(a.dy + base + d, dy);
    }
    cur = next;
  }
  float* partial = a.partials + (size_t(b) * Chunks(a.T, a.rows) + chunk) * kSums * D;
  DT_UNROLL
  for (int k = 0; k < (gated ? kSums : 2); ++k) {
    DT_UNROLL
    for (int j = 0; j < V; ++j) {
      const int d = (P::Thread() + j * threads) * W;
      if (d < D) StoreVec<P, W>(partial + size_t(k) * D + d, acc[k][j]);
    }
  }
}

template <class P>
DT_SIMT void ReduceAdaGrads(const ReduceArgs& a) {
  const int d = P::BlockX() * kReduceThreads + P::Thread(), b = P::BlockY();
  if (d >= a.D) return;
  const bool gated = a.d_gate != nullptr;
  const int chunks = Chunks(a.T, a.rows);
  const float* p = a.partials + size_t(b) * chunks * kSums * a.D + d;
  float sums[kSums] = {0, 0, 0, 0};
  for (int c = 0; c < chunks; ++c) {
    DT_UNROLL
    for (int k = 0; k < kSums; ++k) {
      if (k < 2 || gated) sums[k] += p[(size_t(c) * kSums + k) * a.D];
    }
  }
  a.d_shift[size_t(b) * a.mod_stride + d] += sums[0];
  a.d_scale[size_t(b) * a.mod_stride + d] += sums[1];
  if (gated) {
    a.d_gate[size_t(b) * a.gate_stride + d] += sums[2];
    a.bias_rows[size_t(b) * a.D + d] = sums[3];
  }
}

}  // namespace difftrain::adaln
