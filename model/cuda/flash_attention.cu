// The GPU side of model/cuda/flash_kernels.h: the kernels, with the primitives of
// model/cuda/device_primitives.cuh (PTX ldmatrix, mma.sync, cp.async), and their launchers.
#include "model/cuda/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "model/cuda/activation.h"
#include "model/cuda/attention.h"
#include "model/cuda/device_primitives.cuh"
#include "model/cuda/flash_kernels.h"
#include "model/cuda/flash_short_kernels.h"

namespace difftrain::cuda {
namespace {

__global__ void __launch_bounds__(flash::kThreads) FlashDeltaKernel(flash::DeltaArgs args) {
  flash::Delta<DevicePrimitives>(args);
}

template <int HDP, int kStages, int kMTiles>
__global__ void __launch_bounds__(flash::kThreads) FlashForwardKernel(flash::ForwardArgs args) {
  flash::Forward<HDP, DevicePrimitives, kStages, kMTiles>(args);
}
// The two-stage forward asks for 4 blocks an SM (at most 128 registers a thread): at hd 80 it
// took 130 otherwise, which leaves room for 3 (ptxas then spills 4 bytes). A minimum of 1 block
// is not the same as none: the one-stage kernels took 130–146 registers with it, 121–127
// without.
template <int HDP>
__global__ void __launch_bounds__(flash::kThreads, 4)
    FlashForwardPipelinedKernel(flash::ForwardArgs args) {
  flash::Forward<HDP, DevicePrimitives, 2>(args);
}
template <int HDP, int kStages>
__global__ void __launch_bounds__(flash::kThreads) FlashDqKernel(flash::BackwardArgs args) {
  flash::BackwardDq<HDP, DevicePrimitives, kStages>(args);
}
template <int HDP, int kStages, bool kStore>
__global__ void __launch_bounds__(flash::kThreads) FlashDkvKernel(flash::BackwardArgs args) {
  flash::BackwardDkv<HDP, DevicePrimitives, kStages, kStore>(args);
}
// The two-stage dK/dV kernel up to head dim 80 asks for 3 blocks an SM on sm_90 (at most 168
// registers a thread). Without the bound it took 227 at hd 80: 2 blocks, 8 warps an SM, the
// occupancy ncu measured on an H100 (12.5%) and named as the limit (docs/benchmarks.md); with
// it ptxas (CUDA 13.0) keeps hd 64 and 80 without spills there. hd 128 spilled 352 bytes, so it
// keeps its registers, and sm_80 spilled 60 bytes at hd 80, so sm_80 builds have no bound.
// Not yet timed: bench_cuda_attention's flash-pipelined rows say whether it pays (253 us for
// DiT-XL/2's backward at micro-batch 32 on the H100 before it).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DT_FLASH_DKV_BOUNDS __launch_bounds__(flash::kThreads)
#else
#define DT_FLASH_DKV_BOUNDS __launch_bounds__(flash::kThreads, 3)
#endif
template <int HDP, bool kStore>
__global__ void DT_FLASH_DKV_BOUNDS FlashDkvThreeBlocksKernel(flash::BackwardArgs args) {
  flash::BackwardDkv<HDP, DevicePrimitives, 2, kStore>(args);
}
#undef DT_FLASH_DKV_BOUNDS
template <int HDP, int kStages>
__global__ void __launch_bounds__(flash::kThreads) FlashDqStoredKernel(flash::BackwardArgs args) {
  flash::BackwardDqStored<HDP, DevicePrimitives, kStages>(args);
}
template <int HDP>
__global__ void __launch_bounds__(flash::kThreads)
    FlashShortForwardKernel(flash::ForwardArgs args, int sequences) {
  flash::ShortForward<HDP, DevicePrimitives>(args, sequences);
}
template <int HDP>
__global__ void __launch_bounds__(flash::kThreads)
    FlashShortBackwardKernel(flash::BackwardArgs args, int sequences) {
  flash::ShortBackward<HDP, DevicePrimitives>(args, sequences);
}
template <int HDP, int kStages>
constexpr bool kDkvThreeBlocks = kStages == 2 && HDP <= 80;
// kStore: storing the score gradients for FlashDqStoredKernel (ptxas, CUDA 13.0, sm_90: the
// three-blocks kernel then spills 20 bytes at hd 80 and 4 at hd 64; the dQ kernel that reads
// them takes 96 registers at hd 80, 64 at hd 64, against 156 and 144 for the recomputing one).
template <int HDP, int kStages, bool kStore = false>
constexpr auto DkvKernel() {
  if constexpr (kDkvThreeBlocks<HDP, kStages>) {
    return &FlashDkvThreeBlocksKernel<HDP, kStore>;
  } else {
    return &FlashDkvKernel<HDP, kStages, kStore>;
  }
}

// Launches `kernel` over (⌈rows/block_rows⌉, H, B) with `smem` bytes of dynamic shared memory.
template <typename Args>
void Launch(void (*kernel)(Args), const Args& args, int rows, int H, int B, size_t smem,
            cudaStream_t stream, int block_rows = flash::kRows) {
  // (A grid's y and z stop at 65,535: Latte's temporal attention has a sequence a token of each
  // video, B·T of them, past that at 256 videos of 256 tokens; the short-sequence kernels, one
  // dimension, take up to 16 frames at any count.)
  DT_CHECK(B <= 65535 && H <= 65535,
           "the flash kernels take up to 65,535 sequences and heads a launch, found {} and {}", B,
           H);
  const dim3 grid((rows + block_rows - 1) / block_rows, H, B);
  kernel<<<grid, flash::kThreads, smem, stream>>>(args);
  DT_CUDA_CHECK_LAUNCH();
}

template <typename Kernel>
bool AllowSmem(Kernel kernel, size_t bytes) {
  DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  return true;
}
// AllowSmem, and the SM's shared memory at its largest while the kernel runs (the L1 cache at
// its smallest: the flash kernels' operands go through shared memory), so that 3 blocks of
// 68.5 KiB fit an SM.
template <typename Kernel>
bool AllowSmemForThreeBlocks(Kernel kernel, size_t bytes) {
  DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  return AllowSmem(kernel, bytes);
}

void LaunchDelta(const flash::DeltaArgs& a, cudaStream_t stream) {
  DT_CHECK(a.B > 0 && a.T > 0 && a.H > 0 && a.D % a.H == 0 && (a.D / a.H) % 8 == 0,
           "the attention's delta takes head dims that are multiples of 8: D={} H={}", a.D, a.H);
  DT_CHECK(reinterpret_cast<uintptr_t>(a.dout) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && a.o_stride % 8 == 0 &&
               a.o_inner % 8 == 0,
           "the attention's dout and out rows must be 16-byte aligned");
  const size_t smem = flash::DeltaSmemBytes(a.D);
  DT_CHECK(smem <= 48 * 1024, "the attention's delta takes D up to {}, found {}",
           48 * 1024 / (flash::kWarps * sizeof(float)) * 8, a.D);
  FlashDeltaKernel<<<BlocksFor(size_t(a.B) * a.T, flash::kWarps), flash::kThreads, smem, stream>>>(
      a);
  DT_CUDA_CHECK_LAUNCH();
}

flash::Operands MakeOperands(const bf16* q, const bf16* k, const bf16* v, size_t q_stride,
                             size_t kv_stride, int B, int Tq, int Tk, int D, int H) {
  CheckAttentionShape(q, k, v, q_stride, kv_stride, B, Tq, Tk, D, H, flash::kMaxHeadDim);
  return {reinterpret_cast<const uint16_t*>(q),
          reinterpret_cast<const uint16_t*>(k),
          reinterpret_cast<const uint16_t*>(v),
          q_stride,
          kv_stride,
          Tq,
          Tk,
          D,
          H,
          1.0f / std::sqrt(static_cast<float>(D / H))};
}

}  // namespace

void AttentionDelta(float* delta, const bf16* dout, const bf16* out, int B, int T, int D, int H,
                    cudaStream_t stream) {
  LaunchDelta({reinterpret_cast<const uint16_t*>(dout), reinterpret_cast<const uint16_t*>(out),
               delta, B, T, D, H},
              stream);
}

bool FlashAttentionTakes(int hd) {
  return hd > 0 && hd % 8 == 0 && hd <= flash::kMaxHeadDim;
}

size_t FlashAttentionSharedBytes(int hd, FlashStages stages) {
  return flash::WithPaddedHeadDim(hd, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    const auto most = [](auto staged) {
      constexpr int kStages = decltype(staged)::value;
      return std::max({flash::ForwardSmemBytes<HDP, kStages>(), flash::DqSmemBytes<HDP, kStages>(),
                       flash::DkvSmemBytes<HDP, kStages>()});
    };
    const size_t staged = stages == FlashStages::kTwo ? most(std::integral_constant<int, 2>())
                                                      : most(std::integral_constant<int, 1>());
    return std::max(
        {staged, flash::ShortForwardSmemBytes<HDP>(), flash::ShortBackwardSmemBytes<HDP>()});
  });
}

