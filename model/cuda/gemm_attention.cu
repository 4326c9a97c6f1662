// Self-attention as batched GEMMs (model/cuda/gemm_attention.h). Per head i = b·H + h, with
// Q_i, K_i, V_i, dO_i the head's [T, hd] matrices gathered contiguously:
//   forward:  S = scale·Q·Kᵀ (fp32), P = softmax(S) (bf16) and lse, O = P·V
//   backward: S again, dP = dO·Vᵀ (fp32), P = exp(S − lse), dS = P ∘ (dP − delta) (bf16),
//             dV = Pᵀ·dO, dQ = scale·dS·K, dK = scale·dSᵀ·Q
// where delta = rowsum(dO ∘ O) (AttentionDelta). P and dS are rounded to bf16 before their
// products, as the fused kernels round them before their tensor-core products.
#include "model/cuda/gemm_attention.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "model/cuda/attention.h"

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

// Heads ↔ token rows, 8 elements (16 bytes) per thread. `rows` holds B·T rows of `stride`
// elements, head h of row (b, t) at columns h·hd …; `heads` holds [B, H, T, hd] densely.
__global__ void SplitHeadsKernel(bf16* __restrict__ heads, const bf16* __restrict__ rows,
                                 size_t stride, int T, int H, int hd, size_t chunks) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int per_row = hd / 8;
  const size_t c = i % per_row, rest = i / per_row;
  const size_t t = rest % T, bh = rest / T, h = bh % H, b = bh / H;
  const uint4 v = *reinterpret_cast<const uint4*>(rows + (b * T + t) * stride + h * hd + c * 8);
  *reinterpret_cast<uint4*>(heads + i * 8) = v;
}

__global__ void MergeHeadsKernel(bf16* __restrict__ rows, size_t stride,
                                 const bf16* __restrict__ heads, int T, int H, int hd,
                                 size_t chunks) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int per_row = hd / 8;
  const size_t c = i % per_row, rest = i / per_row;
  const size_t t = rest % T, bh = rest / T, h = bh % H, b = bh / H;
  *reinterpret_cast<uint4*>(rows + (b * T + t) * stride + h * hd + c * 8) =
      *reinterpret_cast<const uint4*>(heads + i * 8);
}

// One warp per score row: P = exp(s − max) / Σ (bf16) and lse = max + log Σ.
__global__ void SoftmaxForwardKernel(bf16* __restrict__ p, float* __restrict__ lse,
                                     const float* __restrict__ s, size_t rows, int T) {
  const size_t r = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* row = s + r * T;
  float m = -INFINITY;
  for (int j = lane; j < T; j += 32)
    m = fmaxf(m, row[j]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  float sum = 0;
  for (int j = lane; j < T; j += 32)
    sum += expf(row[j] - m);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inv = 1.0f / sum;
  bf16* p_row = p + r * T;
  for (int j = lane; j < T; j += 32)
    p_row[j] = __float2bfloat16(expf(row[j] - m) * inv);
  if (lane == 0) lse[r] = m + logf(sum);
}

// Elementwise over the scores: P = exp(s − lse), dS = P ∘ (dP − delta), both bf16.
__global__ void SoftmaxBackwardKernel(bf16* __restrict__ p, bf16* __restrict__ ds,
                                      const float* __restrict__ s, const float* __restrict__ dp,
                                      const float* __restrict__ lse,
                                      const float* __restrict__ delta, size_t n, int T) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / T;
    const float prob = expf(s[i] - lse[r]);
    p[i] = __float2bfloat16(prob);
    ds[i] = __float2bfloat16(prob * (dp[i] - delta[r]));
  }
}

// The workspace's pieces, each 256-byte aligned.
struct Workspace {
  bf16 *q, *k, *v, *dout, *dq, *dk, *dv, *p, *ds;
  float *s, *dp, *delta;
  size_t bytes;
};

Workspace Carve(void* base, int B, int T, int D, int H) {
  unsigned char* at = static_cast<unsigned char*>(base);
  size_t offset = 0;
  auto take = [&](auto*& pointer, size_t count) {
    using T0 = std::remove_reference_t<decltype(*pointer)>;
    offset = (offset + 255) / 256 * 256;
    pointer = at == nullptr ? nullptr : reinterpret_cast<T0*>(at + offset);
    offset += count * sizeof(T0);
  };
  const size_t heads = size_t(B) * T * D, scores = size_t(B) * H * T * T;
  Workspace w{};
  take(w.q, heads);
  take(w.k, heads);
  take(w.v, heads);
  take(w.dout, heads);
  take(w.dq, heads);
  take(w.dk, heads);
  take(w.dv, heads);
  take(w.s, scores);
  take(w.dp, scores);
  take(w.p, scores);
  take(w.ds, scores);
  take(w.delta, size_t(B) * H * T);
  w.bytes = offset;
  return w;
}

