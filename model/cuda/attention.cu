// Flash-attention-2 style fused attention (forward and backward) on tensor cores through
// nvcuda::wmma (bf16 16×16×16 tiles, fp32 accumulation). Chosen over hand-written mma.sync for
// being checkable by reading: every matrix goes through shared memory with a documented layout.
//
// Common tiling. A block has 4 warps (128 threads) and works on one (b, h) pair and one
// 64-row tile of the sequence; each warp owns 16 of those rows. The head dim hd is zero-padded
// in shared memory to HDP ∈ {64, 80, 128, 160} (a multiple of 16, one template instantiation
// each), and rows past the query length Tq or the key length Tk are zero-filled, so the
// tensor-core tiles never see garbage; the softmax masks the key columns past Tk explicitly.
// q, k and v are separate row-major matrices with their own row strides (self-attention's
// packed qkv is three views of one buffer, cross-attention's q and kv two buffers).
//
// Accumulator fragments keep their element→(row, col) mapping opaque. To scale an accumulator
// row by a per-row factor (the online softmax's rescale, the final 1/l) a warp writes the factors
// broadcast along the rows of a 16×16 fp32 matrix, loads that as an accumulator fragment of the
// same type and multiplies element by element: fragments of one type share one mapping.
#include "model/cuda/attention.h"

#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace difftrain::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;        // rows of a query or key/value tile: 16 per warp
constexpr int kSLd = kTile + 4;  // fp32 score scratch leading dim (floats)
constexpr int kPLd = kTile + 8;  // bf16 probability tiles leading dim (elements)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Leading dim (elements) of a bf16 [kTile][HDP] tile: +8 staggers the rows across banks while
// keeping every 16-row block 32-byte aligned (wmma's pointer requirement).
template <int HDP>
constexpr int TileLd() {
  return HDP + 8;
}
template <int HDP>
constexpr int TileBytes() {
  return kTile * TileLd<HDP>() * 2;
}
constexpr int kScratchBytes = kWarps * 16 * kSLd * 4;  // one [16][kSLd] fp32 matrix per warp
constexpr int kProbBytes = kTile * kPLd * 2;           // one [kTile][kPLd] bf16 matrix

// Copies rows [0, rows) × columns [0, hd) of a row-major global matrix (row stride `stride`
// elements) into a [kTile][HDP] shared tile and zero-fills the rest. hd is a multiple of 8 and
// every global row start is 16-byte aligned (checked by the launchers), so the copy moves whole
// 8-element (16-byte) chunks.
template <int HDP>
__device__ void LoadTile(bf16* tile, const bf16* g, size_t stride, int rows, int hd) {
  constexpr int kChunks = HDP / 8;
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows && c < hd) v = *reinterpret_cast<const uint4*>(g + r * stride + c);
    *reinterpret_cast<uint4*>(tile + r * TileLd<HDP>() + c) = v;
  }
}

// Scales every element of row r of `frags` by factor[r]. `lane_factor` is the factor of the
// calling lane's row (lane / 2); `scratch` is the warp's [16][kSLd] fp32 matrix.
template <int N>
__device__ void ScaleRows(FragC (&frags)[N], float lane_factor, float* scratch) {
  const int lane = threadIdx.x % 32, row = lane >> 1, half = lane & 1;
  __syncwarp();  // the lanes are done with what scratch held
#pragma unroll
  for (int c = 0; c < 8; ++c)
    scratch[row * kSLd + half * 8 + c] = lane_factor;
  __syncwarp();
  FragC factor;
  wmma::load_matrix_sync(factor, scratch, kSLd, wmma::mem_row_major);
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int i = 0; i < factor.num_elements; ++i)
      frags[j].x[i] *= factor.x[i];
  }
}