size_t FlashAttentionBackwardWorkspace(int B, int Tq, int H) {
  return static_cast<size_t>(B) * H * Tq;
}

namespace {
// Where the stored score gradients start in the workspace: after delta, 16-byte aligned.
size_t StoredScoresOffset(int B, int Tq, int H) {
  return (FlashAttentionBackwardWorkspace(B, Tq, H) + 3) / 4 * 4;
}
}  // namespace

namespace {
// The column sums' rows [B·⌈T/64⌉, 3·D] after the score gradients, 16-byte aligned.
size_t ColumnSumsOffset(int B, int T, int H) {
  const size_t scores = size_t(B) * H * flash::StoredScoresRows(T) * flash::StoredScoresRows(T);
  return (StoredScoresOffset(B, T, H) + (scores + 1) / 2 + 3) / 4 * 4;  // two bf16 a float
}
size_t ColumnSumsRows(int B, int T) {
  return size_t(B) * (flash::StoredScoresRows(T) / flash::kRows);
}
}  // namespace

size_t FlashAttentionBackwardStoredWorkspace(int B, int T, int D, int H) {
  return ColumnSumsOffset(B, T, H) + ColumnSumsRows(B, T) * 3 * D;
}

namespace {

// Latte's temporal attention over a frame-major video qkv [B, F, T, 3·D]: B·T sequences (token n
// of sample s is sequence s·T + n) of F positions a frame (T·3·D elements) apart; out [B, F, T,
// D] likewise.
flash::Operands AcrossFrames(const bf16* qkv, int B, int F, int T, int D, int H) {
  const size_t stride = size_t(T) * 3 * D;
  flash::Operands in = MakeOperands(qkv, qkv + D, qkv + 2 * D, stride, stride, B * T, F, F, D, H);
  in.inner = T;
  in.q_inner = in.kv_inner = 3 * size_t(D);
  in.o_stride = size_t(T) * D;
  in.o_inner = D;
  return in;
}

// kMTiles: the query m-tiles a warp owns (a block's rows: kMTiles·64). B: the sequences.
template <int kStages, int kMTiles = 1>
void ForwardOn(const flash::Operands& in, bf16* out, float* lse, int B, cudaStream_t stream) {
  const flash::ForwardArgs args{in, Bits(out), lse};
  const int Tq = in.Tq, D = in.D, H = in.H;
  DT_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "out is not 16-byte aligned");
  flash::WithPaddedHeadDim(D / H, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    constexpr size_t kSmem = flash::ForwardSmemBytes<HDP, kStages, kMTiles>();
    // (if constexpr: a conditional expression would instantiate both kernels)
    constexpr auto kernel = [] {
      if constexpr (kStages == 2 && kMTiles == 1) {
        return &FlashForwardPipelinedKernel<HDP>;
      } else {
        return &FlashForwardKernel<HDP, kStages, kMTiles>;
      }
    }();
    static const bool allowed = AllowSmem(kernel, kSmem);
    static_cast<void>(allowed);
    Launch(kernel, args, Tq, H, B, kSmem, stream, kMTiles * flash::kRows);
  });
}

