// Flash attention over short sequences — at most kShortRows (16) queries and keys, Latte's
// temporal attention across 16 frames — written, like flash_kernels.h, once against the warp
// primitives for nvcc (model/cuda/flash_attention.cu) and the CPU emulator (model/simt).
//
// Why separate kernels: flash_kernels.h's blocks own 64 query rows (128 for the wide forward) and
// loop over tiles of 64 keys, so a 16-frame sequence fills a quarter of each: three warps of four
// have no query, and three quarters of every key tile are zeros multiplied. On an H100 Latte-L/2's
// temporal attention at micro-batch 8 (2,048 sequences × 16 heads, hd 64) took 256 µs forward and
// 793 µs backward with the two-stage kernels, against ~90 and ~180 µs for its bytes at the
// memory's rate (docs/benchmarks.md). Here one warp owns a whole sequence and head: its 16 query
// rows are one m-tile and its keys two n-tiles, so no product runs on padding and no warp idles,
// and the backward is one kernel — delta, dQ, dK and dV from operands read from memory once —
// where the general one is three (delta, dQ, dK/dV), each reading q, k, v and dout again.
//
// A block is kWarps warps: kWarps consecutive (sequence, head) pairs, sequence b's head h pair
// b·H + h, so a block's warps read neighbouring heads of one sequence (contiguous columns). Every
// thread of the block copies (cp.async) part of every warp's tiles, then one block barrier, so
// that each warp's 16-row tiles sit in its own shared memory (rows past T and columns past hd
// zero, as flash_kernels.h's LoadRows leaves them).
//
// The products, the softmax and the masks are flash_kernels.h's, on tiles of 16 rows instead of
// 64 with zeros past T: the same bits as the general kernels (the emulator and the GPU tests
// compare them), since the general kernels' extra columns and k-steps add exact zeros.
//   Forward: S = Q·Kᵀ, the softmax of one tile (OnlineSoftmax from −∞), O = P·V / l, lse.
//   Backward: delta = Σ_d dout·out per row (Delta's 8-column dot products, summed in order);
//     dQ = dS·K·scale from S = Q·Kᵀ and dP = dO·Vᵀ (query rows), then dV = Pᵀ·dO and
//     dK = dSᵀ·Q·scale from Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (key rows): 7 small products, as the
//     general backward computes them, none of them on padding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "model/cuda/flash_kernels.h"
#include "model/cuda/simt_portable.h"

