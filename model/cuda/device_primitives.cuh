// The primitives the kernel bodies written once for the GPU and the CPU emulator take
// (model/cuda/flash_kernels.h, model/cuda/adaln_kernels.h), as PTX and CUDA intrinsics: the GPU's
// counterpart of model/simt/simt.h's simt::Primitives. For .cu files only; each file that
// includes it gets its own (internal) copy, Smem() being that file's kernels' dynamic shared
// memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/common.h"

namespace difftrain::cuda {
namespace {

extern __shared__ __align__(128) unsigned char g_dynamic_smem[];

struct DevicePrimitives {
  __device__ static int Thread() { return threadIdx.x; }
  __device__ static int BlockX() { return blockIdx.x; }
  __device__ static int BlockY() { return blockIdx.y; }
  __device__ static int BlockZ() { return blockIdx.z; }
  __device__ static unsigned char* Smem() { return g_dynamic_smem; }
  __device__ static void SyncThreads() { __syncthreads(); }
  __device__ static void LdMatrixX4(uint32_t (&r)[4], const void* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
  __device__ static void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
  __device__ static void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static float ShflXor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ static uint32_t PackBf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo: the low half
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ static float Bf16ToFloat(uint16_t bits) {
    return __uint_as_float(uint32_t{bits} << 16);
  }
  __device__ static float Exp2(float x) { return exp2f(x); }
  __device__ static float Log2(float x) { return log2f(x); }
  __device__ static void Copy16(void* dst, const void* src) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  }
  __device__ static void Zero16(void* dst) { *static_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0); }
  __device__ static void Store32(void* dst, uint32_t v) { *static_cast<uint32_t*>(dst) = v; }
  // cp.async.cg: 16 bytes from global to shared memory, bypassing L1.
  __device__ static void CopyAsync16(void* dst, const void* src) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(src) : "memory");
  }
  __device__ static void CommitGroup() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  __device__ static void WaitPrior() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
  __device__ static void WaitAll() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
  // The elementwise kernels' vector accesses (model/cuda/adaln_kernels.h): 16 bytes of fp32,
  // 8 of bf16 bits.
  __device__ static void LoadF32x4(float (&v)[4], const float* p) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  }
  __device__ static void StoreF32x4(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  __device__ static void LoadU16x4(uint16_t (&bits)[4], const uint16_t* p) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    bits[0] = q.x & 0xFFFFu, bits[1] = q.x >> 16, bits[2] = q.y & 0xFFFFu, bits[3] = q.y >> 16;
  }
  __device__ static void StoreU16x4(uint16_t* p, const uint16_t (&bits)[4]) {
    *reinterpret_cast<uint2*>(p) =
        make_uint2(bits[0] | (uint32_t{bits[1]} << 16), bits[2] | (uint32_t{bits[3]} << 16));
  }
  __device__ static uint16_t RoundBf16(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  // FP8 (model/cuda/fp8_kernels.h): format 0 E4M3, 1 E5M2, rounded to nearest even, saturated.
  __device__ static uint8_t ToFp8(float x, int format) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format == 0 ? __NV_E4M3 : __NV_E5M2);
  }
  // A non-negative float's bits order as ints do.
  __device__ static void AtomicMaxNonNegative(float* p, float v) {
    atomicMax(reinterpret_cast<int*>(p), __float_as_int(v));
  }
};

// bf16 values as the kernel bodies take them: their bits.
inline const uint16_t* Bits(const bf16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}
inline uint16_t* Bits(bf16* p) {
  return reinterpret_cast<uint16_t*>(p);
}

}  // namespace
}  // namespace difftrain::cuda
