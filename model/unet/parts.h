// Pieces the UNet's layers are made of (model/unet/layers.h): GroupNorm/LayerNorm, Conv2d and
// Linear with their parameters' offsets, and the token transposes. Internal to model/unet.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "common/check.h"
#include "model/cpu/conv2d.h"
#include "model/cpu/groupnorm.h"
#include "model/cpu/linear.h"
#include "model/unet/layers.h"

namespace difftrain::unet {

inline constexpr float kResnetEps = 1e-5f;       // resnets' GroupNorms and conv_norm_out
inline constexpr float kTransformerEps = 1e-6f;  // the transformer's GroupNorm
inline constexpr float kLayerNormEps = 1e-5f;    // the transformer block's LayerNorms

inline void Zero(float* p, size_t n) {
  std::memset(p, 0, n * sizeof(float));
}

inline size_t Param(const UNetPlan& plan, const std::string& name) {
  const TensorSpec* t = plan.table.Find(name);
  DT_CHECK(t != nullptr, "{} is not a UNet parameter", name);
  return t->offset;
}

// [B, C, T] ↔ [B, T, C]; FromTokens adds into x.
inline void ToTokens(float* tok, const float* x, int B, int C, int T) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        tok[(size_t(b) * T + t) * C + c] = x[(size_t(b) * C + c) * T + t];
}
inline void AddFromTokens(float* x, const float* tok, int B, int C, int T) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int t = 0; t < T; ++t)
        x[(size_t(b) * C + c) * T + t] += tok[(size_t(b) * T + t) * C + c];
}

inline void Add(float* y, const float* x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i)
    y[i] += x[i];
}

// A GroupNorm (or, with one group over rows of HW = 1, a LayerNorm) with affine weights: what
// its forward keeps and its backward needs.
struct Norm {
  size_t w = 0, b = 0;
  cpu::GroupNormShape s{};
  float eps = 0;
  size_t xhat = 0, mean = 0, rstd = 0, out = 0;  // activations

  Norm(const UNetPlan& plan, const std::string& prefix, cpu::GroupNormShape shape, float e,
       Space& acts)
      : w(Param(plan, prefix + "weight")), b(Param(plan, prefix + "bias")), s(shape), eps(e) {
    const size_t n = size_t(s.B) * s.C * s.HW;
    xhat = acts.Take(n);
    mean = acts.Take(size_t(s.B) * s.G);
    rstd = acts.Take(size_t(s.B) * s.G);
    out = acts.Take(n);
  }
  size_t size() const { return size_t(s.B) * s.C * s.HW; }
  void Forward(const UNetRun& r, const float* in) const {
    cpu::GroupNormForward(r.A(out), r.A(xhat), r.A(mean), r.A(rstd), in, r.P + w, r.P + b, s, eps);
  }
  // dxhat: scratch of size() floats.
  void Backward(const UNetRun& r, float* din, const float* dout, const float* in,
                float* dxhat) const {
    cpu::GroupNormBackward(din, r.G + w, r.G + b, dxhat, dout, in, r.A(xhat), r.A(mean), r.A(rstd),
                           r.P + w, s);
  }
};

struct Conv {
  size_t w = 0, b = 0;
  cpu::Conv2dShape s{};
  Conv(const UNetPlan& plan, const std::string& prefix, cpu::Conv2dShape shape)
      : w(Param(plan, prefix + "weight")), b(Param(plan, prefix + "bias")), s(shape) {}
  size_t out_size() const { return size_t(s.B) * s.Co * s.Ho() * s.Wo(); }
  void Forward(const UNetRun& r, float* out, const float* in) const {
    cpu::Conv2dForward(out, in, r.P + w, r.P + b, s);
  }
  void Backward(const UNetRun& r, float* din, const float* dout, const float* in) const {
    cpu::Conv2dBackward(din, r.Grad(w, size_t(s.Co) * s.C * s.K * s.K), r.Grad(b, s.Co), dout, in,
                        r.P + w, s);
  }
};

// dbias[o] += Σ_n dout[n, o], summed in double as the norms' and convolutions' bias gradients
// are (model/cpu/affine.cc): LinearBackward's float sums, which DiT's pinned results keep, lose
// more than 1e-5 of the UNet's small bias gradients over B·H·W rows.
// Each thread sums a block of columns row after row (each column's terms in row order), so
// the reads are contiguous and the adds vectorise across columns.
inline void AddColumnSums(float* dbias, const float* dout, int N, int O) {
  constexpr int kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int o0 = 0; o0 < O; o0 += kBlock) {
    const int width = std::min(kBlock, O - o0);
    double sums[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* row = dout + size_t(n) * O + o0;
#pragma omp simd
      for (int o = 0; o < width; ++o)
        sums[o] += row[o];
    }
    for (int o = 0; o < width; ++o)
      dbias[o0 + o] += static_cast<float>(sums[o]);
  }
}

// nn.Linear over N rows; `bias` false for the attention's q, k and v.
struct Linear {
  size_t w = 0, b = 0;
  bool has_bias = true;
  int I = 0, O = 0;
  Linear(const UNetPlan& plan, const std::string& prefix, int in, int out, bool bias = true)
      : w(Param(plan, prefix + "weight")),
        b(bias ? Param(plan, prefix + "bias") : 0),
        has_bias(bias),
        I(in),
        O(out) {}
  void Forward(const UNetRun& r, float* out, const float* in, int N) const {
    cpu::LinearForward(out, in, r.P + w, has_bias ? r.P + b : nullptr, N, I, O);
  }
  void Backward(const UNetRun& r, float* din, const float* dout, const float* in, int N) const {
    cpu::LinearBackward<float>(din, r.Grad(w, size_t(I) * O), nullptr, dout, in, r.P + w, N, I, O);
    if (has_bias && r.Grad(b, O) != nullptr) AddColumnSums(r.G + b, dout, N, O);
  }
};

// The layers of their own files (model/unet/resnet.cc, model/unet/transformer.cc).
std::unique_ptr<UNetLayer> MakeResnetLayer(const UNetConfig& c, const UNetPlan& plan,
                                           const UNetNode& node, int B, Space& acts,
                                           Space& scratch);
std::unique_ptr<UNetLayer> MakeTransformerLayer(const UNetConfig& c, const UNetPlan& plan,
                                                const UNetNode& node, int B, Space& acts,
                                                Space& scratch);

}  // namespace difftrain::unet
