// DiT's input and output layers on the GPU (model/cuda/embed.h; model/cpu/embed.cc is the
// reference): the patch reshapes and the position, timestep and label embeddings.
//
// Everything is a grid-stride loop over its output elements, so each element is written by
// one thread. The label embedding's backward gives each feature to one thread, which walks
// the samples in order (two samples may share a label, hence a row): deterministic, no
// atomics.
#include "model/cuda/embed.h"

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

unsigned GridFor(size_t n) {
  const unsigned blocks = BlocksFor(n, kThreads);
  return blocks < 65536u ? blocks : 65536u;
}

#define DT_GRID_STRIDE(i, n)                                                           \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

// Element i of patches [B·T, C·p·p] reads img[b, c, gi·p + ki, gj·p + kj].
__global__ void PatchifyKernel(bf16* __restrict__ patches, const float* __restrict__ x, int C,
                               int S, int p, size_t n) {
  const int features = C * p * p, grid = S / p, tokens = grid * grid;
  DT_GRID_STRIDE(i, n) {
    const size_t token = i / features;
    const int f = static_cast<int>(i % features);
    const int c = f / (p * p), ki = (f / p) % p, kj = f % p;
    const size_t b = token / tokens;
    const int t = static_cast<int>(token % tokens), gi = t / grid, gj = t % grid;
    patches[i] = __float2bfloat16(x[((b * C + c) * S + gi * p + ki) * S + gj * p + kj]);
  }
}

// The token element of img[b, c, y, x] (img index i): feature ((y % p)·p + x % p)·C + c of
// token (y / p)·(S / p) + x / p.
__device__ __forceinline__ size_t TokenIndex(size_t i, int C, int S, int p) {
  const int x = static_cast<int>(i % S), y = static_cast<int>((i / S) % S);
  const size_t bc = i / (static_cast<size_t>(S) * S);
  const int c = static_cast<int>(bc % C);
  const size_t b = bc / C;
  const int grid = S / p;
  const size_t token = b * grid * grid + static_cast<size_t>(y / p) * grid + x / p;
  return token * (static_cast<size_t>(p) * p * C) + ((y % p) * p + x % p) * C + c;
}

__global__ void UnpatchifyKernel(float* __restrict__ out, const float* __restrict__ tokens, int C,
                                 int S, int p, size_t n) {
  DT_GRID_STRIDE(i, n) {
    out[i] = tokens[TokenIndex(i, C, S, p)];
  }
}

// The permutation is a bijection, so walking the image writes every token element once.
__global__ void UnpatchifyBackwardKernel(float* __restrict__ dtokens,
                                         const float* __restrict__ dout, int C, int S, int p,
                                         size_t n) {
  DT_GRID_STRIDE(i, n) {
    dtokens[TokenIndex(i, C, S, p)] = dout[i];
  }
}

// resid may alias emb.
__global__ void AddPositionEmbeddingKernel(float* resid, const float* emb,
                                           const float* __restrict__ pos, size_t per_sample,
                                           size_t n) {
  DT_GRID_STRIDE(i, n) {
    resid[i] = emb[i] + pos[i % per_sample];
  }
}

// Element i of out [B, Y, X, w] is in[b, x, y, :] at feature i % w.
__global__ void SwapAxesKernel(bf16* __restrict__ out, const bf16* __restrict__ in, int X, int Y,
                               int w, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const int f = static_cast<int>(i % w);
    const size_t row = i / w;
    const int x = static_cast<int>(row % X), y = static_cast<int>((row / X) % Y);
    const size_t b = row / (static_cast<size_t>(X) * Y);
    out[i] = in[((b * X + x) * Y + y) * w + f];
  }
}

// In double precision like the CPU, rounded to float, then to bf16.
__global__ void TimestepFrequenciesKernel(bf16* __restrict__ out, const float* __restrict__ t,
                                          int half, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const size_t b = i / half;
    const int k = static_cast<int>(i % half);
    const double freq = exp(-log(10000.0) * k / half);
    const double arg = static_cast<double>(t[b]) * freq;
    out[b * 2 * half + k] = __float2bfloat16(static_cast<float>(cos(arg)));
    out[b * 2 * half + half + k] = __float2bfloat16(static_cast<float>(sin(arg)));
  }
}

__global__ void AddLabelEmbeddingKernel(float* c, const float* t_emb,
                                        const float* __restrict__ table,
                                        const int32_t* __restrict__ y, int D, size_t n) {
  DT_GRID_STRIDE(i, n) {
    const size_t b = i / D;
    c[i] = t_emb[i] + table[static_cast<size_t>(y[b]) * D + i % D];
  }
}

