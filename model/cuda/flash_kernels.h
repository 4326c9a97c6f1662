// The flash-attention kernels' bodies, written once against warp primitives so that nvcc
// compiles them for the GPU (model/cuda/flash_attention.cu, with device_primitives.cuh: ldmatrix
// and mma.sync in PTX) and the CPU emulator runs them in every test run (model/simt: the same
// fragment layouts, element by element). No CUDA header is needed here.
//
// FlashAttention-2's scheme on mma.sync.m16n8k16 (bf16 in, fp32 accumulate): a block of 4 warps
// owns 64 rows (queries, or keys for dK and dV), 16 a warp, and loops over tiles of the other
// side (64 rows; 32 where hd > 80, for registers). Scores live in registers: an m16n8 fp32
// accumulator tile holds, per lane, rows lane/4 and lane/4 + 8 at columns 2·(lane%4) and +1,
// which is exactly how an m16n8k16 A operand holds a 16×16 block, so two score tiles, rounded
// to bf16, are the next product's A without going through shared memory. Operands come from
// shared memory through ldmatrix (.trans where the tile holds the product's k along its rows).
// The backward pass is two kernels and no atomics, so it is deterministic: dK and dV with the
// block's keys against every query tile, dQ with the block's queries against every key tile
// (S and dP are computed twice: 7 products instead of FlashAttention-2's 5), or, with stored
// scores, dK and dV first, storing dSᵀ, and dQ from it (BackwardDqStored: 5 products, dS's round
// trip through memory instead of the two recomputed).
//
// kStages: 1, the loop's tile is loaded by ordinary 16-byte copies between two barriers; 2,
// double-buffered: tile t+1 is copied asynchronously (cp.async) into the other half of shared
// memory while tile t is computed on, which takes the loads' latency off the loop but adds a
// second tile's shared memory. Same results bit for bit.
//
// The primitives P provides (static): Thread(), BlockX/Y/Z(), Smem(), SyncThreads(),
// LdMatrixX4(r, row), LdMatrixX4Trans(r, row), Mma(d, a, b0, b1), ShflXor(v, mask),
// PackBf16x2(lo, hi) (round to nearest even, lo in the low half), Bf16ToFloat(bits), Exp2,
// Log2, Copy16(dst, src), Zero16(dst), Store32(dst, v); with kStages = 2 also CopyAsync16(dst, src)
// (cp.async of 16 bytes to shared memory), CommitGroup(), WaitPrior() (all committed groups but the
// newest have landed) and WaitAll().
//
// Layout (model/cuda/attention.h's): q [B, Tq, ·] and k, v [B, Tk, ·] bf16 with their own row
// strides (multiples of 8), head h at columns h·hd … h·hd+hd−1; out and dout [B, Tq, D]; lse
// and delta [B, H, Tq] fp32 (lse: natural log of the scaled scores' exponential sums).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "model/cuda/simt_portable.h"

