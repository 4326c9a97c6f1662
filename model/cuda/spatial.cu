#include "model/cuda/spatial.h"

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ float ToFloat(float v) {
  return v;
}
__device__ __forceinline__ float ToFloat(bf16 v) {
  return __bfloat162float(v);
}

#define DT_ELEMENT(i, n)                                                       \
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
  if (i >= (n)) return

__global__ void UpsampleKernel(float* __restrict__ out, const float* __restrict__ in, int H, int W,
                               size_t n) {
  DT_ELEMENT(i, n);  // over out
  const int x = static_cast<int>(i % (2 * W)), y = static_cast<int>((i / (2 * W)) % (2 * H));
  const size_t p = i / (size_t(4) * H * W);
  out[i] = in[(p * H + y / 2) * W + x / 2];
}

__global__ void UpsampleBackwardKernel(float* __restrict__ din, const float* __restrict__ dout,
                                       int H, int W, size_t n) {
  DT_ELEMENT(i, n);  // over din
  const int x = static_cast<int>(i % W), y = static_cast<int>((i / W) % H);
  const size_t p = i / (size_t(H) * W);
  const float* block = dout + (p * 2 * H + 2 * y) * 2 * W + 2 * x;
  din[i] += block[0] + block[1] + block[2 * W] + block[2 * W + 1];
}

__global__ void ConcatKernel(float* __restrict__ out, const float* __restrict__ a,
                             const float* __restrict__ b, int Ca, int Cb, int HW, size_t n) {
  DT_ELEMENT(i, n);  // over out
  const int C = Ca + Cb, c = static_cast<int>((i / HW) % C);
  const size_t s = i / (size_t(C) * HW), p = i % HW;
  out[i] = c < Ca ? a[(s * Ca + c) * HW + p] : b[(s * Cb + c - Ca) * HW + p];
}

__global__ void ConcatBackwardKernel(float* __restrict__ da, float* __restrict__ db,
                                     const float* __restrict__ dout, int Ca, int Cb, int HW,
                                     size_t n) {
  DT_ELEMENT(i, n);  // over dout
  const int C = Ca + Cb, c = static_cast<int>((i / HW) % C);
  const size_t s = i / (size_t(C) * HW), p = i % HW;
  if (c < Ca) {
    da[(s * Ca + c) * HW + p] += dout[i];
  } else {
    db[(s * Cb + c - Ca) * HW + p] += dout[i];
  }
}

__global__ void ToTokensKernel(bf16* __restrict__ tok, const float* __restrict__ x, int C, int T,
                               size_t n) {
  DT_ELEMENT(i, n);  // over tok
  const int c = static_cast<int>(i % C), t = static_cast<int>((i / C) % T);
  const size_t b = i / (size_t(C) * T);
  tok[i] = __float2bfloat16(x[(b * C + c) * T + t]);
}

template <typename Tok>
__global__ void AddFromTokensKernel(float* __restrict__ x, const Tok* __restrict__ tok, int C,
                                    int T, size_t n) {
  DT_ELEMENT(i, n);  // over x
  const int t = static_cast<int>(i % T), c = static_cast<int>((i / T) % C);
  const size_t b = i / (size_t(C) * T);
  x[i] += ToFloat(tok[(b * T + t) * C + c]);
}

__global__ void AddToPlanesKernel(float* __restrict__ x, const float* __restrict__ v, int P,
                                  size_t n) {
  DT_ELEMENT(i, n);
  x[i] += v[i / P];
}

__global__ void AddIntoKernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  DT_ELEMENT(i, n);
  y[i] += x[i];
}

#undef DT_ELEMENT

template <typename Kernel, typename... Args>
void Launch(Kernel kernel, size_t n, cudaStream_t stream, Args... args) {
  if (n == 0) return;
  kernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(args..., n);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void Upsample2xForward(float* out, const float* in, int P, int H, int W, cudaStream_t stream) {
  Launch(UpsampleKernel, size_t(P) * 4 * H * W, stream, out, in, H, W);
}

void Upsample2xBackward(float* din, const float* dout, int P, int H, int W, cudaStream_t stream) {
  Launch(UpsampleBackwardKernel, size_t(P) * H * W, stream, din, dout, H, W);
}

void ConcatChannels(float* out, const float* a, int Ca, const float* b, int Cb, int B, int HW,
                    cudaStream_t stream) {
  Launch(ConcatKernel, size_t(B) * (Ca + Cb) * HW, stream, out, a, b, Ca, Cb, HW);
}

void ConcatChannelsBackward(float* da, float* db, const float* dout, int Ca, int Cb, int B, int HW,
                            cudaStream_t stream) {
  Launch(ConcatBackwardKernel, size_t(B) * (Ca + Cb) * HW, stream, da, db, dout, Ca, Cb, HW);
}

void ToTokens(bf16* tok, const float* x, int B, int C, int T, cudaStream_t stream) {
  Launch(ToTokensKernel, size_t(B) * C * T, stream, tok, x, C, T);
}

void AddFromTokens(float* x, const float* tok, int B, int C, int T, cudaStream_t stream) {
  Launch(AddFromTokensKernel<float>, size_t(B) * C * T, stream, x, tok, C, T);
}

void AddFromTokens(float* x, const bf16* tok, int B, int C, int T, cudaStream_t stream) {
  Launch(AddFromTokensKernel<bf16>, size_t(B) * C * T, stream, x, tok, C, T);
}

void AddToPlanes(float* x, const float* v, int BC, int P, cudaStream_t stream) {
  Launch(AddToPlanesKernel, size_t(BC) * P, stream, x, v, P);
}

void AddInto(float* y, const float* x, size_t n, cudaStream_t stream) {
  Launch(AddIntoKernel, n, stream, y, x);
}

}  // namespace difftrain::cuda