// One thread per feature, samples in order.
__global__ void LabelEmbeddingBackwardKernel(float* __restrict__ dtable,
                                             const float* __restrict__ dc,
                                             const int32_t* __restrict__ y, int B, int D) {
  for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += gridDim.x * blockDim.x) {
    for (int b = 0; b < B; ++b)
      dtable[static_cast<size_t>(y[b]) * D + d] += dc[static_cast<size_t>(b) * D + d];
  }
}

#undef DT_GRID_STRIDE

}  // namespace

void Patchify(bf16* patches, const float* x, int B, int C, int S, int p, cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && p > 0 && S % p == 0, "cannot patchify {}x{}x{}x{} by {}", B, C, S, S,
           p);
  const size_t n = static_cast<size_t>(B) * C * S * S;
  PatchifyKernel<<<GridFor(n), kThreads, 0, stream>>>(patches, x, C, S, p, n);
  DT_CUDA_CHECK_LAUNCH();
}

void Unpatchify(float* out, const float* tokens, int B, int C, int S, int p, cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && p > 0 && S % p == 0, "cannot unpatchify {}x{}x{}x{} by {}", B, C, S, S,
           p);
  const size_t n = static_cast<size_t>(B) * C * S * S;
  UnpatchifyKernel<<<GridFor(n), kThreads, 0, stream>>>(out, tokens, C, S, p, n);
  DT_CUDA_CHECK_LAUNCH();
}

void UnpatchifyBackward(float* dtokens, const float* dout, int B, int C, int S, int p,
                        cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && p > 0 && S % p == 0, "cannot unpatchify {}x{}x{}x{} by {}", B, C, S, S,
           p);
  const size_t n = static_cast<size_t>(B) * C * S * S;
  UnpatchifyBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dtokens, dout, C, S, p, n);
  DT_CUDA_CHECK_LAUNCH();
}

void AddPositionEmbedding(float* resid, const float* emb, const float* pos, int B, int T, int D,
                          cudaStream_t stream) {
  DT_CHECK(B > 0 && T > 0 && D > 0, "bad shape B={} T={} D={}", B, T, D);
  const size_t per_sample = static_cast<size_t>(T) * D, n = per_sample * B;
  AddPositionEmbeddingKernel<<<GridFor(n), kThreads, 0, stream>>>(resid, emb, pos, per_sample, n);
  DT_CUDA_CHECK_LAUNCH();
}

void SwapAxes(bf16* out, const bf16* in, int B, int X, int Y, int w, cudaStream_t stream) {
  DT_CHECK(B > 0 && X > 0 && Y > 0 && w > 0, "bad shape [{}, {}, {}, {}]", B, X, Y, w);
  const size_t n = static_cast<size_t>(B) * X * Y * w;
  SwapAxesKernel<<<GridFor(n), kThreads, 0, stream>>>(out, in, X, Y, w, n);
  DT_CUDA_CHECK_LAUNCH();
}

void TimestepFrequencies(bf16* out, const float* t, int B, int dim, cudaStream_t stream) {
  DT_CHECK(B > 0 && dim > 0 && dim % 2 == 0, "timestep features [{}, {}]: dim must be even", B,
           dim);
  const size_t n = static_cast<size_t>(B) * (dim / 2);
  TimestepFrequenciesKernel<<<GridFor(n), kThreads, 0, stream>>>(out, t, dim / 2, n);
  DT_CUDA_CHECK_LAUNCH();
}

void AddLabelEmbedding(float* c, const float* t_emb, const float* table, const int32_t* y, int B,
                       int D, cudaStream_t stream) {
  DT_CHECK(B > 0 && D > 0, "bad shape B={} D={}", B, D);
  const size_t n = static_cast<size_t>(B) * D;
  AddLabelEmbeddingKernel<<<GridFor(n), kThreads, 0, stream>>>(c, t_emb, table, y, D, n);
  DT_CUDA_CHECK_LAUNCH();
}

void LabelEmbeddingBackward(float* dtable, const float* dc, const int32_t* y, int B, int D,
                            cudaStream_t stream) {
  DT_CHECK(B > 0 && D > 0, "bad shape B={} D={}", B, D);
  LabelEmbeddingBackwardKernel<<<BlocksFor(D, 128), 128, 0, stream>>>(dtable, dc, y, B, D);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