// Writes the warp's 16×16 accumulator `frag` (columns col0 … col0+15 of the head) as bf16 to
// rows row0 … row0+15 of `g` (row stride `stride`), skipping rows ≥ T and columns ≥ hd.
__device__ void StoreFragBf16(const FragC& frag, float* scratch, bf16* g, size_t stride, int row0,
                              int col0, int T, int hd) {
  const int lane = threadIdx.x % 32, row = lane >> 1, c0 = (lane & 1) * 8;
  __syncwarp();
  wmma::store_matrix_sync(scratch, frag, kSLd, wmma::mem_row_major);
  __syncwarp();
  // hd is a multiple of 8: an 8-column chunk is either inside the head or entirely past it.
  if (row0 + row < T && col0 + c0 < hd) {
    alignas(16) bf16 v[8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
      v[c] = __float2bfloat16(scratch[row * kSLd + c0 + c]);
    *reinterpret_cast<uint4*>(g + (row0 + row) * stride + col0 + c0) =
        *reinterpret_cast<const uint4*>(v);
  }
}

// What every kernel reads: q [B, Tq, ·] (row stride q_stride), k and v [B, Tk, ·] (row stride
// kv_stride), head h at columns h·hd … h·hd+hd−1 of each.
struct Operands {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  size_t q_stride, kv_stride;
  int Tq, Tk, D, H;
};

// ---------------------------------------------------------------------------------------------
// Forward. Grid (ceil(Tq/64), H, B). The block loads its 64 queries once and loops over 64-key
// tiles; warp w owns queries q0+16w … q0+16w+15 and keeps their O (16 × HDP, fp32) in HDP/16
// accumulator fragments. Per key tile: S = Q·Kᵀ (16×64) → scratch; the online softmax in fp32
// (lane pair 2r, 2r+1 owns row r, 32 columns each) → P (bf16); O = O·α + P·V.
// Scores are kept in log2 units (scaled by scale·log2 e) so that exp2f does the exponentials.
//
// Dynamic shared memory, in order:
//   q   [64][HDP+8] bf16   the block's queries (zero past T and past hd)
//   k   [64][HDP+8] bf16   the current key tile
//   v   [64][HDP+8] bf16   the current value tile
//   s   4 × [16][68] fp32  per warp: its scores; then α or 1/l broadcast; then output staging
//   p   4 × [16][72] bf16  per warp: its probabilities (rows of the block's [64][72] matrix)
template <int HDP>
constexpr int ForwardSmemBytes() {
  return 3 * TileBytes<HDP>() + kScratchBytes + kProbBytes;
}

template <int HDP>
__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(bf16* __restrict__ out, float* __restrict__ lse, Operands a,
                           float scale_log2) {
  constexpr int kLd = TileLd<HDP>();
  constexpr int kN = HDP / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kTile * kLd;
  bf16* v_s = k_s + kTile * kLd;
  float* s_all = reinterpret_cast<float*>(v_s + kTile * kLd);
  bf16* p_all = reinterpret_cast<bf16*>(s_all + kWarps * 16 * kSLd);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = lane >> 1, half = lane & 1;  // softmax: row of the warp, half of the columns
  const int D = a.D, H = a.H, Tq = a.Tq, Tk = a.Tk;
  const int hd = D / H, h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * kTile;
  const bf16* q_g = a.q + static_cast<size_t>(b) * Tq * a.q_stride + h * hd;
  const bf16* k_g = a.k + static_cast<size_t>(b) * Tk * a.kv_stride + h * hd;
  const bf16* v_g = a.v + static_cast<size_t>(b) * Tk * a.kv_stride + h * hd;
  float* s_w = s_all + warp * 16 * kSLd;
  bf16* p_w = p_all + warp * 16 * kPLd;
  const bf16* q_w = q_s + warp * 16 * kLd;

  LoadTile<HDP>(q_s, q_g + q0 * a.q_stride, a.q_stride, min(kTile, Tq - q0), hd);

  FragC o[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j)
    wmma::fill_fragment(o[j], 0.0f);
  float m = -INFINITY, l = 0.0f;  // running max (log2 units) and sum of the lane's row

  for (int kv0 = 0; kv0 < Tk; kv0 += kTile) {
    __syncthreads();  // every warp is done with the previous k and v tiles
    LoadTile<HDP>(k_s, k_g + kv0 * a.kv_stride, a.kv_stride, min(kTile, Tk - kv0), hd);
    LoadTile<HDP>(v_s, v_g + kv0 * a.kv_stride, a.kv_stride, min(kTile, Tk - kv0), hd);
    __syncthreads();

    // S = Q_w·Kᵀ: Kᵀ (dim × key) is k_s read column-major.
    {
      FragC s[kTile / 16];
#pragma unroll
      for (int n = 0; n < kTile / 16; ++n)
        wmma::fill_fragment(s[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < kN; ++kk) {
        FragA a;
        wmma::load_matrix_sync(a, q_w + kk * 16, kLd);
#pragma unroll
        for (int n = 0; n < kTile / 16; ++n) {
          FragBT bt;
          wmma::load_matrix_sync(bt, k_s + n * 16 * kLd + kk * 16, kLd);
          wmma::mma_sync(s[n], a, bt, s[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kTile / 16; ++n)
        wmma::store_matrix_sync(s_w + n * 16, s[n], kSLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on row `row`, columns half·32 … half·32+31; keys past Tk score −∞.
    float* s_row = s_w + row * kSLd + half * 32;
    bf16* p_row = p_w + row * kPLd + half * 32;
    const int key0 = kv0 + half * 32;
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float x = key0 + c < Tk ? s_row[c] * scale_log2 : -INFINITY;
      s_row[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // Key kv0 < Tk is in every tile, so m_new is finite; on the first tile m = −∞ gives α = 0.
    const float m_new = fmaxf(m, mx);
    const float alpha = exp2f(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(s_row[c] - m_new);
      p_row[c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;

    // O = O·α + P·V (ScaleRows syncs the warp, so p_w is complete before it is read).
    ScaleRows(o, alpha, s_w);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA a;
      wmma::load_matrix_sync(a, p_w + kk * 16, kPLd);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        FragB bv;
        wmma::load_matrix_sync(bv, v_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(o[j], a, bv, o[j]);
      }
    }
  }

  ScaleRows(o, 1.0f / l, s_w);
  const int q = q0 + warp * 16 + row;
  if (half == 0 && q < Tq) lse[(static_cast<size_t>(b) * H + h) * Tq + q] = (m + log2f(l)) * kLn2;
  bf16* out_g = out + static_cast<size_t>(b) * Tq * D + h * hd;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    StoreFragBf16(o[j], s_w, out_g, D, q0 + warp * 16, j * 16, Tq, hd);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: delta[b, h, t] = Σ_d dout·out over the head (fp32), and zeroes the fp32 dq
// accumulator [B, Tq, D]. One warp per (b, t, h), in that order so that warps read contiguously.
// (The flash and batched-GEMM backwards take AttentionDelta, flash_kernels.h's Delta, which has
// no accumulator to zero; this one is the fused backward's, head dims up to 160.)
__global__ void __launch_bounds__(kThreads)
    AttentionDeltaKernel(float* __restrict__ delta, float* __restrict__ dq,
                         const bf16* __restrict__ dout, const bf16* __restrict__ out, int B, int T,
                         int D, int H) {
  const int lane = threadIdx.x % 32;
  const size_t r = static_cast<size_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= static_cast<size_t>(B) * T * H) return;
  const int hd = D / H, h = static_cast<int>(r % H);
  const size_t bt = r / H;  // b·T + t
  const size_t base = bt * D + h * hd;
  float sum = 0.0f;
  for (int d = lane; d < hd; d += 32) {
    sum += __bfloat162float(dout[base + d]) * __bfloat162float(out[base + d]);
    dq[base + d] = 0.0f;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const size_t b = bt / T, t = bt % T;
  if (lane == 0) delta[(b * H + h) * T + t] = sum;
}

// Backward, step 2. Grid (ceil(Tk/64), H, B): a block owns 64 keys; warp w owns keys
// k0+16w … k0+16w+15 and keeps their dK and dV (16 × HDP each, fp32) in accumulator fragments.
// It loops over 64-query tiles:
//   Sᵀ  = K_w·Qᵀ, dPᵀ = V_w·dOᵀ                     (16 × 64 each, fp32 scratch)
//   Pᵀ  = exp2(Sᵀ·scale·log2 e − lse·log2 e),  dSᵀ = Pᵀ ∘ (dPᵀ − delta)   (bf16, per column q)
//   dV_w += Pᵀ·dO,  dK_w += dSᵀ·Q
//   then, with every warp's dSᵀ in shared memory, warp w computes dQ for queries
//   q0+16w … q0+16w+15: dS·K over the block's 64 keys, and atomically adds scale·dQ into the
//   fp32 accumulator.
// At the end dK is scaled by `scale`, and dK, dV go to dk, dv (row stride kv_stride) as bf16.
//
// Dynamic shared memory, in order:
//   k, v    [64][HDP+8] bf16   the block's keys and values (zero past T and past hd)
//   q, do   [64][HDP+8] bf16   the current query tile and its dout rows
//   pt, dst [64][72]    bf16   Pᵀ and dSᵀ of the tile (row = key of the block, col = query)
//   s, dp   4 × [16][68] fp32  per warp: its Sᵀ and dPᵀ rows; s is reused to stage dQ, dK, dV
//   lse2, delta [64] fp32      per query of the tile: lse·log2 e and delta
template <int HDP>
constexpr int BackwardSmemBytes() {
  return 4 * TileBytes<HDP>() + 2 * kProbBytes + 2 * kScratchBytes + 2 * kTile * 4;
}

template <int HDP>
__global__ void __launch_bounds__(kThreads)
    AttentionBackwardKernel(bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ dq,
                            const bf16* __restrict__ dout, Operands a,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            float scale) {
  constexpr int kLd = TileLd<HDP>();
  constexpr int kN = HDP / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = k_s + kTile * kLd;
  bf16* q_s = v_s + kTile * kLd;
  bf16* do_s = q_s + kTile * kLd;
  bf16* pt_s = do_s + kTile * kLd;
  bf16* dst_s = pt_s + kTile * kPLd;
  float* s_all = reinterpret_cast<float*>(dst_s + kTile * kPLd);
  float* dp_all = s_all + kWarps * 16 * kSLd;
  float* lse2_s = dp_all + kWarps * 16 * kSLd;
  float* delta_s = lse2_s + kTile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = lane >> 1, half = lane & 1;  // elementwise pass: key row, half of the queries
  const int D = a.D, H = a.H, Tq = a.Tq, Tk = a.Tk;
  const int hd = D / H, h = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kTile;
  const size_t kv_off = static_cast<size_t>(b) * Tk * a.kv_stride + h * hd;
  const bf16* q_g = a.q + static_cast<size_t>(b) * Tq * a.q_stride + h * hd;
  const bf16* do_g = dout + static_cast<size_t>(b) * Tq * D + h * hd;
  const float* lse_g = lse + (static_cast<size_t>(b) * H + h) * Tq;
  const float* delta_g = delta + (static_cast<size_t>(b) * H + h) * Tq;
  float* dq_g = dq + static_cast<size_t>(b) * Tq * D + h * hd;
  float* s_w = s_all + warp * 16 * kSLd;
  float* dp_w = dp_all + warp * 16 * kSLd;
  const float scale_log2 = scale * kLog2e;

  LoadTile<HDP>(k_s, a.k + kv_off + k0 * a.kv_stride, a.kv_stride, min(kTile, Tk - k0), hd);
  LoadTile<HDP>(v_s, a.v + kv_off + k0 * a.kv_stride, a.kv_stride, min(kTile, Tk - k0), hd);

  FragC dk_acc[kN], dv_acc[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    wmma::fill_fragment(dk_acc[j], 0.0f);
    wmma::fill_fragment(dv_acc[j], 0.0f);
  }
  const bf16* k_w = k_s + warp * 16 * kLd;
  const bf16* v_w = v_s + warp * 16 * kLd;
  const int key = k0 + warp * 16 + row;  // the key of the lane's row in the elementwise pass

  for (int q0 = 0; q0 < Tq; q0 += kTile) {
    __syncthreads();  // every warp is done with the previous q, do, pt, dst, lse2, delta
    const int rows = min(kTile, Tq - q0);
    LoadTile<HDP>(q_s, q_g + q0 * a.q_stride, a.q_stride, rows, hd);
    LoadTile<HDP>(do_s, do_g + q0 * static_cast<size_t>(D), D, rows, hd);
    if (threadIdx.x < kTile) {
      const bool valid = static_cast<int>(threadIdx.x) < rows;
      lse2_s[threadIdx.x] = valid ? lse_g[q0 + threadIdx.x] * kLog2e : 0.0f;
      delta_s[threadIdx.x] = valid ? delta_g[q0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();

    // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ: Qᵀ and dOᵀ (dim × query) are q_s, do_s read column-major.
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      FragC s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kN; ++kk) {
        FragA a;
        FragBT bt;
        wmma::load_matrix_sync(a, k_w + kk * 16, kLd);
        wmma::load_matrix_sync(bt, q_s + n * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(s, a, bt, s);
        wmma::load_matrix_sync(a, v_w + kk * 16, kLd);
        wmma::load_matrix_sync(bt, do_s + n * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(dp, a, bt, dp);
      }
      wmma::store_matrix_sync(s_w + n * 16, s, kSLd, wmma::mem_row_major);
      wmma::store_matrix_sync(dp_w + n * 16, dp, kSLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Elementwise: the lane's key row, queries half·32 … half·32+31 of the tile. P is forced
    // to 0 past Tk and Tq (those rows of Q, K, V, dO are zero but lse would not be).
    {
      const float* s_row = s_w + row * kSLd + half * 32;
      const float* dp_row = dp_w + row * kSLd + half * 32;
      bf16* pt_row = pt_s + (warp * 16 + row) * kPLd + half * 32;
      bf16* dst_row = dst_s + (warp * 16 + row) * kPLd + half * 32;
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const int qi = half * 32 + c;
        const float p = key < Tk && qi < rows ? exp2f(s_row[c] * scale_log2 - lse2_s[qi]) : 0.0f;
        pt_row[c] = __float2bfloat16(p);
        dst_row[c] = __float2bfloat16(p * (dp_row[c] - delta_s[qi]));
      }
    }
    __syncwarp();

    // dV_w += Pᵀ_w·dO, dK_w += dSᵀ_w·Q (contraction over the tile's 64 queries).
    const bf16* pt_w = pt_s + warp * 16 * kPLd;
    const bf16* dst_w = dst_s + warp * 16 * kPLd;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA ap, ads;
      wmma::load_matrix_sync(ap, pt_w + kk * 16, kPLd);
      wmma::load_matrix_sync(ads, dst_w + kk * 16, kPLd);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        FragB bm;
        wmma::load_matrix_sync(bm, do_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(dv_acc[j], ap, bm, dv_acc[j]);
        wmma::load_matrix_sync(bm, q_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(dk_acc[j], ads, bm, dk_acc[j]);
      }
    }
    __syncthreads();  // every warp's dSᵀ rows are in dst_s

    // dQ for queries q0+16w … +15: dS (query × key) is dst_s read column-major.
#pragma unroll 1
    for (int j = 0; j < kN; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragAT a;
        FragB bk;
        wmma::load_matrix_sync(a, dst_s + kk * 16 * kPLd + warp * 16, kPLd);
        wmma::load_matrix_sync(bk, k_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(acc, a, bk, acc);
      }
      __syncwarp();  // the lanes are done with what s_w held
      wmma::store_matrix_sync(s_w, acc, kSLd, wmma::mem_row_major);
      __syncwarp();
      const int qr = q0 + warp * 16 + row, c0 = j * 16 + half * 8;
      if (qr < Tq && c0 < hd) {
        float* dst = dq_g + static_cast<size_t>(qr) * D + c0;
#pragma unroll
        for (int c = 0; c < 8; ++c)
          atomicAdd(dst + c, scale * s_w[row * kSLd + half * 8 + c]);
      }
    }
  }

  bf16* dk_g = dk + kv_off;
  bf16* dv_g = dv + kv_off;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int i = 0; i < dk_acc[j].num_elements; ++i)
      dk_acc[j].x[i] *= scale;
    StoreFragBf16(dk_acc[j], s_w, dk_g, a.kv_stride, k0 + warp * 16, j * 16, Tk, hd);
    StoreFragBf16(dv_acc[j], s_w, dv_g, a.kv_stride, k0 + warp * 16, j * 16, Tk, hd);
  }
}

// Backward, step 3: the fp32 dq accumulator [B, Tq, D] → dq_out (bf16, row stride q_stride).
__global__ void AttentionDqKernel(bf16* __restrict__ dq_out, const float* __restrict__ dq, size_t n,
                                  int D, size_t q_stride) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t bt = i / D, c = i % D;
  dq_out[bt * q_stride + c] = __float2bfloat16(dq[i]);
}

// ---------------------------------------------------------------------------------------------
// Launchers.

void CheckShape(const Operands& a, int B) {
  CheckAttentionShape(a.q, a.k, a.v, a.q_stride, a.kv_stride, B, a.Tq, a.Tk, a.D, a.H,
                      kMaxAttentionHeadDim);
}

// The padded head dim a head dim runs with.
int PaddedHeadDim(int hd) {
  return hd <= 64 ? 64 : hd <= 80 ? 80 : hd <= 128 ? 128 : 160;
}

// Raises a kernel's dynamic shared memory limit past the default 48 KiB, once per kernel.
// (The attribute belongs to the current device; a process drives one GPU.)
template <typename Kernel>
void AllowSmem(Kernel kernel, int bytes) {
  DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int HDP>
void LaunchForward(bf16* out, float* lse, const Operands& a, int B, cudaStream_t stream) {
  constexpr int kSmem = ForwardSmemBytes<HDP>();
  static const bool configured = (AllowSmem(AttentionForwardKernel<HDP>, kSmem), true);
  (void)configured;
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(a.D / a.H));
  const dim3 grid((a.Tq + kTile - 1) / kTile, a.H, B);
  AttentionForwardKernel<HDP><<<grid, kThreads, kSmem, stream>>>(out, lse, a, scale_log2);
  DT_CUDA_CHECK_LAUNCH();
}

template <int HDP>
void LaunchBackward(bf16* dk, bf16* dv, float* dq, const bf16* dout, const Operands& a,
                    const float* lse, const float* delta, int B, cudaStream_t stream) {
  constexpr int kSmem = BackwardSmemBytes<HDP>();
  static const bool configured = (AllowSmem(AttentionBackwardKernel<HDP>, kSmem), true);
  (void)configured;
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.D / a.H));
  const dim3 grid((a.Tk + kTile - 1) / kTile, a.H, B);
  AttentionBackwardKernel<HDP>
      <<<grid, kThreads, kSmem, stream>>>(dk, dv, dq, dout, a, lse, delta, scale);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CheckAttentionShape(const bf16* q, const bf16* k, const bf16* v, size_t q_stride,
                         size_t kv_stride, int B, int Tq, int Tk, int D, int H, int max_head_dim) {
  DT_CHECK(B > 0 && Tq > 0 && Tk > 0 && D > 0 && H > 0,
           "attention shape B={} Tq={} Tk={} D={} H={}", B, Tq, Tk, D, H);
  DT_CHECK(D % H == 0, "hidden size {} is not divisible by {} heads", D, H);
  const int hd = D / H;
  DT_CHECK(hd % 8 == 0 && hd <= max_head_dim, "head dim {} must be a multiple of 8 up to {}", hd,
           max_head_dim);
  for (const void* p :
       {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v)}) {
    DT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "q, k and v must be 16-byte aligned");
  }
  DT_CHECK(q_stride % 8 == 0 && kv_stride % 8 == 0,
           "row strides {} (q) and {} (k, v) must be multiples of 8 elements", q_stride, kv_stride);
}

void AttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                      size_t q_stride, size_t kv_stride, int B, int Tq, int Tk, int D, int H,
                      cudaStream_t stream) {
  const Operands a{q, k, v, q_stride, kv_stride, Tq, Tk, D, H};
  CheckShape(a, B);
  DT_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "out is not 16-byte aligned");
  switch (PaddedHeadDim(D / H)) {
    case 64:
      return LaunchForward<64>(out, lse, a, B, stream);
    case 80:
      return LaunchForward<80>(out, lse, a, B, stream);
    case 128:
      return LaunchForward<128>(out, lse, a, B, stream);
    default:
      return LaunchForward<160>(out, lse, a, B, stream);
  }
}

void AttentionForward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                      cudaStream_t stream) {
  AttentionForward(out, lse, qkv, qkv + D, qkv + 2 * D, 3 * size_t(D), 3 * size_t(D), B, T, T, D, H,
                   stream);
}

size_t AttentionSharedBytes(int hd) {
  switch (PaddedHeadDim(hd)) {
    case 64:
      return std::max(ForwardSmemBytes<64>(), BackwardSmemBytes<64>());
    case 80:
      return std::max(ForwardSmemBytes<80>(), BackwardSmemBytes<80>());
    case 128:
      return std::max(ForwardSmemBytes<128>(), BackwardSmemBytes<128>());
    default:
      return std::max(ForwardSmemBytes<160>(), BackwardSmemBytes<160>());
  }
}

// delta [B, H, Tq], then the dq accumulator [B, Tq, D].
size_t AttentionBackwardWorkspace(int B, int Tq, int D, int H) {
  return static_cast<size_t>(B) * H * Tq + static_cast<size_t>(B) * Tq * D;
}

void AttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                       const bf16* v, size_t q_stride, size_t kv_stride, const bf16* out,
                       const float* lse, float* workspace, int B, int Tq, int Tk, int D, int H,
                       cudaStream_t stream) {
  const Operands a{q, k, v, q_stride, kv_stride, Tq, Tk, D, H};
  CheckShape(a, B);
  for (const void* p : {static_cast<const void*>(dq), static_cast<const void*>(dk),
                        static_cast<const void*>(dv), static_cast<const void*>(dout)}) {
    DT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
             "dq, dk, dv and dout must be 16-byte aligned");
  }
  float* delta = workspace;
  float* dq_acc = workspace + static_cast<size_t>(B) * H * Tq;
  const size_t rows = static_cast<size_t>(B) * Tq * H;
  AttentionDeltaKernel<<<BlocksFor(rows, kWarps), kThreads, 0, stream>>>(delta, dq_acc, dout, out,
                                                                         B, Tq, D, H);
  DT_CUDA_CHECK_LAUNCH();
  switch (PaddedHeadDim(D / H)) {
    case 64:
      LaunchBackward<64>(dk, dv, dq_acc, dout, a, lse, delta, B, stream);
      break;
    case 80:
      LaunchBackward<80>(dk, dv, dq_acc, dout, a, lse, delta, B, stream);
      break;
    case 128:
      LaunchBackward<128>(dk, dv, dq_acc, dout, a, lse, delta, B, stream);
      break;
    default:
      LaunchBackward<160>(dk, dv, dq_acc, dout, a, lse, delta, B, stream);
      break;
  }
  const size_t n = static_cast<size_t>(B) * Tq * D;
  AttentionDqKernel<<<BlocksFor(n, 256), 256, 0, stream>>>(dq, dq_acc, n, D, q_stride);
  DT_CUDA_CHECK_LAUNCH();
}

void AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                       const float* lse, float* workspace, int B, int T, int D, int H,
                       cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  AttentionBackward(dqkv, dqkv + D, dqkv + 2 * D, dout, qkv, qkv + D, qkv + 2 * D, stride, stride,
                    out, lse, workspace, B, T, T, D, H, stream);
}

}  // namespace difftrain::cuda
