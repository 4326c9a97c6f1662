// A CPU emulator of the CUDA execution model, small enough to read: it runs a kernel body
// written once against the warp primitives below (model/cuda/flash_kernels.h is one) as blocks
// of threads, so the tensor-core kernels' index arithmetic — which lane holds which element of
// which fragment — is checked against the CPU reference on every machine, GPU or not.
//
// A block's threads are fibers (ucontext) on the calling OS thread, run round-robin: a thread
// runs until it reaches a barrier (SyncThreads) or a warp collective (ldmatrix, mma, shuffle),
// where it waits for the others. Blocks run one after another. Shared memory is a zeroed
// buffer per block. The warp collectives follow the PTX ISA's definitions of
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, element by element (simt.cc).
//
// What it cannot show: timing. Races between threads that real hardware runs concurrently
// (fibers switch only at the collectives, so a missing barrier changes no value here) it shows
// only when built with ThreadSanitizer (a *_tsan_test program; simt.cc says how); races between
// blocks not even then. compute-sanitizer's racecheck on a GPU sees both.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#include "model/cuda/fp8_format.h"

namespace difftrain::simt {

struct Dim3 {
  int x = 1, y = 1, z = 1;
};

// Runs body() once per thread of every block of `grid`, `threads` (a multiple of 32) threads a
// block, each block with `smem_bytes` of zeroed shared memory.
void Launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body);

// Inside a body: the calling thread's index in its block, its block's index, the block's
// shared memory.
int ThreadIdx();
Dim3 BlockIdx();
unsigned char* SharedMemory();

// __syncthreads(): every thread of the block arrives before any continues.
void SyncThreads();

// The warp collectives (every lane of the calling thread's warp takes part).
// ldmatrix .x4: lane i gives the address of row i % 8 of 8×8 b16 matrix i / 8; r[j] receives
// matrix j's elements (row lane/4, columns 2·(lane%4) and +1), low half first; `trans` reads
// each matrix transposed (rows 2·(lane%4) and +1 of column lane/4).
void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans);
// d += A·B for A 16×16 (row), B 16×8 (col), bf16 pairs in a and b, fp32 d, in the m16n8k16
// fragment layout.
void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// __shfl_xor_sync(full mask, v, mask).
float ShflXor(float v, int mask);

// cp.async.cg.shared.global of 16 bytes, its groups and waits (the calling thread's own, as on
// the GPU). The source is read at the call; the bytes land in shared memory only at the wait
// that retires their group (the latest a GPU may land them), so a tile read before its wait —
// or before the barrier after the other threads' waits — holds stale values and the value
// tests fail. Under ThreadSanitizer they land at the call instead (the earliest), so that a copy
// into a tile other threads may still be reading, with no barrier between, is a reported race.
// A thread that ends with copies it never waited for stops the emulator.
void CopyAsync16(void* dst, const void* src);
// cp.async.commit_group: the copies since the last commit become one group.
void CommitGroup();
// cp.async.wait_group n: every committed group but the newest n has landed.
void WaitGroup(int n);

// Shared-memory cost of the ldmatrix calls since the last ResetCounters(): the 8×8 matrices
// read, and the extra wavefronts bank conflicts add. A matrix's 8 rows of 16 bytes take one
// wavefront when no two different rows fall in the same 16-byte bank group (address / 16 mod
// 8: four of the 32 four-byte banks); k different rows in one group take k.
struct Counters {
  uint64_t ldmatrix_matrices = 0;
  uint64_t ldmatrix_extra_wavefronts = 0;
};
Counters ReadCounters();
void ResetCounters();

// Stops with a message naming `what` unless p is a multiple of `bytes`: a GPU faults on a
// misaligned vector access ("misaligned address"), the CPU does not, so the primitives check.
void CheckAligned(const void* p, size_t bytes, const char* what);

// bf16 bits of x, rounded to nearest even (NaN stays NaN); and back.
uint16_t FloatToBf16(float x);
inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The primitives a kernel body written for both backends takes (model/cuda/flash_kernels.h
// lists them; model/cuda/device_primitives.cuh has the GPU's).
struct Primitives {
  static int Thread() { return ThreadIdx(); }
  static int BlockX() { return BlockIdx().x; }
  static int BlockY() { return BlockIdx().y; }
  static int BlockZ() { return BlockIdx().z; }
  static unsigned char* Smem() { return SharedMemory(); }
  static void SyncThreads() { simt::SyncThreads(); }
  static void LdMatrixX4(uint32_t (&r)[4], const void* row) { simt::LdMatrixX4(r, row, false); }
  static void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) { simt::LdMatrixX4(r, row, true); }
  static void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    MmaBf16(d, a, b0, b1);
  }
  static float ShflXor(float v, int mask) { return simt::ShflXor(v, mask); }
  static uint32_t PackBf16x2(float lo, float hi) {
    return uint32_t{FloatToBf16(lo)} | (uint32_t{FloatToBf16(hi)} << 16);
  }
  static float Exp2(float x) { return std::exp2(x); }
  static float Log2(float x) { return std::log2(x); }
  static void Copy16(void* dst, const void* src) {
    CheckAligned(dst, 16, "Copy16 destination");
    CheckAligned(src, 16, "Copy16 source");
    std::memcpy(dst, src, 16);
  }
  // Copies zeros rather than memset: GCC's ThreadSanitizer leaves a 16-byte zeroing store
  // unchecked.
  static void Zero16(void* dst) {
    CheckAligned(dst, 16, "Zero16 destination");
    static constexpr unsigned char kZeros[16] = {};
    std::memcpy(dst, kZeros, 16);
  }
  static void CopyAsync16(void* dst, const void* src) { simt::CopyAsync16(dst, src); }
  static void CommitGroup() { simt::CommitGroup(); }
  static void WaitPrior() { simt::WaitGroup(1); }
  static void WaitAll() { simt::WaitGroup(0); }
  static void Store32(void* dst, uint32_t v) {
    CheckAligned(dst, 4, "Store32 destination");
    std::memcpy(dst, &v, sizeof v);
  }
  // The elementwise kernels' vector accesses (model/cuda/adaln_kernels.h): 16 bytes of fp32,
  // 8 of bf16 bits.
  static void LoadF32x4(float (&v)[4], const float* p) {
    CheckAligned(p, 16, "LoadF32x4 source");
    std::memcpy(v, p, sizeof v);
  }
  static void StoreF32x4(float* p, const float (&v)[4]) {
    CheckAligned(p, 16, "StoreF32x4 destination");
    std::memcpy(p, v, sizeof v);
  }
  static void LoadU16x4(uint16_t (&bits)[4], const uint16_t* p) {
    CheckAligned(p, 8, "LoadU16x4 source");
    std::memcpy(bits, p, sizeof bits);
  }
  static void StoreU16x4(uint16_t* p, const uint16_t (&bits)[4]) {
    CheckAligned(p, 8, "StoreU16x4 destination");
    std::memcpy(p, bits, sizeof bits);
  }
  static uint16_t RoundBf16(float x) { return FloatToBf16(x); }
  static float Bf16ToFloat(uint16_t bits) { return simt::Bf16ToFloat(bits); }
  // FP8 (model/cuda/fp8_kernels.h): the CPU's conversion (model/cuda/fp8_format.h).
  static uint8_t ToFp8(float x, int format) {
    return fp8::FromFloat(x, static_cast<fp8::Format>(format));
  }
  // Fibers switch only at collectives, so a read and a write are one step here.
  static void AtomicMaxNonNegative(float* p, float v) {
    if (v > *p) *p = v;
  }
};

}  // namespace difftrain::simt