namespace difftrain::flash {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRows = 16 * kWarps;  // the rows a block owns
inline constexpr int kMaxHeadDim = 128;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Head dims run zero-padded to a multiple of 16 (the products' k): 64, 80 or 128.
constexpr int PaddedHeadDim(int hd) {
  return hd <= 64 ? 64 : hd <= 80 ? 80 : 128;
}
// Returns f(std::integral_constant<int, HDP>()) for the padded head dim of hd.
template <class F>
auto WithPaddedHeadDim(int hd, F&& f) {
  switch (PaddedHeadDim(hd)) {
    case 64:
      return f(std::integral_constant<int, 64>());
    case 80:
      return f(std::integral_constant<int, 80>());
    default:
      return f(std::integral_constant<int, 128>());
  }
}
// Leading dim of a shared tile (elements): +8 puts the 8 rows an ldmatrix reads in 8 different
// 16-byte bank groups and keeps every row 16-byte aligned.
template <int HDP>
constexpr int Ld() {
  return HDP + 8;
}
// Rows of the tiles a block loops over.
template <int HDP>
constexpr int InnerTile() {
  return HDP <= 80 ? 64 : 32;
}

// Shared memory (bytes): the forward's q tile (kMTiles·64 rows) and kStages k, v tiles; dQ's q and
// dout, and kStages k, v; dK/dV's k and v, and kStages q, dout tiles with each query tile's
// lse·log2 e and delta.
template <int HDP, int kStages = 1, int kMTiles = 1>
constexpr size_t ForwardSmemBytes() {
  return size_t(kRows * kMTiles + kStages * 2 * InnerTile<HDP>()) * Ld<HDP>() * 2;
}
template <int HDP, int kStages = 1>
constexpr size_t DqSmemBytes() {
  return size_t(2 * kRows + kStages * 2 * InnerTile<HDP>()) * Ld<HDP>() * 2;
}
template <int HDP, int kStages = 1>
constexpr size_t DkvSmemBytes() {
  return DqSmemBytes<HDP, kStages>() + kStages * 2 * InnerTile<HDP>() * sizeof(float);
}
// dQ from the stored score gradients: kStages tiles of k rows and of dSᵀ rows (a block's 64
// queries wide).
template <int HDP, int kStages = 1>
constexpr size_t DqStoredSmemBytes() {
  return size_t(kStages) * InnerTile<HDP>() * (Ld<HDP>() + Ld<kRows>()) * 2;
}

struct Operands {
  const uint16_t* q;  // bf16 bits
  const uint16_t* k;
  const uint16_t* v;
  size_t q_stride, kv_stride;
  int Tq, Tk, D, H;
  float scale;  // 1/√hd
  // Where each sequence's rows are. Dense (inner = 1, the default): sequence b's rows follow
  // sequence b−1's, out and dout [B, Tq, D]. Interleaved (Latte's temporal attention over a
  // frame-major video, each token a sequence across frames): sequence b starts at
  // (b / inner)·Tq·stride + (b % inner)·the operand's inner offset, its rows `stride` apart; out
  // and dout with row stride o_stride and inner offset o_inner.
  int inner = 1;
  size_t q_inner = 0, kv_inner = 0;
  size_t o_stride = 0, o_inner = 0;  // o_stride 0: D (dense)

  DT_SIMT size_t OutStride() const { return o_stride != 0 ? o_stride : size_t(D); }
};

struct ForwardArgs {
  Operands in;
  uint16_t* out;  // [B, Tq, D]
  float* lse;     // [B, H, Tq]
};

struct BackwardArgs {
  Operands in;
  const uint16_t* dout;  // [B, Tq, D]
  const float* lse;
  const float* delta;  // [B, H, Tq]: Σ_d dout·out over each head
  uint16_t* dq;        // q's row stride
  uint16_t *dk, *dv;   // k's and v's row stride
  // The score gradients, stored by BackwardDkv<…, kStoreScores> and read by BackwardDqStored:
  // dSᵀ = Pᵀ ∘ (dPᵀ − delta) (unscaled), bf16, per sequence and head a [ds_rows, ds_cols]
  // row-major matrix (row = key, column = query), sequence b's head h at (b·H + h)·ds_rows·
  // ds_cols; ds_rows = Tk and ds_cols = Tq rounded up to multiples of kRows (StoredScoresRows).
  uint16_t* ds = nullptr;
  int ds_rows = 0, ds_cols = 0;
  // Where non-null, each block also writes the column sums of its 64 rows of dq (BackwardDqStored)
  // or of dk and dv (BackwardDkv<…, kStoreScores>), as computed in fp32 and scaled as stored: row
  // b·⌈T/64⌉ + blockIdx.x of a [B·⌈T/64⌉, sums_stride] fp32 matrix (T: Tq for dq, Tk for dk and
  // dv), head h's columns from h·hd. Summed over its rows, that is each column's sum over every
  // token: with the packed qkv's layout (dk_sums = dq_sums + D, dv_sums + 2·D, stride 3·D), the
  // qkv Linear's bias gradient, without reading dqkv again.
  float *dq_sums = nullptr, *dk_sums = nullptr, *dv_sums = nullptr;
  size_t sums_stride = 0;
  // The forward's output (out's layout), from which ShortBackward computes delta itself
  // (flash_short_kernels.h; the other kernels read delta).
  const uint16_t* out = nullptr;
};

// Tk or Tq rounded up to the rows a block owns: the stored score gradients' rows and columns.
constexpr int StoredScoresRows(int T) {
  return (T + kRows - 1) / kRows * kRows;
}

// The backward's preprocessing: delta[b, h, t] = Σ_d dout·out over head h of row (b, t) (dout
// and out [B, T, D] bf16, delta [B, H, T] fp32). Grid (⌈B·T / kWarps⌉), one row a warp: a lane
// reads 8 consecutive columns of each at a time (16-byte loads; hd is a multiple of 8, so the 8
// lie in one head), writes their dot product to its warp's row of shared memory
// (DeltaSmemBytes), and each head's sum over its hd/8 dot products, in order, is one lane's.
struct DeltaArgs {
  const uint16_t* dout;
  const uint16_t* out;
  float* delta;
  int B, T, D, H;
  // Interleaved sequences, as in Operands: sequence b's row t at (b / inner)·T·o_stride +
  // (b % inner)·o_inner + t·o_stride; o_stride 0: dense, D.
  int inner = 1;
  size_t o_stride = 0, o_inner = 0;
};
constexpr size_t DeltaSmemBytes(int D) {
  return size_t(kWarps) * (D / 8) * sizeof(float);
}

// The dot product of 8 bf16 pairs in fp32, in order: Delta's, and the short kernels' own delta
// (flash_short_kernels.h), which must give its bits.
template <class P>
DT_SIMT float Dot8(const uint16_t (&g)[8], const uint16_t (&o)[8]) {
  float dot = 0;
  DT_UNROLL
  for (int e = 0; e < 8; ++e)
    dot += P::Bf16ToFloat(g[e]) * P::Bf16ToFloat(o[e]);
  return dot;
}

template <class P>
DT_SIMT void Delta(const DeltaArgs& a) {
  const int lane = P::Thread() % 32, warp = P::Thread() / 32;
  const int chunks = a.D / 8, per_head = a.D / a.H / 8;
  float* dots = reinterpret_cast<float*>(P::Smem()) + warp * chunks;
  const int row = P::BlockX() * kWarps + warp;
  const bool active = row < a.B * a.T;  // the same for the whole warp
  const int b = row / a.T, t = row % a.T;
  const size_t o_stride = a.o_stride != 0 ? a.o_stride : size_t(a.D);
  const size_t base =
      size_t(b / a.inner) * a.T * o_stride + size_t(b % a.inner) * a.o_inner + size_t(t) * o_stride;
  if (active) {
    for (int c = lane; c < chunks; c += 32) {
      alignas(16) uint16_t g[8], o[8];
      P::Copy16(g, a.dout + base + c * 8);
      P::Copy16(o, a.out + base + c * 8);
      dots[c] = Dot8<P>(g, o);
    }
  }
  P::SyncThreads();
  if (active) {
    for (int h = lane; h < a.H; h += 32) {
      float sum = 0;
      for (int j = 0; j < per_head; ++j)
        sum += dots[h * per_head + j];
      a.delta[(size_t(b) * a.H + h) * a.T + t] = sum;
    }
  }
}

// Rows [0, rows) × columns [0, hd) of a row-major global matrix into a [tile_rows][Ld] shared
// tile in 16-byte chunks, zero elsewhere (hd is a multiple of 8; rows start 16-byte aligned);
// kAsync: the chunks by cp.async (the zeros by ordinary stores), landed at the caller's wait.
template <int HDP, class P, bool kAsync = false>
DT_SIMT void LoadRows(uint16_t* tile, int tile_rows, const uint16_t* g, size_t stride, int rows,
                      int hd) {
  constexpr int kChunks = HDP / 8;
  for (int i = P::Thread(); i < tile_rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint16_t* dst = tile + r * Ld<HDP>() + c;
    if (r < rows && c < hd) {
      if constexpr (kAsync) {
        P::CopyAsync16(dst, g + r * stride + c);
      } else {
        P::Copy16(dst, g + r * stride + c);
      }
    } else {
      P::Zero16(dst);
    }
  }
}

// The A operand: rows row0 … row0+15, columns col0 … col0+15 of a row-major shared tile.
template <int HDP, class P>
DT_SIMT void LoadA(uint32_t (&a)[4], const uint16_t* tile, int row0, int col0, int lane) {
  P::LdMatrixX4(a, tile + (row0 + (lane & 15)) * Ld<HDP>() + col0 + (lane >> 4) * 8);
}

// The A operand from a tile that holds A transposed (row = k, column = m: the stored dSᵀ):
// rows row0 … row0+15, columns col0 … col0+15 of A. Matrix i of the x4 load is A's 8×8 block
// (rows row0 + 8·(i&1), columns col0 + 8·(i>>1)), which the tile holds transposed at rows
// col0 + 8·(i>>1) … and column row0 + 8·(i&1): lanes 8i … 8i+7 address those rows.
template <int kLd, class P>
DT_SIMT void LoadAFromTransposed(uint32_t (&a)[4], const uint16_t* tile, int row0, int col0,
                                 int lane) {
  P::LdMatrixX4Trans(
      a, tile + (col0 + ((lane >> 4) << 3) + (lane & 7)) * kLd + row0 + ((lane >> 3) & 1) * 8);
}

// B operands of the n-tiles n0 … n0+7 (b[0], b[1]) and n0+8 … n0+15 (b[2], b[3]) over k0 … k0+15,
// where the tile holds B transposed (row = n, column = k: the keys of Q·Kᵀ).
template <int HDP, class P>
DT_SIMT void LoadBt(uint32_t (&b)[4], const uint16_t* tile, int n0, int k0, int lane) {
  P::LdMatrixX4(
      b, tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * Ld<HDP>() + k0 + ((lane >> 3) & 1) * 8);
}

// The same where the tile holds B itself (row = k, column = n: the values of P·V).
template <int HDP, class P>
DT_SIMT void LoadB(uint32_t (&b)[4], const uint16_t* tile, int k0, int n0, int lane) {
  P::LdMatrixX4Trans(
      b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Ld<HDP>() + n0 + ((lane >> 4) << 3));
}

// acc[m] (16 × 8·NT) += A_m·Bᵀ over the padded head dim for MT m-tiles: A_m = rows
// a_row0 + 16·m … +15 of a_tile, B's rows 0 … 8·NT−1 of b_tile (each B fragment read once and
// used by every m-tile).
template <int HDP, int NT, int MT, class P>
DT_SIMT void MmaABt(float (&acc)[MT][NT][4], const uint16_t* a_tile, int a_row0,
                    const uint16_t* b_tile, int lane) {
  DT_UNROLL
  for (int kk = 0; kk < HDP / 16; ++kk) {
    uint32_t a[MT][4];
    DT_UNROLL
    for (int m = 0; m < MT; ++m)
      LoadA<HDP, P>(a[m], a_tile, a_row0 + 16 * m, kk * 16, lane);
    DT_UNROLL
    for (int n = 0; n < NT / 2; ++n) {
      uint32_t b[4];
      LoadBt<HDP, P>(b, b_tile, n * 16, kk * 16, lane);
      DT_UNROLL
      for (int m = 0; m < MT; ++m) {
        P::Mma(acc[m][2 * n], a[m], b[0], b[1]);
        P::Mma(acc[m][2 * n + 1], a[m], b[2], b[3]);
      }
    }
  }
}
// One m-tile.
template <int HDP, int NT, class P>
DT_SIMT void MmaABt(float (&acc)[NT][4], const uint16_t* a_tile, int a_row0, const uint16_t* b_tile,
                    int lane) {
  MmaABt<HDP, NT, 1, P>(reinterpret_cast<float(&)[1][NT][4]>(acc), a_tile, a_row0, b_tile, lane);
}

// acc[m] (16 × HDP) += S_m·B for MT m-tiles: S_m (16 × KT) as fp32 accumulator tiles rounded
// to bf16, B = rows 0 … KT−1 of b_tile (each B fragment read once).
template <int HDP, int KT, int MT, class P>
DT_SIMT void MmaSB(float (&acc)[MT][HDP / 8][4], const float (&s)[MT][KT / 8][4],
                   const uint16_t* b_tile, int lane) {
  DT_UNROLL
  for (int j = 0; j < KT / 16; ++j) {
    uint32_t a[MT][4];
    DT_UNROLL
    for (int m = 0; m < MT; ++m) {
      a[m][0] = P::PackBf16x2(s[m][2 * j][0], s[m][2 * j][1]);
      a[m][1] = P::PackBf16x2(s[m][2 * j][2], s[m][2 * j][3]);
      a[m][2] = P::PackBf16x2(s[m][2 * j + 1][0], s[m][2 * j + 1][1]);
      a[m][3] = P::PackBf16x2(s[m][2 * j + 1][2], s[m][2 * j + 1][3]);
    }
    DT_UNROLL
    for (int n = 0; n < HDP / 16; ++n) {
      uint32_t b[4];
      LoadB<HDP, P>(b, b_tile, j * 16, n * 16, lane);
      DT_UNROLL
      for (int m = 0; m < MT; ++m) {
        P::Mma(acc[m][2 * n], a[m], b[0], b[1]);
        P::Mma(acc[m][2 * n + 1], a[m], b[2], b[3]);
      }
    }
  }
}
// One m-tile.
template <int HDP, int KT, class P>
DT_SIMT void MmaSB(float (&acc)[HDP / 8][4], const float (&s)[KT / 8][4], const uint16_t* b_tile,
                   int lane) {
  MmaSB<HDP, KT, 1, P>(reinterpret_cast<float(&)[1][HDP / 8][4]>(acc),
                       reinterpret_cast<const float(&)[1][KT / 8][4]>(s), b_tile, lane);
}

// Writes rows row0 + lane/4 (+8) of acc·factor as bf16 to g (row stride `stride`), rows < T and
// columns < hd only; factor[r] scales row lane/4 + 8r.
template <int HDP, class P>
DT_SIMT void StoreRows(const float (&acc)[HDP / 8][4], const float (&factor)[2], uint16_t* g,
                       size_t stride, int row0, int T, int hd, int lane) {
  DT_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + (lane >> 2) + 8 * r;
    if (row >= T) continue;
    DT_UNROLL
    for (int j = 0; j < HDP / 8; ++j) {
      const int c = j * 8 + 2 * (lane & 3);
      if (c < hd) {
        P::Store32(g + row * stride + c,
                   P::PackBf16x2(acc[j][2 * r] * factor[r], acc[j][2 * r + 1] * factor[r]));
      }
    }
  }
}

// The column sums of the block's 64 rows of acc·factor (each warp's 16 rows in its acc) into
// columns 0 … hd−1 of `row` (written): a barrier first (warps may still be reading the loop's
// last tile, whose shared memory this reuses), each warp's sums over its rows by shuffles, then
// the warps' in warp order. Rows past T hold zeros in every caller. Shared memory: kWarps·HDP
// floats (2 KiB at most).
// Each column's sum over a warp's 16 rows of acc (the lane's rows lane/4 and lane/4 + 8), by
// shuffles: f(column, sum) in lanes 0 … 3, column 8·j + 2·lane + e of every n-tile j.
template <int HDP, class P, class F>
DT_SIMT void WarpColumnSums(const float (&acc)[HDP / 8][4], int lane, F&& f) {
  DT_UNROLL
  for (int j = 0; j < HDP / 8; ++j) {
    DT_UNROLL
    for (int e = 0; e < 2; ++e) {
      float v = acc[j][e] + acc[j][2 + e];
      v += P::ShflXor(v, 4);
      v += P::ShflXor(v, 8);
      v += P::ShflXor(v, 16);
      if (lane < 4) f(j * 8 + 2 * lane + e, v);
    }
  }
}

template <int HDP, class P>
DT_SIMT void StoreColumnSums(const float (&acc)[HDP / 8][4], float factor, float* row, int hd,
                             int lane, int warp) {
  float* per_warp = reinterpret_cast<float*>(P::Smem());
  P::SyncThreads();
  WarpColumnSums<HDP, P>(acc, lane, [&](int c, float v) { per_warp[warp * HDP + c] = v; });
  P::SyncThreads();
  for (int c = P::Thread(); c < hd; c += kThreads) {
    float v = 0;
    for (int w = 0; w < kWarps; ++w)
      v += per_warp[w * HDP + c];
    row[c] = v * factor;
  }
}

// Row blockIdx.x of sequence b's column sums, at head h's columns (BackwardArgs::dq_sums).
DT_SIMT float* ColumnSumsRow(float* sums, size_t stride, int T, int b, int block, int h, int hd) {
  return sums + (size_t(b) * ((T + kRows - 1) / kRows) + block) * stride + size_t(h) * hd;
}

// Where the calling thread works: its lane, warp and column pair in an accumulator tile
// (lane % 4); the block's head h of sequence b and the first of its kBlockRows rows (queries, or
// keys for dK and dV; 64, or 128 for a forward of two m-tiles a warp), the warp's first row;
// each operand's offset to this head of this sequence (q, dq; k, v, dk, dv; lse, delta: out's
// and dout's is OutOffset, computed where it is used, so that the forward does not keep it in
// registers across its loop); the scores' scale in log2 units.
struct Place {
  int lane, warp, tq, hd, h, b, first, row0;
  size_t q_off, kv_off, stat_off;
  float sl2;
};

// Sequence b's first row in an operand of row stride `stride` and inner offset `inner_offset`
// with T rows a sequence (the division only where sequences interleave).
DT_SIMT size_t SequenceOffset(const Operands& a, int b, int T, size_t stride, size_t inner_offset) {
  if (a.inner == 1) return size_t(b) * T * stride;
  return size_t(b / a.inner) * T * stride + size_t(b % a.inner) * inner_offset;
}

DT_SIMT size_t OutOffset(const Operands& a, const Place& p) {
  return SequenceOffset(a, p.b, a.Tq, a.OutStride(), a.o_inner) + p.h * p.hd;
}

template <class P, int kBlockRows = kRows>
DT_SIMT Place Locate(const Operands& a) {
  Place p;
  p.lane = P::Thread() % 32;
  p.warp = P::Thread() / 32;
  p.tq = p.lane & 3;
  p.hd = a.D / a.H;
  p.h = P::BlockY();
  p.b = P::BlockZ();
  p.first = P::BlockX() * kBlockRows;
  p.row0 = p.first + p.warp * (kBlockRows / kWarps);
  p.q_off = SequenceOffset(a, p.b, a.Tq, a.q_stride, a.q_inner) + p.h * p.hd;
  p.kv_off = SequenceOffset(a, p.b, a.Tk, a.kv_stride, a.kv_inner) + p.h * p.hd;
  p.stat_off = (size_t(p.b) * a.H + p.h) * a.Tq;
  p.sl2 = a.scale * kLog2e;
  return p;
}

// Keys and values kv0 … kv0+kT−1 of the block's head into k_s and v_s (k_s's stage of the
// double buffer: v_s follows it).
template <int HDP, int kT, class P, bool kAsync>
DT_SIMT void LoadKeyValueRows(uint16_t* k_s, const Operands& a, const Place& at, int kv0) {
  const uint16_t* k = a.k + at.kv_off + kv0 * a.kv_stride;
  const uint16_t* v = a.v + at.kv_off + kv0 * a.kv_stride;
  LoadRows<HDP, P, kAsync>(k_s, kT, k, a.kv_stride, a.Tk - kv0, at.hd);
  LoadRows<HDP, P, kAsync>(k_s + kT * Ld<HDP>(), kT, v, a.kv_stride, a.Tk - kv0, at.hd);
}

// The tiles of a loop over the other side's rows (keys, or queries for dK and dV), `load(stage,
// first row)` filling one stage of `kStages`: Next(t, first) makes tile t, whose rows begin at
// `first`, ready in shared memory and returns its stage; Done() follows the work on it. With one
// stage: a barrier (every warp is done with the previous tile), the load, a barrier. With two:
// tile t+1's asynchronous copies are issued into the other stage (Done's barrier ended every
// warp's reads of it), then tile t's are waited for and a barrier makes every thread's copies
// visible. The first tile's copies are issued by Start, with whatever else the caller copied
// before it (one group).
template <class P, int kStages>
struct TilePipeline {
  int tile_rows, end;  // rows per tile, and the rows' end