void Split(bf16* heads, const bf16* rows, size_t stride, int B, int T, int D, int H,
           cudaStream_t stream) {
  const size_t chunks = size_t(B) * T * D / 8;
  SplitHeadsKernel<<<BlocksFor(chunks, kThreads), kThreads, 0, stream>>>(heads, rows, stride, T, H,
                                                                          D / H, chunks);
  DT_CUDA_CHECK_LAUNCH();
}

void Merge(bf16* rows, size_t stride, const bf16* heads, int B, int T, int D, int H,
           cudaStream_t stream) {
  const size_t chunks = size_t(B) * T * D / 8;
  MergeHeadsKernel<<<BlocksFor(chunks, kThreads), kThreads, 0, stream>>>(rows, stride, heads, T, H,
                                                                          D / H, chunks);
  DT_CUDA_CHECK_LAUNCH();
}

void SplitQkv(const Workspace& w, const bf16* qkv, int B, int T, int D, int H,
              cudaStream_t stream) {
  const size_t stride = 3 * size_t(D);
  Split(w.q, qkv, stride, B, T, D, H, stream);
  Split(w.k, qkv + D, stride, B, T, D, H, stream);
  Split(w.v, qkv + 2 * D, stride, B, T, D, H, stream);
}

void Check(const void* workspace, int B, int T, int D, int H) {
  DT_CHECK(B > 0 && GemmAttentionTakes(T, D, H),
           "GEMM attention takes T and head dims that are multiples of 8, T up to {}; got B={} "
           "T={} D={} H={}",
           kMaxGemmAttentionTokens, B, T, D, H);
  DT_CHECK(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
           "the GEMM attention workspace must be 256-byte aligned");
}

}  // namespace

bool GemmAttentionTakes(int T, int D, int H) {
  return T > 0 && T <= kMaxGemmAttentionTokens && T % 8 == 0 && H > 0 && D % H == 0 &&
         (D / H) % 8 == 0;
}

size_t GemmAttentionWorkspaceBytes(int B, int T, int D, int H) {
  return Carve(nullptr, B, T, D, H).bytes;
}

void GemmAttentionForward(Gemm& gemm, bf16* out, float* lse, const bf16* qkv, void* workspace,
                          int B, int T, int D, int H) {
  Check(workspace, B, T, D, H);
  const Workspace w = Carve(workspace, B, T, D, H);
  const cudaStream_t stream = gemm.stream();
  const int hd = D / H, heads = B * H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  SplitQkv(w, qkv, B, T, D, H, stream);
  gemm.Batched(w.s, w.q, false, w.k, true, T, T, hd, heads, scale);
  const size_t rows = size_t(heads) * T;
  SoftmaxForwardKernel<<<BlocksFor(rows * 32, kThreads), kThreads, 0, stream>>>(w.p, lse, w.s,
                                                                                 rows, T);
  DT_CUDA_CHECK_LAUNCH();
  gemm.Batched(w.dq, w.p, false, w.v, false, T, hd, T, heads);  // O, in dq's room
  Merge(out, D, w.dq, B, T, D, H, stream);
}

void GemmAttentionBackward(Gemm& gemm, bf16* dqkv, const bf16* dout, const bf16* qkv,
                           const bf16* out, const float* lse, void* workspace, int B, int T, int D,
                           int H) {
  Check(workspace, B, T, D, H);
  const Workspace w = Carve(workspace, B, T, D, H);
  const cudaStream_t stream = gemm.stream();
  const int hd = D / H, heads = B * H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  SplitQkv(w, qkv, B, T, D, H, stream);
  Split(w.dout, dout, D, B, T, D, H, stream);
  AttentionDelta(w.delta, dout, out, B, T, D, H, stream);
  gemm.Batched(w.s, w.q, false, w.k, true, T, T, hd, heads, scale);
  gemm.Batched(w.dp, w.dout, false, w.v, true, T, T, hd, heads);
  const size_t n = size_t(heads) * T * T;
  SoftmaxBackwardKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(w.p, w.ds, w.s, w.dp, lse,
                                                                          w.delta, n, T);
  DT_CUDA_CHECK_LAUNCH();
  gemm.Batched(w.dv, w.p, true, w.dout, false, T, hd, T, heads);
  gemm.Batched(w.dq, w.ds, false, w.k, false, T, hd, T, heads, scale);
  gemm.Batched(w.dk, w.ds, true, w.q, false, T, hd, T, heads, scale);
  const size_t stride = 3 * size_t(D);
  Merge(dqkv, stride, w.dq, B, T, D, H, stream);
  Merge(dqkv + D, stride, w.dk, B, T, D, H, stream);
  Merge(dqkv + 2 * D, stride, w.dv, B, T, D, H, stream);
}

}  // namespace difftrain::cuda