template <int kStages, int kMTiles = 1>
void Forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, size_t q_stride,
             size_t kv_stride, int B, int Tq, int Tk, int D, int H, cudaStream_t stream) {
  ForwardOn<kStages, kMTiles>(MakeOperands(q, k, v, q_stride, kv_stride, B, Tq, Tk, D, H), out, lse,
                              B, stream);
}

// dq, dk, dv share q's, k's and v's layout (strides, inner offsets), dout out's. kStored: dQ
// from the score gradients the dK/dV kernel stores in the workspace
// (FlashAttentionBackwardStoredWorkspace).
template <int kStages, bool kStored = false>
void BackwardOn(const flash::Operands& in, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                const bf16* out, const float* lse, float* workspace, int B, cudaStream_t stream,
                float* dqkv_bias = nullptr) {
  const int Tq = in.Tq, Tk = in.Tk, D = in.D, H = in.H;
  for (const void* p :
       {static_cast<const void*>(dq), static_cast<const void*>(dk), static_cast<const void*>(dv),
        static_cast<const void*>(dout), static_cast<const void*>(out)}) {
    DT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
             "dq, dk, dv, dout and out must be 16-byte aligned");
  }
  float* delta = workspace;
  LaunchDelta({reinterpret_cast<const uint16_t*>(dout), reinterpret_cast<const uint16_t*>(out),
               delta, B, Tq, D, H, in.inner, in.o_stride, in.o_inner},
              stream);
  flash::BackwardArgs args{
      in, reinterpret_cast<const uint16_t*>(dout), lse, delta, Bits(dq), Bits(dk), Bits(dv)};
  if constexpr (kStored) {
    // (The workspace's layout, FlashAttentionBackwardStoredWorkspace, is self-attention's.)
    DT_CHECK(Tq == Tk, "the stored-score backward takes self-attention, found Tq={} Tk={}", Tq, Tk);
    args.ds = reinterpret_cast<uint16_t*>(workspace + StoredScoresOffset(B, Tq, H));
    args.ds_rows = flash::StoredScoresRows(Tk);
    args.ds_cols = flash::StoredScoresRows(Tq);
    if (dqkv_bias != nullptr) {  // packed self-attention (FlashAttentionBackwardStored)
      args.dq_sums = workspace + ColumnSumsOffset(B, Tq, H);
      args.dk_sums = args.dq_sums + D;
      args.dv_sums = args.dq_sums + 2 * D;
      args.sums_stride = 3 * size_t(D);
    }
  }
  flash::WithPaddedHeadDim(D / H, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    constexpr size_t kDq =
        kStored ? flash::DqStoredSmemBytes<HDP, kStages>() : flash::DqSmemBytes<HDP, kStages>();
    constexpr size_t kDkv = flash::DkvSmemBytes<HDP, kStages>();
    constexpr auto dq_kernel = [] {
      if constexpr (kStored) {
        return &FlashDqStoredKernel<HDP, kStages>;
      } else {
        return &FlashDqKernel<HDP, kStages>;
      }
    }();
    constexpr auto dkv = DkvKernel<HDP, kStages, kStored>();
    static const bool allowed =
        AllowSmem(dq_kernel, kDq) &&
        (kDkvThreeBlocks<HDP, kStages> ? AllowSmemForThreeBlocks(dkv, kDkv) : AllowSmem(dkv, kDkv));
    static_cast<void>(allowed);
    if constexpr (kStored) {
      Launch(dkv, args, Tk, H, B, kDkv, stream);  // stores dSᵀ, which the dQ kernel reads
      Launch(dq_kernel, args, Tq, H, B, kDq, stream);
      if (dqkv_bias != nullptr) {
        BiasGradient(dqkv_bias, args.dq_sums, static_cast<int>(ColumnSumsRows(B, Tq)), 3 * D,
                     stream);
      }
    } else {
      Launch(dq_kernel, args, Tq, H, B, kDq, stream);
      Launch(dkv, args, Tk, H, B, kDkv, stream);
    }
  });
}