  template <class Load>
  DT_SIMT void Start(Load&& load) const {
    if constexpr (kStages == 2) {
      load(0, 0);
      P::CommitGroup();
    }
  }
  template <class Load>
  DT_SIMT int Next(int t, int first, Load&& load) const {
    if constexpr (kStages == 1) {
      P::SyncThreads();
      load(0, first);
      P::SyncThreads();
      return 0;
    } else {
      const int stage = t & 1;
      if (first + tile_rows < end) {
        load(stage ^ 1, first + tile_rows);
        P::CommitGroup();
        P::WaitPrior();
      } else {
        P::WaitAll();
      }
      P::SyncThreads();
      return stage;
    }
  }
  DT_SIMT void Done() const {
    if constexpr (kStages == 2) P::SyncThreads();
  }
};

// The online softmax of one m-tile's scores s (16 rows × kT keys from kv0, the lane's two rows)
// in log2 units, the four lanes of a row combining through shuffles: s becomes P, the row
// maxima m and sums l move on, and the accumulated output o is rescaled by α = exp2(m − m_new).
template <int kT, int kN, class P>
DT_SIMT void OnlineSoftmax(float (&s)[kT / 8][4], float (&o)[kN][4], float (&m)[2], float (&l)[2],
                           int kv0, int Tk, int tq, float sl2) {
  DT_UNROLL
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
    DT_UNROLL
    for (int n = 0; n < kT / 8; ++n) {
      DT_UNROLL
      for (int e = 0; e < 2; ++e) {
        const bool valid = kv0 + n * 8 + 2 * tq + e < Tk;
        const float x = valid ? s[n][2 * r + e] * sl2 : -INFINITY;
        s[n][2 * r + e] = x;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, P::ShflXor(mx, 1));
    mx = fmaxf(mx, P::ShflXor(mx, 2));
    // Key kv0 < Tk is in every tile, so m_new is finite; the first tile's α is exp2(−∞) = 0.
    const float m_new = fmaxf(m[r], mx);
    const float alpha = P::Exp2(m[r] - m_new);
    float sum = 0;
    DT_UNROLL
    for (int n = 0; n < kT / 8; ++n) {
      DT_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float p = P::Exp2(s[n][2 * r + e] - m_new);
        s[n][2 * r + e] = p;
        sum += p;
      }
    }
    sum += P::ShflXor(sum, 1);
    sum += P::ShflXor(sum, 2);
    l[r] = l[r] * alpha + sum;
    m[r] = m_new;
    DT_UNROLL
    for (int j = 0; j < kN; ++j) {
      o[j][2 * r] *= alpha;
      o[j][2 * r + 1] *= alpha;
    }
  }
}

