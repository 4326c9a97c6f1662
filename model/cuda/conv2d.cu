#include "model/cuda/conv2d.h"

#include <algorithm>
#include <type_traits>

namespace difftrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kAlign = 256;  // bytes; every workspace piece starts on this boundary

int RoundUp8(int n) {
  return (n + 7) / 8 * 8;
}

size_t AlignUp(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// The geometry every kernel reads.
struct Geometry {
  int B, C, H, W, Co, K, S, P, Ho, Wo, patch, Kp, Cop;
};

Geometry GeometryOf(const cpu::Conv2dShape& s, int patch, int Kp, int Cop) {
  return {s.B, s.C, s.H, s.W, s.Co, s.K, s.S, s.P, s.Ho(), s.Wo(), patch, Kp, Cop};
}

// col[n, k] for output pixel n = (b, oy, ox) and patch element k = (c, ky, kx); zero outside
// the input and in the padding columns k ≥ C·K·K.
__global__ void Im2colKernel(bf16* __restrict__ col, const float* __restrict__ in, Geometry g,
                             size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int k = static_cast<int>(i % g.Kp);
  const size_t n = i / g.Kp;
  float v = 0.0f;
  if (k < g.patch) {
    const int c = k / (g.K * g.K), r = k % (g.K * g.K), ky = r / g.K, kx = r % g.K;
    const int pixels = g.Ho * g.Wo;
    const size_t b = n / pixels;
    const int p = static_cast<int>(n % pixels), oy = p / g.Wo, ox = p % g.Wo;
    const int iy = oy * g.S + ky - g.P, ix = ox * g.S + kx - g.P;
    if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W) v = in[((b * g.C + c) * g.H + iy) * g.W + ix];
  }
  col[i] = __float2bfloat16(v);
}

// din[b, c, iy, ix] += Σ over the taps (ky, kx) whose output pixel (oy, ox) reads it of
// dcol[(b, oy, ox), (c, ky, kx)].
__global__ void Col2imKernel(float* __restrict__ din, const bf16* __restrict__ dcol, Geometry g,
                             size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int ix = static_cast<int>(i % g.W), iy = static_cast<int>((i / g.W) % g.H);
  const int c = static_cast<int>((i / (size_t(g.W) * g.H)) % g.C);
  const size_t b = i / (size_t(g.W) * g.H * g.C);
  float sum = 0.0f;
  for (int ky = 0; ky < g.K; ++ky) {
    const int ty = iy + g.P - ky;  // oy · S
    if (ty < 0 || ty % g.S != 0 || ty / g.S >= g.Ho) continue;
    for (int kx = 0; kx < g.K; ++kx) {
      const int tx = ix + g.P - kx;
      if (tx < 0 || tx % g.S != 0 || tx / g.S >= g.Wo) continue;
      const size_t n = (b * g.Ho + ty / g.S) * g.Wo + tx / g.S;
      sum += __bfloat162float(dcol[n * g.Kp + (c * g.K + ky) * g.K + kx]);
    }
  }
  din[i] += sum;
}

// out[b, o, p] (+)= tok[(b, p), o] + bias[o].
__global__ void TokensToPlanesKernel(float* __restrict__ out, const float* __restrict__ tok,
                                     const float* __restrict__ bias, Geometry g, bool accumulate,
                                     size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int pixels = g.Ho * g.Wo;
  const int p = static_cast<int>(i % pixels), o = static_cast<int>((i / pixels) % g.Co);
  const size_t b = i / (size_t(pixels) * g.Co);
  const float v = tok[(b * pixels + p) * g.Cop + o] + bias[o];
  out[i] = accumulate ? out[i] + v : v;
}

// dtok[(b, p), o] = dout[b, o, p] as bf16, zero in the padding columns o ≥ Co.
__global__ void PlanesToTokensKernel(bf16* __restrict__ dtok, const float* __restrict__ dout,
                                     Geometry g, size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int o = static_cast<int>(i % g.Cop);
  const size_t n = i / g.Cop;
  const int pixels = g.Ho * g.Wo;
  const size_t b = n / pixels;
  const int p = static_cast<int>(n % pixels);
  dtok[i] = __float2bfloat16(o < g.Co ? dout[(b * g.Co + o) * pixels + p] : 0.0f);
}