// The short-sequence kernels over B sequences (flash_short_kernels.h): one block of kWarps
// warps for every kWarps (sequence, head) pairs.
void CheckShort(const flash::Operands& in, int B) {
  DT_CHECK(flash::ShortFits(in.Tq, in.Tk),
           "the short-sequence attention takes up to {} queries and keys, found Tq={} Tk={}",
           flash::kShortRows, in.Tq, in.Tk);
  DT_CHECK(flash::ShortBlocks(B, in.H) <= 0x7fffffff, "{} sequences of {} heads are too many", B,
           in.H);
}

// Launches a short-sequence kernel over B sequences of H heads with `smem` bytes of shared
// memory (allowed by the caller).
template <typename Args>
void LaunchShort(void (*kernel)(Args, int), const Args& args, size_t smem, int B, int H,
                 cudaStream_t stream) {
  kernel<<<static_cast<unsigned>(flash::ShortBlocks(B, H)), flash::kThreads, smem, stream>>>(args,
                                                                                             B);
  DT_CUDA_CHECK_LAUNCH();
}

void ShortForwardOn(const flash::Operands& in, bf16* out, float* lse, int B, cudaStream_t stream) {
  CheckShort(in, B);
  DT_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "out is not 16-byte aligned");
  const flash::ForwardArgs args{in, Bits(out), lse};
  flash::WithPaddedHeadDim(in.D / in.H, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    constexpr size_t kSmem = flash::ShortForwardSmemBytes<HDP>();
    static const bool allowed = AllowSmem(&FlashShortForwardKernel<HDP>, kSmem);
    static_cast<void>(allowed);
    LaunchShort(&FlashShortForwardKernel<HDP>, args, kSmem, B, in.H, stream);
  });
}

