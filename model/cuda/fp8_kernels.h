// FP8 training's two kernels, written once against the primitives P
// (model/cuda/simt_portable.h): nvcc compiles them for the GPU (model/cuda/fp8.cu,
// device_primitives.cuh) and the CPU emulator runs them in every test run
// (model/simt/fp8_kernel_test.cc, against model/cuda/fp8_format.h).
//
// Quantize: a bf16 matrix [rows, cols] to FP8 — x · scale, rounded and saturated (P::ToFp8) —
// row-major, transposed ([cols, rows], what cuBLASLt's FP8 products need for a weight gradient,
// whose operands must both be "transposed"), or both, from one read; and the largest |x| it
// read raised into the tensor's running amax. A block of kThreads threads takes a kTile × kTile
// tile: thread t reads 16 columns of row t / 4 (two 16-byte loads) and, for the transpose,
// writes 16 rows of column t / 4 from the tile in shared memory. rows and cols are multiples
// of 16, so a thread's 16 values are all inside the matrix or all outside.
//
// UpdateScales (delayed scaling, Transformer Engine's recipe): one block a tensor appends its
// running amax to the tensor's history (a ring of `length`), resets it, and sets
// scale = limit / max(history), limit being the format's largest value / 2^margin, and
// scale_inv = 1 / scale (what the GEMM multiplies by); a history of zeros, or a scale that is
// not finite, keeps the scale it had.
//
// The primitives P provides (static), beyond flash_kernels.h's: ToFp8(x, format) (the code,
// rounded to nearest even and saturated) and AtomicMaxNonNegative(p, v).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "model/cuda/simt_portable.h"

namespace difftrain::fp8 {

constexpr int kTile = 64;
constexpr int kThreads = 256;  // 4 a tile row, 16 columns each
constexpr int kWarps = kThreads / 32;
// Bytes a tile row takes in shared memory: 4 past the tile, so the transposing reads of a warp
// spread over the banks.
constexpr int kTileStride = kTile + 4;
constexpr int kQuantizeSharedBytes = kTile * kTileStride + kWarps * sizeof(float);
constexpr int kScaleThreads = 256;
constexpr int kScaleSharedBytes = kScaleThreads / 32 * sizeof(float);

struct QuantizeArgs {
  const uint16_t* in;  // bf16 bits, row-major [rows, cols]
  uint8_t* out;        // row-major [rows, cols], or null
  uint8_t* out_t;      // row-major [cols, rows], or null
  int rows, cols;      // multiples of 16
  const float* scale;  // the tensor's scale (a device scalar)
  float* amax;         // the tensor's running amax (a device scalar), raised
  int format;          // Format
};

// The largest value over a block's threads (every thread calls it; thread 0 gets the answer).
template <class P>
DT_SIMT float BlockMax(float v, float* warp_max, int threads) {
  for (int mask = 16; mask >= 1; mask /= 2) {
    const float other = P::ShflXor(v, mask);
    v = other > v ? other : v;
  }
  const int t = P::Thread();
  if (t % 32 == 0) warp_max[t / 32] = v;
  P::SyncThreads();
  if (t == 0) {
    for (int w = 1; w < threads / 32; ++w)
      v = warp_max[w] > v ? warp_max[w] : v;
  }
  return v;
}

template <class P>
DT_SIMT void Quantize(const QuantizeArgs& a) {
  const int t = P::Thread();
  const int r0 = P::BlockY() * kTile, c0 = P::BlockX() * kTile;
  const int r = r0 + t / 4, c = c0 + (t % 4) * 16;
  const bool inside = r < a.rows && c < a.cols;
  const float scale = *a.scale;
  float amax = 0;
  alignas(16) uint8_t q[16] = {};
  if (inside) {
    alignas(16) uint16_t bits[16];
    const uint16_t* src = a.in + static_cast<size_t>(r) * a.cols + c;
    P::Copy16(bits, src);
    P::Copy16(bits + 8, src + 8);
    DT_UNROLL
    for (int j = 0; j < 16; ++j) {
      const float x = P::Bf16ToFloat(bits[j]);
      const float m = fabsf(x);
      amax = m > amax ? m : amax;  // (a NaN is not a maximum)
      q[j] = P::ToFp8(x * scale, a.format);
    }
    if (a.out != nullptr) P::Copy16(a.out + static_cast<size_t>(r) * a.cols + c, q);
  }
  unsigned char* smem = P::Smem();
  if (a.out_t != nullptr) {
    unsigned char* row = smem + (t / 4) * kTileStride + (t % 4) * 16;
    DT_UNROLL
    for (int w = 0; w < 4; ++w) {
      P::Store32(row + 4 * w, uint32_t{q[4 * w]} | uint32_t{q[4 * w + 1]} << 8 |
                                  uint32_t{q[4 * w + 2]} << 16 | uint32_t{q[4 * w + 3]} << 24);
    }
    P::SyncThreads();
    const int cc = t / 4, rs = (t % 4) * 16;  // this thread's output row (a column) and rows
    if (c0 + cc < a.cols && r0 + rs < a.rows) {
      alignas(16) uint8_t column[16];
      DT_UNROLL
      for (int j = 0; j < 16; ++j)
        column[j] = smem[(rs + j) * kTileStride + cc];
      P::Copy16(a.out_t + static_cast<size_t>(c0 + cc) * a.rows + r0 + rs, column);
    }
  }
  float* warp_max = reinterpret_cast<float*>(smem + kTile * kTileStride);
  amax = BlockMax<P>(amax, warp_max, kThreads);
  if (t == 0 && amax > 0) P::AtomicMaxNonNegative(a.amax, amax);
}

struct ScaleArgs {
  float* amax;         // [tensors] running amax, reset to 0
  float* history;      // [tensors, length]
  int* count;          // [tensors] updates so far (the ring's next slot is count % length)
  float* scale;        // [tensors]
  float* scale_inv;    // [tensors]
  const float* limit;  // [tensors] the format's largest value / 2^margin
  int length;
};

template <class P>
DT_SIMT void UpdateScales(const ScaleArgs& a) {
  const int s = P::BlockX(), t = P::Thread();
  float* history = a.history + static_cast<size_t>(s) * a.length;
  if (t == 0) history[a.count[s] % a.length] = a.amax[s];
  P::SyncThreads();
  float m = 0;
  for (int i = t; i < a.length; i += kScaleThreads)
    m = history[i] > m ? history[i] : m;
  m = BlockMax<P>(m, reinterpret_cast<float*>(P::Smem()), kScaleThreads);
  if (t == 0) {
    constexpr float kFloatMax = 3.402823466e38f;  // (a NaN compares false, infinity greater)
    const float scale = a.limit[s] / m;
    if (m > 0 && m <= kFloatMax && scale > 0 && scale <= kFloatMax) {
      a.scale[s] = scale;
      a.scale_inv[s] = 1.0f / scale;
    }
    a.amax[s] = 0;
    a.count[s] += 1;
  }
}

}  // namespace difftrain::fp8