// wpad [Cop, Kp] = w [Co, patch], zero-padded.
__global__ void PadWeightKernel(bf16* __restrict__ wpad, const bf16* __restrict__ w, Geometry g,
                                size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int k = static_cast<int>(i % g.Kp), o = static_cast<int>(i / g.Kp);
  wpad[i] = o < g.Co && k < g.patch ? w[size_t(o) * g.patch + k] : __float2bfloat16(0.0f);
}

// dw [Co, patch] += dwpad [Cop, Kp] without its padding.
__global__ void AddUnpaddedKernel(float* __restrict__ dw, const float* __restrict__ dwpad,
                                  Geometry g, size_t total) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int k = static_cast<int>(i % g.patch), o = static_cast<int>(i / g.patch);
  dw[i] += dwpad[size_t(o) * g.Kp + k];
}

// One block per output: the sum of plane (b, c) (or of channel c over every b), tree-reduced
// in shared memory.
__global__ void SumPlanesKernel(float* __restrict__ out, const float* __restrict__ x, int B, int C,
                                int P, bool over_batch, bool accumulate) {
  __shared__ float partial[kThreads];
  const int j = blockIdx.x;  // b·C + c, or c
  float sum = 0.0f;
  if (over_batch) {
    for (int b = 0; b < B; ++b) {
      const float* plane = x + (size_t(b) * C + j) * P;
      for (int p = threadIdx.x; p < P; p += kThreads)
        sum += plane[p];
    }
  } else {
    const float* plane = x + size_t(j) * P;
    for (int p = threadIdx.x; p < P; p += kThreads)
      sum += plane[p];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[j] = accumulate ? out[j] + partial[0] : partial[0];
}

}  // namespace

// The workspace's pieces: the columns; the forward's fp32 tokens, which the backward's bf16
// token gradient and column gradient reuse; the padded weight and its gradient (padded only).
struct Conv2d::Workspace {
  bf16* col = nullptr;
  float* tok = nullptr;
  bf16* dtok = nullptr;
  bf16* dcol = nullptr;
  bf16* wpad = nullptr;
  float* dwpad = nullptr;
  size_t bytes = 0;
};

Conv2d::Conv2d(const cpu::Conv2dShape& shape) : s_(shape) {
  DT_CHECK(s_.B > 0 && s_.C > 0 && s_.H > 0 && s_.W > 0 && s_.Co > 0 && s_.K > 0 && s_.S > 0 &&
               s_.P >= 0 && s_.Ho() > 0 && s_.Wo() > 0,
           "convolution shape B={} C={} H={} W={} Co={} K={} S={} P={}", s_.B, s_.C, s_.H, s_.W,
           s_.Co, s_.K, s_.S, s_.P);
  patch_ = s_.C * s_.K * s_.K;
  Kp_ = RoundUp8(patch_);
  Cop_ = RoundUp8(s_.Co);
  N_ = s_.B * s_.Ho() * s_.Wo();
}

Conv2d::Workspace Conv2d::Bind(void* base) const {
  unsigned char* p = static_cast<unsigned char*>(base);
  Workspace w;
  size_t at = 0;
  auto take = [&](auto*& member, size_t n) {
    using T = std::remove_reference_t<decltype(*member)>;
    member = p != nullptr ? reinterpret_cast<T*>(p + at) : nullptr;
    at += AlignUp(n * sizeof(T));
  };
  take(w.col, size_t(N_) * Kp_);
  // The forward's tokens and the backward's two gradients share one region.
  const size_t shared_start = at;
  take(w.tok, size_t(N_) * Cop_);
  const size_t forward_end = at;
  at = shared_start;
  take(w.dtok, size_t(N_) * Cop_);
  take(w.dcol, size_t(N_) * Kp_);
  at = std::max(at, forward_end);
  if (padded()) {
    take(w.wpad, size_t(Cop_) * Kp_);
    take(w.dwpad, size_t(Cop_) * Kp_);
  }
  w.bytes = at;
  return w;
}