namespace difftrain::flash {

inline constexpr int kShortRows = 16;

constexpr bool ShortFits(int Tq, int Tk) {
  return Tq > 0 && Tk > 0 && Tq <= kShortRows && Tk <= kShortRows;
}
// Blocks for `sequences` sequences of H heads.
constexpr long long ShortBlocks(int sequences, int H) {
  return (static_cast<long long>(sequences) * H + kWarps - 1) / kWarps;
}

// A warp's 16-row tile (elements), and the shared memory each kernel takes per warp and per
// block: the forward's q, k, v tiles; the backward's q, k, v, dout and out tiles, then delta's
// 8-column dot products [16][HDP/8] and each query's lse·log2 e and delta (floats).
template <int HDP>
constexpr int ShortTile() {
  return kShortRows * Ld<HDP>();
}
template <int HDP>
constexpr size_t ShortForwardWarpBytes() {
  return size_t(3) * ShortTile<HDP>() * 2;
}
template <int HDP>
constexpr size_t ShortBackwardWarpBytes() {
  return size_t(5) * ShortTile<HDP>() * 2 + (kShortRows * (HDP / 8) + 2 * kShortRows) * 4;
}
template <int HDP>
constexpr size_t ShortForwardSmemBytes() {
  return kWarps * ShortForwardWarpBytes<HDP>();
}
template <int HDP>
constexpr size_t ShortBackwardSmemBytes() {
  return kWarps * ShortBackwardWarpBytes<HDP>();
}

// Where warp w of the calling block works: whether it has a pair, that pair's sequence b and
// head h, and the operands' offsets to them (q, dq; k, v, dk, dv; out, dout; lse).
struct ShortPlace {
  bool active = false;
  int b = 0, h = 0;
  size_t q_off = 0, kv_off = 0, o_off = 0, stat_off = 0;
};

template <class P>
DT_SIMT ShortPlace LocateShort(const Operands& a, int sequences, int w) {
  ShortPlace p;
  const long long pair = static_cast<long long>(P::BlockX()) * kWarps + w;
  if (pair >= static_cast<long long>(sequences) * a.H) return p;
  const int hd = a.D / a.H;
  p.active = true;
  p.b = static_cast<int>(pair / a.H);
  p.h = static_cast<int>(pair % a.H);
  p.q_off = SequenceOffset(a, p.b, a.Tq, a.q_stride, a.q_inner) + p.h * hd;
  p.kv_off = SequenceOffset(a, p.b, a.Tk, a.kv_stride, a.kv_inner) + p.h * hd;
  p.o_off = SequenceOffset(a, p.b, a.Tq, a.OutStride(), a.o_inner) + p.h * hd;
  p.stat_off = (size_t(p.b) * a.H + p.h) * a.Tq;
  return p;
}

// Every warp's tiles (each warp's region warp_elems elements apart, tile i at i·ShortTile): for
// each warp, load(w, place, tiles) issues its copies (LoadRows over the whole block); then the
// wait and one barrier.
template <int HDP, class P, class Load>
DT_SIMT void LoadShortTiles(uint16_t* smem, int warp_elems, const Operands& a, int sequences,
                            Load&& load) {
  for (int w = 0; w < kWarps; ++w)
    load(LocateShort<P>(a, sequences, w), smem + w * warp_elems);
  P::CommitGroup();
  P::WaitAll();
  P::SyncThreads();
}

// ---------------------------------------------------------------------------------------------
// Forward. Grid (ShortBlocks(sequences, H)).
template <int HDP, class P>
DT_SIMT void ShortForward(const ForwardArgs& args, int sequences) {
  constexpr int kN = HDP / 8, kTile = ShortTile<HDP>();
  const Operands& a = args.in;
  uint16_t* smem = reinterpret_cast<uint16_t*>(P::Smem());
  const int lane = P::Thread() % 32, warp = P::Thread() / 32, tq = lane & 3, hd = a.D / a.H;
  LoadShortTiles<HDP, P>(smem, 3 * kTile, a, sequences, [&](const ShortPlace& at, uint16_t* t) {
    const int q_rows = at.active ? a.Tq : 0, kv_rows = at.active ? a.Tk : 0;
    LoadRows<HDP, P, true>(t, kShortRows, a.q + at.q_off, a.q_stride, q_rows, hd);
    LoadRows<HDP, P, true>(t + kTile, kShortRows, a.k + at.kv_off, a.kv_stride, kv_rows, hd);
    LoadRows<HDP, P, true>(t + 2 * kTile, kShortRows, a.v + at.kv_off, a.kv_stride, kv_rows, hd);
  });
  const ShortPlace at = LocateShort<P>(a, sequences, warp);
  if (!at.active) return;
  const uint16_t* q_s = smem + warp * 3 * kTile;
  const uint16_t* k_s = q_s + kTile;
  const uint16_t* v_s = k_s + kTile;

  float s[kShortRows / 8][4] = {};
  MmaABt<HDP, kShortRows / 8, P>(s, q_s, 0, k_s, lane);
  float o[kN][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  OnlineSoftmax<kShortRows, kN, P>(s, o, m, l, 0, a.Tk, tq, a.scale * kLog2e);
  MmaSB<HDP, kShortRows, P>(o, s, v_s, lane);

  const float inv_l[2] = {1.0f / l[0], 1.0f / l[1]};
  StoreRows<HDP, P>(o, inv_l, args.out + at.o_off, a.OutStride(), 0, a.Tq, hd, lane);
  if (tq == 0) {
    DT_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int q = (lane >> 2) + 8 * r;
      if (q < a.Tq) args.lse[at.stat_off + q] = (m[r] + P::Log2(l[r])) * kLn2;
    }
  }
}

// Where args.dq_sums is non-null, the column sums of a warp's 16 rows of acc·factor (rows past T
// are zeros) into columns 0 … hd−1 of its sequence's row of `sums` (BackwardArgs: row b of a
// [sequences, sums_stride] matrix, head h's columns from h·hd), as computed in fp32.
template <int HDP, class P>
DT_SIMT void StoreShortColumnSums(const float (&acc)[HDP / 8][4], float factor, float* sums,
                                  const BackwardArgs& args, const ShortPlace& at, int hd,
                                  int lane) {
  if (args.dq_sums == nullptr) return;
  float* row = sums + size_t(at.b) * args.sums_stride + size_t(at.h) * hd;
  WarpColumnSums<HDP, P>(acc, lane, [&](int c, float v) {
    if (c < hd) row[c] = v * factor;
  });
}

// ---------------------------------------------------------------------------------------------
// Backward: dq, dk, dv (written) from dout, given the forward's out and lse (args.delta is not
// read: delta is computed here), and with args.dq_sums their column sums, a row a sequence (with
// the packed qkv's layout, dk_sums = dq_sums + D, dv_sums + 2·D, stride 3·D: summed over the
// rows, the qkv Linear's bias gradient). Grid (ShortBlocks(sequences, H)).
template <int HDP, class P>
DT_SIMT void ShortBackward(const BackwardArgs& args, int sequences) {
  constexpr int kN = HDP / 8, kTile = ShortTile<HDP>();
  constexpr int kWarpElems = static_cast<int>(ShortBackwardWarpBytes<HDP>() / 2);
  const Operands& a = args.in;
  uint16_t* smem = reinterpret_cast<uint16_t*>(P::Smem());
  const int lane = P::Thread() % 32, warp = P::Thread() / 32, tq = lane & 3, hd = a.D / a.H;
  LoadShortTiles<HDP, P>(smem, kWarpElems, a, sequences, [&](const ShortPlace& at, uint16_t* t) {
    const int q_rows = at.active ? a.Tq : 0, kv_rows = at.active ? a.Tk : 0;
    LoadRows<HDP, P, true>(t, kShortRows, a.q + at.q_off, a.q_stride, q_rows, hd);
    LoadRows<HDP, P, true>(t + kTile, kShortRows, a.k + at.kv_off, a.kv_stride, kv_rows, hd);
    LoadRows<HDP, P, true>(t + 2 * kTile, kShortRows, a.v + at.kv_off, a.kv_stride, kv_rows, hd);
    LoadRows<HDP, P, true>(t + 3 * kTile, kShortRows, args.dout + at.o_off, a.OutStride(), q_rows,
                           hd);
    LoadRows<HDP, P, true>(t + 4 * kTile, kShortRows, args.out + at.o_off, a.OutStride(), q_rows,
                           hd);
  });
  const ShortPlace at = LocateShort<P>(a, sequences, warp);
  const uint16_t* q_s = smem + warp * kWarpElems;
  const uint16_t* k_s = q_s + kTile;
  const uint16_t* v_s = k_s + kTile;
  const uint16_t* do_s = v_s + kTile;
  const uint16_t* o_s = do_s + kTile;
  float* dots = reinterpret_cast<float*>(smem + warp * kWarpElems + 5 * kTile);  // [16][kN]
  float* lse2_s = dots + kShortRows * kN;  // lse·log2 e of each query row, 0 past Tq
  float* delta_s = lse2_s + kShortRows;    // delta of each query row, 0 past Tq

  // delta, as Delta sums it: each 8 columns' dot product, then the head's in order.
  const int chunks = hd / 8;
  if (at.active) {
    for (int i = lane; i < kShortRows * chunks; i += 32) {
      const int r = i / chunks, c = i % chunks;
      alignas(16) uint16_t g[8], o[8];
      P::Copy16(g, do_s + r * Ld<HDP>() + c * 8);
      P::Copy16(o, o_s + r * Ld<HDP>() + c * 8);
      dots[r * kN + c] = Dot8<P>(g, o);
    }
  }
  P::SyncThreads();
  if (at.active && lane < kShortRows) {
    const bool valid = lane < a.Tq;
    float sum = 0;
    for (int j = 0; j < chunks; ++j)
      sum += dots[lane * kN + j];
    lse2_s[lane] = valid ? args.lse[at.stat_off + lane] * kLog2e : 0.0f;
    delta_s[lane] = valid ? sum : 0.0f;
  }
  P::SyncThreads();
  if (!at.active) return;
  const float sl2 = a.scale * kLog2e;
  constexpr int kNT = kShortRows / 8;  // the n-tiles of a score tile

  // dQ: query rows lane/4 and lane/4 + 8 (BackwardDq's arithmetic, ScoreGradientRows).
  {
    float lse2[2], delta[2];
    DT_UNROLL
    for (int r = 0; r < 2; ++r) {
      lse2[r] = lse2_s[(lane >> 2) + 8 * r];
      delta[r] = delta_s[(lane >> 2) + 8 * r];
    }
    float s[kNT][4] = {}, dp[kNT][4] = {};
    MmaABt<HDP, kNT, P>(s, q_s, 0, k_s, lane);
    MmaABt<HDP, kNT, P>(dp, do_s, 0, v_s, lane);
    ScoreGradientRows<kNT, P>(s, dp, lse2, delta, 0, a.Tk, tq, sl2);
    float dq[kN][4] = {};
    MmaSB<HDP, kShortRows, P>(dq, s, k_s, lane);
    const float scale[2] = {a.scale, a.scale};
    StoreRows<HDP, P>(dq, scale, args.dq + at.q_off, a.q_stride, 0, a.Tq, hd, lane);
    StoreShortColumnSums<HDP, P>(dq, a.scale, args.dq_sums, args, at, hd, lane);
  }
  // dK and dV: key rows lane/4 and lane/4 + 8 (BackwardDkv's, ScoreGradientColumns).
  float st[kNT][4] = {}, dpt[kNT][4] = {};
  MmaABt<HDP, kNT, P>(st, k_s, 0, q_s, lane);
  MmaABt<HDP, kNT, P>(dpt, v_s, 0, do_s, lane);
  ScoreGradientColumns<kNT, P>(st, dpt, lse2_s, delta_s, lane >> 2, a.Tk, 0, a.Tq, tq, sl2);
  float dk[kN][4] = {}, dv[kN][4] = {};
  MmaSB<HDP, kShortRows, P>(dv, st, do_s, lane);
  MmaSB<HDP, kShortRows, P>(dk, dpt, q_s, lane);
  const float one[2] = {1.0f, 1.0f}, scale[2] = {a.scale, a.scale};
  StoreRows<HDP, P>(dk, scale, args.dk + at.kv_off, a.kv_stride, 0, a.Tk, hd, lane);
  StoreShortColumnSums<HDP, P>(dk, a.scale, args.dk_sums, args, at, hd, lane);
  StoreRows<HDP, P>(dv, one, args.dv + at.kv_off, a.kv_stride, 0, a.Tk, hd, lane);
  StoreShortColumnSums<HDP, P>(dv, 1.0f, args.dv_sums, args, at, hd, lane);
}

}  // namespace difftrain::flash