// dqkv_bias: with the packed qkv's layout (dk = dq + D, dv = dq + 2·D), the column sums through
// `workspace`, a row of 3·D a sequence, then added up into dqkv_bias.
void ShortBackwardOn(const flash::Operands& in, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                     const bf16* out, const float* lse, int B, cudaStream_t stream,
                     float* workspace = nullptr, float* dqkv_bias = nullptr) {
  CheckShort(in, B);
  for (const void* p :
       {static_cast<const void*>(dq), static_cast<const void*>(dk), static_cast<const void*>(dv),
        static_cast<const void*>(dout), static_cast<const void*>(out)}) {
    DT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
             "dq, dk, dv, dout and out must be 16-byte aligned");
  }
  DT_CHECK(in.o_stride % 8 == 0 && in.o_inner % 8 == 0,
           "the attention's dout and out rows must be 16-byte aligned");
  flash::BackwardArgs args{
      in, reinterpret_cast<const uint16_t*>(dout), lse, nullptr, Bits(dq), Bits(dk), Bits(dv)};
  args.out = reinterpret_cast<const uint16_t*>(out);
  if (dqkv_bias != nullptr) {
    DT_CHECK(workspace != nullptr && dk == dq + in.D && dv == dq + 2 * in.D,
             "the short backward makes qkv's bias gradient for a packed qkv, with its workspace");
    args.dq_sums = workspace;
    args.dk_sums = workspace + in.D;
    args.dv_sums = workspace + 2 * in.D;
    args.sums_stride = 3 * size_t(in.D);
  }
  flash::WithPaddedHeadDim(in.D / in.H, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    constexpr size_t kSmem = flash::ShortBackwardSmemBytes<HDP>();
    static const bool allowed = AllowSmem(&FlashShortBackwardKernel<HDP>, kSmem);
    static_cast<void>(allowed);
    LaunchShort(&FlashShortBackwardKernel<HDP>, args, kSmem, B, in.H, stream);
  });
  if (dqkv_bias != nullptr) BiasGradient(dqkv_bias, workspace, B, 3 * in.D, stream);
}

template <int kStages>
void Backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
              const bf16* v, size_t q_stride, size_t kv_stride, const bf16* out, const float* lse,
              float* workspace, int B, int Tq, int Tk, int D, int H, cudaStream_t stream) {
  BackwardOn<kStages>(MakeOperands(q, k, v, q_stride, kv_stride, B, Tq, Tk, D, H), dq, dk, dv, dout,
                      out, lse, workspace, B, stream);
}

}  // namespace

void FlashAttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           size_t q_stride, size_t kv_stride, int B, int Tq, int Tk, int D, int H,
                           cudaStream_t stream) {
  Forward<1>(out, lse, q, k, v, q_stride, kv_stride, B, Tq, Tk, D, H, stream);
}

void FlashAttentionForwardPipelined(bf16* out, float* lse, const bf16* q, const bf16* k,
                                    const bf16* v, size_t q_stride, size_t kv_stride, int B, int Tq,
                                    int Tk, int D, int H, cudaStream_t stream) {
  Forward<2>(out, lse, q, k, v, q_stride, kv_stride, B, Tq, Tk, D, H, stream);
}

void FlashAttentionForwardWide(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                               FlashStages stages, cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  const auto forward = stages == FlashStages::kTwo ? &Forward<2, 2> : &Forward<1, 2>;
  forward(out, lse, qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H, stream);
}

void FlashAttentionForward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                           cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  FlashAttentionForward(out, lse, qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H, stream);
}

void FlashAttentionForwardPipelined(bf16* out, float* lse, const bf16* qkv, int B, int T, int D,
                                    int H, cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  FlashAttentionForwardPipelined(out, lse, qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H,
                                 stream);
}

void FlashAttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                            const bf16* k, const bf16* v, size_t q_stride, size_t kv_stride,
                            const bf16* out, const float* lse, float* workspace, int B, int Tq,
                            int Tk, int D, int H, cudaStream_t stream) {
  Backward<1>(dq, dk, dv, dout, q, k, v, q_stride, kv_stride, out, lse, workspace, B, Tq, Tk, D, H,
              stream);
}

