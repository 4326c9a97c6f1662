// What a kernel body written once for nvcc and the CPU emulator (model/simt) needs to compile
// under both: device functions that inline on the GPU and are plain inline functions on the
// CPU, and unrolling on the GPU only.
#pragma once

#if defined(__CUDACC__)
#define DT_SIMT __device__ __forceinline__
#define DT_UNROLL _Pragma("unroll")
#else
#define DT_SIMT inline
#define DT_UNROLL
#endif