// The backward's score gradients of one tile, in registers, query rows (dQ's): s holds S and
// becomes dS = P ∘ (dP − delta), P = exp2(S·sl2 − lse·log2 e), 0 for keys kv0 + column ≥ Tk; the
// lane's rows' lse·log2 e and delta in lse2 and delta.
template <int kNT, class P>
DT_SIMT void ScoreGradientRows(float (&s)[kNT][4], const float (&dp)[kNT][4],
                               const float (&lse2)[2], const float (&delta)[2], int kv0, int Tk,
                               int tq, float sl2) {
  DT_UNROLL
  for (int n = 0; n < kNT; ++n) {
    DT_UNROLL
    for (int i = 0; i < 4; ++i) {
      const bool valid = kv0 + n * 8 + 2 * tq + (i & 1) < Tk;
      const float p = valid ? P::Exp2(s[n][i] * sl2 - lse2[i >> 1]) : 0.0f;
      s[n][i] = p * (dp[n][i] - delta[i >> 1]);
    }
  }
}

// The same transposed, key rows (dK's and dV's): st holds Sᵀ and becomes Pᵀ, dpt dPᵀ and becomes
// dSᵀ, for the lane's keys key + 8·r and the tile's queries q0 + column (0 past Tk or Tq); each
// column's lse·log2 e and delta in lse2_s and delta_s.
template <int kNT, class P>
DT_SIMT void ScoreGradientColumns(float (&st)[kNT][4], float (&dpt)[kNT][4], const float* lse2_s,
                                  const float* delta_s, int key, int Tk, int q0, int Tq, int tq,
                                  float sl2) {
  DT_UNROLL
  for (int n = 0; n < kNT; ++n) {
    DT_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int qc = n * 8 + 2 * tq + (i & 1);
      const bool valid = key + 8 * (i >> 1) < Tk && q0 + qc < Tq;
      const float p = valid ? P::Exp2(st[n][i] * sl2 - lse2_s[qc]) : 0.0f;
      st[n][i] = p;
      dpt[n][i] = p * (dpt[n][i] - delta_s[qc]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward. Grid (⌈Tq/(64·kMTiles)⌉, H, B). Per key tile: S = Q_w·Kᵀ, the online softmax, O =
// O·α + P·V. kMTiles: the 16-row m-tiles a warp owns (1, or 2: 32 query rows a warp and 128 a
// block, each K and V fragment read from shared memory once for both; the same results bit for
// bit, each row's arithmetic being the same).
template <int HDP, class P, int kStages = 1, int kMTiles = 1>
DT_SIMT void Forward(const ForwardArgs& args) {
  constexpr int kT = InnerTile<HDP>(), kN = HDP / 8, kM = kMTiles, kBlockRows = kRows * kM;
  constexpr bool kAsync = kStages == 2;
  const Operands& a = args.in;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(P::Smem());
  uint16_t* kv_s = q_s + kBlockRows * Ld<HDP>();  // stage s: k at kv_s + s·2·kT·Ld, v after it
  const Place at = Locate<P, kBlockRows>(a);
  const int lane = at.lane, warp = at.warp, tq = at.tq, hd = at.hd, q0 = at.first;
  const TilePipeline<P, kStages> tiles{kT, a.Tk};
  auto load = [&](int stage, int kv0) {
    LoadKeyValueRows<HDP, kT, P, kAsync>(kv_s + stage * 2 * kT * Ld<HDP>(), a, at, kv0);
  };

  LoadRows<HDP, P, kAsync>(q_s, kBlockRows, a.q + at.q_off + q0 * a.q_stride, a.q_stride, a.Tq - q0,
                           hd);
  tiles.Start(load);
  float o[kM][kN][4] = {};
  float m[kM][2], l[kM][2];
  DT_UNROLL
  for (int i = 0; i < kM; ++i) {
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0;
  }
  for (int kv0 = 0, t = 0; kv0 < a.Tk; kv0 += kT, ++t) {
    const uint16_t* k_s = kv_s + tiles.Next(t, kv0, load) * 2 * kT * Ld<HDP>();
    const uint16_t* v_s = k_s + kT * Ld<HDP>();

    float s[kM][kT / 8][4] = {};
    MmaABt<HDP, kT / 8, kM, P>(s, q_s, warp * 16 * kM, k_s, lane);
    DT_UNROLL
    for (int i = 0; i < kM; ++i)
      OnlineSoftmax<kT, kN, P>(s[i], o[i], m[i], l[i], kv0, a.Tk, tq, at.sl2);
    MmaSB<HDP, kT, kM, P>(o, s, v_s, lane);
    tiles.Done();
  }

  DT_UNROLL
  for (int i = 0; i < kM; ++i) {
    const int row0 = at.row0 + 16 * i;
    const float inv_l[2] = {1.0f / l[i][0], 1.0f / l[i][1]};
    StoreRows<HDP, P>(o[i], inv_l, args.out + OutOffset(a, at), a.OutStride(), row0, a.Tq, hd,
                      lane);
    if (tq == 0) {
      DT_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int q = row0 + (lane >> 2) + 8 * r;
        if (q < a.Tq) args.lse[at.stat_off + q] = (m[i][r] + P::Log2(l[i][r])) * kLn2;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dQ. Grid (⌈Tq/64⌉, H, B). Per key tile: S = Q_w·Kᵀ, dP = dO_w·Vᵀ,
// dS = P ∘ (dP − delta) with P = exp2(S·scale·log2 e − lse·log2 e), dQ += dS·K; dQ·scale at the
// end.
template <int HDP, class P, int kStages = 1>
DT_SIMT void BackwardDq(const BackwardArgs& args) {
  constexpr int kT = InnerTile<HDP>(), kN = HDP / 8;
  constexpr bool kAsync = kStages == 2;
  const Operands& a = args.in;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(P::Smem());
  uint16_t* do_s = q_s + kRows * Ld<HDP>();
  uint16_t* kv_s = do_s + kRows * Ld<HDP>();  // stage s: k at kv_s + s·2·kT·Ld, v after it
  const Place at = Locate<P>(a);
  const int lane = at.lane, warp = at.warp, tq = at.tq, hd = at.hd, q0 = at.first;
  const float sl2 = at.sl2;
  const TilePipeline<P, kStages> tiles{kT, a.Tk};
  auto load = [&](int stage, int kv0) {
    LoadKeyValueRows<HDP, kT, P, kAsync>(kv_s + stage * 2 * kT * Ld<HDP>(), a, at, kv0);
  };

  LoadRows<HDP, P, kAsync>(q_s, kRows, a.q + at.q_off + q0 * a.q_stride, a.q_stride, a.Tq - q0, hd);
  LoadRows<HDP, P, kAsync>(do_s, kRows, args.dout + OutOffset(a, at) + q0 * a.OutStride(),
                           a.OutStride(), a.Tq - q0, hd);
  tiles.Start(load);
  float lse2[2], delta[2];
  DT_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int q = at.row0 + (lane >> 2) + 8 * r;
    lse2[r] = q < a.Tq ? args.lse[at.stat_off + q] * kLog2e : 0.0f;
    delta[r] = q < a.Tq ? args.delta[at.stat_off + q] : 0.0f;
  }
  float dq[kN][4] = {};
  for (int kv0 = 0, t = 0; kv0 < a.Tk; kv0 += kT, ++t) {
    const uint16_t* k_s = kv_s + tiles.Next(t, kv0, load) * 2 * kT * Ld<HDP>();
    const uint16_t* v_s = k_s + kT * Ld<HDP>();

    float s[kT / 8][4] = {}, dp[kT / 8][4] = {};
    MmaABt<HDP, kT / 8, P>(s, q_s, warp * 16, k_s, lane);
    MmaABt<HDP, kT / 8, P>(dp, do_s, warp * 16, v_s, lane);
    ScoreGradientRows<kT / 8, P>(s, dp, lse2, delta, kv0, a.Tk, tq, sl2);
    MmaSB<HDP, kT, P>(dq, s, k_s, lane);
    tiles.Done();
  }
  const float scale[2] = {a.scale, a.scale};
  StoreRows<HDP, P>(dq, scale, args.dq + at.q_off, a.q_stride, at.row0, a.Tq, hd, lane);
}

// ---------------------------------------------------------------------------------------------
// Backward, dK and dV. Grid (⌈Tk/64⌉, H, B). Per query tile: Sᵀ = K_w·Qᵀ, dPᵀ = V_w·dOᵀ,
// Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e) (0 past Tk and Tq), dSᵀ = Pᵀ ∘ (dPᵀ − delta),
// dV += Pᵀ·dO, dK += dSᵀ·Q; dK·scale at the end. kStoreScores: dSᵀ also to args.ds, for
// BackwardDqStored (a separate instantiation: the stores cost the sm_90 three-blocks kernel a
// few bytes of spills, which the plain one is spared).
template <int HDP, class P, int kStages = 1, bool kStoreScores = false>
DT_SIMT void BackwardDkv(const BackwardArgs& args) {
  constexpr int kT = InnerTile<HDP>(), kN = HDP / 8;
  constexpr bool kAsync = kStages == 2;
  const Operands& a = args.in;
  uint16_t* k_s = reinterpret_cast<uint16_t*>(P::Smem());
  uint16_t* v_s = k_s + kRows * Ld<HDP>();
  // Stage s: q at qd_s + s·2·kT·Ld, dout after it; lse·log2 e at stats_s + s·2·kT, delta after.
  uint16_t* qd_s = v_s + kRows * Ld<HDP>();
  float* stats_s = reinterpret_cast<float*>(qd_s + kStages * 2 * kT * Ld<HDP>());
  const Place at = Locate<P>(a);
  const int lane = at.lane, warp = at.warp, tq = at.tq, hd = at.hd, k0 = at.first, row0 = at.row0;
  const size_t kv_off = at.kv_off, stat_off = at.stat_off;
  const uint16_t* q_g = a.q + at.q_off;
  const uint16_t* do_g = args.dout + OutOffset(a, at);
  const float sl2 = at.sl2;

  const TilePipeline<P, kStages> tiles{kT, a.Tq};
  // Query tile q0's rows of q and dout (copied), and their lse·log2 e and delta (stored).
  auto load = [&](int stage, int q0) {
    uint16_t* q_tile = qd_s + stage * 2 * kT * Ld<HDP>();
    LoadRows<HDP, P, kAsync>(q_tile, kT, q_g + q0 * a.q_stride, a.q_stride, a.Tq - q0, hd);
    LoadRows<HDP, P, kAsync>(q_tile + kT * Ld<HDP>(), kT, do_g + q0 * a.OutStride(), a.OutStride(),
                             a.Tq - q0, hd);
    float* lse2 = stats_s + stage * 2 * kT;
    for (int i = P::Thread(); i < kT; i += kThreads) {
      const bool valid = q0 + i < a.Tq;
      lse2[i] = valid ? args.lse[stat_off + q0 + i] * kLog2e : 0.0f;
      lse2[kT + i] = valid ? args.delta[stat_off + q0 + i] : 0.0f;
    }
  };

  LoadRows<HDP, P, kAsync>(k_s, kRows, a.k + kv_off + k0 * a.kv_stride, a.kv_stride, a.Tk - k0, hd);
  LoadRows<HDP, P, kAsync>(v_s, kRows, a.v + kv_off + k0 * a.kv_stride, a.kv_stride, a.Tk - k0, hd);
  tiles.Start(load);
  float dk[kN][4] = {}, dv[kN][4] = {};
  for (int q0 = 0, t = 0; q0 < a.Tq; q0 += kT, ++t) {
    const int stage = tiles.Next(t, q0, load);
    const uint16_t* q_s = qd_s + stage * 2 * kT * Ld<HDP>();
    const uint16_t* do_s = q_s + kT * Ld<HDP>();
    const float* lse2_s = stats_s + stage * 2 * kT;
    const float* delta_s = lse2_s + kT;

    float st[kT / 8][4] = {}, dpt[kT / 8][4] = {};
    MmaABt<HDP, kT / 8, P>(st, k_s, warp * 16, q_s, lane);
    MmaABt<HDP, kT / 8, P>(dpt, v_s, warp * 16, do_s, lane);
    ScoreGradientColumns<kT / 8, P>(st, dpt, lse2_s, delta_s, row0 + (lane >> 2), a.Tk, q0, a.Tq,
                                    tq, sl2);
    MmaSB<HDP, kT, P>(dv, st, do_s, lane);
    MmaSB<HDP, kT, P>(dk, dpt, q_s, lane);
    if constexpr (kStoreScores) {
      // dSᵀ rounded to bf16 as MmaSB rounded it for dK: keys row0 + lane/4 (+8), every query
      // of the tile (0 past Tk and Tq), so BackwardDqStored reads no unwritten element. After
      // the products, when Pᵀ's registers are free (before them the sm_90 three-blocks kernel
      // spilled 60 bytes at hd 80; here 20).
      uint16_t* ds = args.ds + (size_t(at.b) * a.H + at.h) * args.ds_rows * args.ds_cols + q0;
      DT_UNROLL
      for (int r = 0; r < 2; ++r) {
        uint16_t* ds_row = ds + size_t(row0 + (lane >> 2) + 8 * r) * args.ds_cols + 2 * tq;
        DT_UNROLL
        for (int n = 0; n < kT / 8; ++n)
          P::Store32(ds_row + n * 8, P::PackBf16x2(dpt[n][2 * r], dpt[n][2 * r + 1]));
      }
    }
    tiles.Done();
  }
  const float one[2] = {1.0f, 1.0f}, scale[2] = {a.scale, a.scale};
  // With the column sums, each of dk and dv is summed right after it is stored, so that dk's
  // registers are free before dv's sums (fewer spills under the three-blocks bound).
  // (The block's place is read again, not kept live across the loop: registers.)
  const bool sums = kStoreScores && args.dk_sums != nullptr;
  StoreRows<HDP, P>(dk, scale, args.dk + kv_off, a.kv_stride, row0, a.Tk, hd, lane);
  if (sums) {
    StoreColumnSums<HDP, P>(dk, a.scale,
                            ColumnSumsRow(args.dk_sums, args.sums_stride, a.Tk, P::BlockZ(),
                                          P::BlockX(), P::BlockY(), hd),
                            hd, lane, warp);
  }
  StoreRows<HDP, P>(dv, one, args.dv + kv_off, a.kv_stride, row0, a.Tk, hd, lane);
  if (sums) {
    StoreColumnSums<HDP, P>(dv, 1.0f,
                            ColumnSumsRow(args.dv_sums, args.sums_stride, a.Tk, P::BlockZ(),
                                          P::BlockX(), P::BlockY(), hd),
                            hd, lane, warp);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dQ from the score gradients BackwardDkv stored (args.ds), which must have run
// before. Grid (⌈Tq/64⌉, H, B). Per key tile: dQ += dS·K, with dS read through transposing
// ldmatrix from the stored dSᵀ tile (the tile's keys × the block's 64 queries); dQ·scale at the
// end. One product a tile where BackwardDq computes three (S and dP again), for a round trip
// of the bf16 dSᵀ through memory.
template <int HDP, class P, int kStages = 1>
DT_SIMT void BackwardDqStored(const BackwardArgs& args) {
  constexpr int kT = InnerTile<HDP>(), kN = HDP / 8;
  constexpr bool kAsync = kStages == 2;
  constexpr int kStage = kT * (Ld<HDP>() + Ld<kRows>());  // a stage's k rows, then its dSᵀ rows
  const Operands& a = args.in;
  uint16_t* smem = reinterpret_cast<uint16_t*>(P::Smem());
  const Place at = Locate<P>(a);
  const int lane = at.lane, warp = at.warp, q0 = at.first;
  // The block's queries in the stored rows: columns q0 …, up to Tq rounded up to 8 (every
  // column BackwardDkv wrote; 16-byte chunks), zeros after.
  const uint16_t* ds_g = args.ds + (size_t(at.b) * a.H + at.h) * args.ds_rows * args.ds_cols + q0;
  const int ds_valid = ((a.Tq + 7) / 8 * 8) - q0;
  const TilePipeline<P, kStages> tiles{kT, a.Tk};
  auto load = [&](int stage, int kv0) {
    uint16_t* k_s = smem + stage * kStage;
    LoadRows<HDP, P, kAsync>(k_s, kT, a.k + at.kv_off + kv0 * a.kv_stride, a.kv_stride, a.Tk - kv0,
                             at.hd);
    LoadRows<kRows, P, kAsync>(k_s + kT * Ld<HDP>(), kT, ds_g + size_t(kv0) * args.ds_cols,
                               args.ds_cols, kT, ds_valid < kRows ? ds_valid : kRows);
  };

  tiles.Start(load);
  float dq[kN][4] = {};
  for (int kv0 = 0, t = 0; kv0 < a.Tk; kv0 += kT, ++t) {
    const uint16_t* k_s = smem + tiles.Next(t, kv0, load) * kStage;
    const uint16_t* ds_s = k_s + kT * Ld<HDP>();
    DT_UNROLL
    for (int j = 0; j < kT / 16; ++j) {
      uint32_t ds[4];
      LoadAFromTransposed<Ld<kRows>(), P>(ds, ds_s, warp * 16, j * 16, lane);
      DT_UNROLL
      for (int n = 0; n < HDP / 16; ++n) {
        uint32_t b[4];
        LoadB<HDP, P>(b, k_s, j * 16, n * 16, lane);
        P::Mma(dq[2 * n], ds, b[0], b[1]);
        P::Mma(dq[2 * n + 1], ds, b[2], b[3]);
      }
    }
    tiles.Done();
  }
  const float scale[2] = {a.scale, a.scale};
  StoreRows<HDP, P>(dq, scale, args.dq + at.q_off, a.q_stride, at.row0, a.Tq, at.hd, lane);
  if (args.dq_sums != nullptr) {
    StoreColumnSums<HDP, P>(
        dq, a.scale,
        ColumnSumsRow(args.dq_sums, args.sums_stride, a.Tq, at.b, P::BlockX(), at.h, at.hd), at.hd,
        lane, warp);
  }
}

}  // namespace difftrain::flash