void FlashAttentionBackwardPipelined(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                                     const bf16* k, const bf16* v, size_t q_stride,
                                     size_t kv_stride, const bf16* out, const float* lse,
                                     float* workspace, int B, int Tq, int Tk, int D, int H,
                                     cudaStream_t stream) {
  Backward<2>(dq, dk, dv, dout, q, k, v, q_stride, kv_stride, out, lse, workspace, B, Tq, Tk, D, H,
              stream);
}

void FlashAttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                            const float* lse, float* workspace, int B, int T, int D, int H,
                            cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  FlashAttentionBackward(dqkv, dqkv + D, dqkv + 2 * D, dout, qkv, qkv + D, qkv + 2 * D, stride,
                         stride, out, lse, workspace, B, T, T, D, H, stream);
}

void FlashAttentionBackwardPipelined(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                     const float* lse, float* workspace, int B, int T, int D, int H,
                                     cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  FlashAttentionBackwardPipelined(dqkv, dqkv + D, dqkv + 2 * D, dout, qkv, qkv + D, qkv + 2 * D,
                                  stride, stride, out, lse, workspace, B, T, T, D, H, stream);
}

void FlashAttentionBackwardStored(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                  const float* lse, float* workspace, int B, int T, int D, int H,
                                  FlashStages stages, cudaStream_t stream, float* dqkv_bias) {
  const size_t stride = 3 * size_t(D);
  const flash::Operands in = MakeOperands(qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H);
  DT_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
           "the attention's workspace must be 16-byte aligned");
  const auto backward =
      stages == FlashStages::kTwo ? &BackwardOn<2, /*kStored=*/true> : &BackwardOn<1, true>;
  backward(in, dqkv, dqkv + D, dqkv + 2 * D, dout, out, lse, workspace, B, stream, dqkv_bias);
}

void FlashAttentionForwardShort(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                                cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  ShortForwardOn(MakeOperands(qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H), out, lse,
                 B, stream);
}

size_t FlashAttentionBackwardShortWorkspace(int B, int D) {
  return size_t(B) * 3 * D;
}

void FlashAttentionBackwardShort(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                 const float* lse, int B, int T, int D, int H, cudaStream_t stream,
                                 float* workspace, float* dqkv_bias) {
  const size_t stride = 3 * size_t(D);
  ShortBackwardOn(MakeOperands(qkv, qkv + D, qkv + 2 * D, stride, stride, B, T, T, D, H), dqkv,
                  dqkv + D, dqkv + 2 * D, dout, out, lse, B, stream, workspace, dqkv_bias);
}

void FlashAttentionForwardAcrossFrames(bf16* out, float* lse, const bf16* qkv, int B, int F, int T,
                                       int D, int H, FlashStages stages, bool wide,
                                       cudaStream_t stream, bool short_kernels) {
  const flash::Operands in = AcrossFrames(qkv, B, F, T, D, H);
  if (short_kernels && FlashShortFits(F, F)) return ShortForwardOn(in, out, lse, B * T, stream);
  const bool two = stages == FlashStages::kTwo;
  const auto forward = wide ? (two ? &ForwardOn<2, 2> : &ForwardOn<1, 2>)
                            : (two ? &ForwardOn<2, 1> : &ForwardOn<1, 1>);
  forward(in, out, lse, B * T, stream);
}

void FlashAttentionBackwardAcrossFrames(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                        const bf16* out, const float* lse, float* workspace, int B,
                                        int F, int T, int D, int H, FlashStages stages,
                                        cudaStream_t stream, bool short_kernels, float* dqkv_bias) {
  const flash::Operands in = AcrossFrames(qkv, B, F, T, D, H);
  if (short_kernels && FlashShortFits(F, F)) {
    return ShortBackwardOn(in, dqkv, dqkv + D, dqkv + 2 * D, dout, out, lse, B * T, stream,
                           workspace, dqkv_bias);
  }
  DT_CHECK(dqkv_bias == nullptr, "only the short-sequence kernels make qkv's bias gradient");
  const auto backward = stages == FlashStages::kTwo ? &BackwardOn<2> : &BackwardOn<1>;
  backward(in, dqkv, dqkv + D, dqkv + 2 * D, dout, out, lse, workspace, B * T, stream, nullptr);
}

}  // namespace difftrain::cuda