size_t Conv2d::WorkspaceBytes() const {
  return Bind(nullptr).bytes;
}

const bf16* Conv2d::Weight(const bf16* w, const Workspace& ws, cudaStream_t stream) const {
  if (!padded()) return w;
  const Geometry g = GeometryOf(s_, patch_, Kp_, Cop_);
  const size_t n = size_t(Cop_) * Kp_;
  PadWeightKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(ws.wpad, w, g, n);
  DT_CUDA_CHECK_LAUNCH();
  return ws.wpad;
}

void Conv2d::Forward(Gemm& gemm, float* out, const float* in, const bf16* w, const float* bias,
                     bool accumulate, void* workspace, cudaStream_t stream) const {
  const Workspace ws = Bind(workspace);
  const Geometry g = GeometryOf(s_, patch_, Kp_, Cop_);
  const size_t n_col = size_t(N_) * Kp_;
  Im2colKernel<<<BlocksFor(n_col, kThreads), kThreads, 0, stream>>>(ws.col, in, g, n_col);
  DT_CUDA_CHECK_LAUNCH();
  gemm.Forward(ws.tok, ws.col, Weight(w, ws, stream), nullptr, N_, Kp_, Cop_, Epilogue::kNone);
  const size_t n_out = out_size();
  TokensToPlanesKernel<<<BlocksFor(n_out, kThreads), kThreads, 0, stream>>>(out, ws.tok, bias, g,
                                                                            accumulate, n_out);
  DT_CUDA_CHECK_LAUNCH();
}

void Conv2d::Backward(Gemm& gemm, float* din, float* dw, float* dbias, const float* dout,
                      const float* in, const bf16* w, void* workspace, cudaStream_t stream) const {
  const Workspace ws = Bind(workspace);
  const Geometry g = GeometryOf(s_, patch_, Kp_, Cop_);
  SumPlanes(dbias, dout, s_.B, s_.Co, s_.Ho() * s_.Wo(), /*over_batch=*/true,
            /*accumulate=*/true, stream);
  const size_t n_tok = size_t(N_) * Cop_;
  PlanesToTokensKernel<<<BlocksFor(n_tok, kThreads), kThreads, 0, stream>>>(ws.dtok, dout, g,
                                                                            n_tok);
  DT_CUDA_CHECK_LAUNCH();
  // The columns again (the forward's were overwritten by later layers: recomputing them costs
  // one gather and saves keeping K·K copies of every input).
  const size_t n_col = size_t(N_) * Kp_;
  Im2colKernel<<<BlocksFor(n_col, kThreads), kThreads, 0, stream>>>(ws.col, in, g, n_col);
  DT_CUDA_CHECK_LAUNCH();
  if (padded()) {
    DT_CUDA_CHECK(cudaMemsetAsync(ws.dwpad, 0, size_t(Cop_) * Kp_ * sizeof(float), stream));
    gemm.BackwardWeight(ws.dwpad, ws.dtok, ws.col, N_, Kp_, Cop_);
    const size_t n_w = size_t(s_.Co) * patch_;
    AddUnpaddedKernel<<<BlocksFor(n_w, kThreads), kThreads, 0, stream>>>(dw, ws.dwpad, g, n_w);
    DT_CUDA_CHECK_LAUNCH();
  } else {
    gemm.BackwardWeight(dw, ws.dtok, ws.col, N_, Kp_, Cop_);
  }
  if (din == nullptr) return;
  gemm.BackwardInput(ws.dcol, ws.dtok, Weight(w, ws, stream), N_, Kp_, Cop_);
  const size_t n_in = in_size();
  Col2imKernel<<<BlocksFor(n_in, kThreads), kThreads, 0, stream>>>(din, ws.dcol, g, n_in);
  DT_CUDA_CHECK_LAUNCH();
}

void SumPlanes(float* out, const float* x, int B, int C, int P, bool over_batch, bool accumulate,
               cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && P > 0, "SumPlanes shape B={} C={} P={}", B, C, P);
  const unsigned blocks = over_batch ? C : B * C;
  SumPlanesKernel<<<blocks, kThreads, 0, stream>>>(out, x, B, C, P, over_batch, accumulate);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
