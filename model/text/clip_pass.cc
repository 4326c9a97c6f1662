#include "model/text/clip_pass.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/layernorm.h"
#include "model/cpu/linear.h"
#include "model/text/activation.h"
#include "model/text/encoder.h"
#include "model/text/encoder_names.h"

namespace difftrain {
namespace {

// d *= act'(pre), element-wise.
template <typename T>
void ActivationBackward(TextActivation act, T* d, const T* pre, size_t n) {
  switch (act) {
    case TextActivation::kGelu:
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) {
        const T x = pre[i];
        const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752)));
        const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143268);  // 1/√(2π)
        d[i] *= cdf + x * pdf;
      }
      break;
    case TextActivation::kGeluTanh: {
      std::vector<T> g(d, d + n);
      std::fill(d, d + n, T(0));
      cpu::GeluBackward(d, g.data(), pre, n);
      break;
    }
    case TextActivation::kQuickGelu:
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) {
        const T s = T(1) / (T(1) + std::exp(T(-1.702) * pre[i]));
        d[i] *= s + T(1.702) * pre[i] * s * (T(1) - s);
      }
      break;
  }
}

// Causal multi-head attention of N texts of L tokens, q, k, v, out [N·L, D], as
// TextEncoder::Encode computes it; probs [N, H, L, L] the softmax's weights (zero above the
// diagonal).
template <typename T>
void CausalAttention(T* out, T* probs, const T* q, const T* k, const T* v, int N, int L, int D,
                     int H) {
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < L; ++i) {
        T* p = probs + ((size_t(n) * H + h) * L + i) * L;
        const T* qi = q + (size_t(n) * L + i) * D + h * hd;
        T top = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const T* kj = k + (size_t(n) * L + j) * D + h * hd;
          T s = 0;
          for (int d = 0; d < hd; ++d)
            s += qi[d] * kj[d];
          p[j] = s * scale;
          top = std::max(top, p[j]);
        }
        T sum = 0;
        for (int j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - top);
          sum += p[j];
        }
        std::fill(p + i + 1, p + L, T(0));
        T* oi = out + (size_t(n) * L + i) * D + h * hd;
        std::fill(oi, oi + hd, T(0));
        for (int j = 0; j <= i; ++j) {
          if (p[j] == 0) continue;
          p[j] = p[j] / sum;
          const T* vj = v + (size_t(n) * L + j) * D + h * hd;
          for (int d = 0; d < hd; ++d)
            oi[d] += p[j] * vj[d];
        }
      }
    }
  }
}

// The attention's backward: dq, dk, dv [N·L, D] written from dout.
template <typename T>
void CausalAttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                             const T* probs, int N, int L, int D, int H) {
  const int hd = D / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const size_t rows = size_t(N) * L;
  std::fill(dq, dq + rows * D, T(0));
  std::fill(dk, dk + rows * D, T(0));
  std::fill(dv, dv + rows * D, T(0));
  // Each (text, head) writes its own columns of its own rows.
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      std::vector<T> ds(L);
      for (int i = 0; i < L; ++i) {
        const T* p = probs + ((size_t(n) * H + h) * L + i) * L;
        const T* doi = dout + (size_t(n) * L + i) * D + h * hd;
        // dP = dO·Vᵀ, then the softmax's: dS = P ⊙ (dP − Σ P ⊙ dP).
        T dot = 0;
        for (int j = 0; j <= i; ++j) {
          const T* vj = v + (size_t(n) * L + j) * D + h * hd;
          T s = 0;
          for (int d = 0; d < hd; ++d)
            s += doi[d] * vj[d];
          ds[j] = s;
          dot += p[j] * s;
        }
        const T* qi = q + (size_t(n) * L + i) * D + h * hd;
        T* dqi = dq + (size_t(n) * L + i) * D + h * hd;
        for (int j = 0; j <= i; ++j) {
          const T g = p[j] * (ds[j] - dot) * scale;
          const T* kj = k + (size_t(n) * L + j) * D + h * hd;
          T* dkj = dk + (size_t(n) * L + j) * D + h * hd;
          T* dvj = dv + (size_t(n) * L + j) * D + h * hd;
          for (int d = 0; d < hd; ++d) {
            dqi[d] += g * kj[d];
            dkj[d] += g * qi[d];
            dvj[d] += p[j] * doi[d];
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
ClipPass<T>::ClipPass(const TextEncoderConfig& config, const T* weights)
    : config_(config), table_(TextEncoder::Tensors(config)), weights_(weights) {
  DT_CHECK(config.kind == TextEncoderKind::kClip, "ClipPass: {} is not a CLIP text model",
           config.Describe());
}

template <typename T>
const T* ClipPass<T>::W(const std::string& name) const {
  const TensorSpec* t = table_.Find(name);
  DT_CHECK(t != nullptr, "ClipPass: no tensor '{}'", name);
  return weights_ + t->offset;
}

template <typename T>
T* ClipPass<T>::WeightGrad(const std::string& name) const {
  if (grads_ == nullptr) return nullptr;
  const std::string weight = name + ".weight";
  if (std::find(trained_.begin(), trained_.end(), weight) == trained_.end()) return nullptr;
  return grads_ + table_.Find(weight)->offset;
}

template <typename T>
void ClipPass<T>::SetWeightGradients(T* grads, std::vector<std::string> weights) {
  for (const std::string& w : weights) {
    const TensorSpec* t = table_.Find(w);
    DT_CHECK(t != nullptr && t->shape.size() == 2, "ClipPass: '{}' is no Linear weight", w);
  }
  grads_ = weights.empty() ? nullptr : grads;
  trained_ = std::move(weights);
}

template <typename T>
void ClipPass<T>::Norm(const std::string& name, const T* in, T* out, T* mean, T* rstd) const {
  const int rows = N_ * L_, D = config_.hidden_size;
  cpu::LayerNormForward(out, mean, rstd, in, rows, D, static_cast<T>(config_.layer_norm_eps));
  const T* gamma = W(name + ".weight");
  const T* beta = W(name + ".bias");
  for (int n = 0; n < rows; ++n) {
    T* row = out + size_t(n) * D;
    for (int c = 0; c < D; ++c)
      row[c] = row[c] * gamma[c] + beta[c];
  }
}

template <typename T>
void ClipPass<T>::NormBackward(const std::string& name, const T* dout, const T* in, const T* mean,
                               const T* rstd, T* din) {
  const int rows = N_ * L_, D = config_.hidden_size;
  const T* gamma = W(name + ".weight");
  scratch_.resize(size_t(rows) * D);
  for (int n = 0; n < rows; ++n) {
    for (int c = 0; c < D; ++c)
      scratch_[size_t(n) * D + c] = dout[size_t(n) * D + c] * gamma[c];
  }
  cpu::LayerNormBackward(din, scratch_.data(), in, mean, rstd, rows, D);
}

template <typename T>
size_t ClipPass<T>::HeldBytes() const {
  size_t n = last_.capacity() + mean_.capacity() + rstd_.capacity() + scratch_.capacity();
  for (const Layer& k : layers_) {
    for (const std::vector<T>* v :
         {&k.x, &k.mid, &k.mean1, &k.rstd1, &k.mean2, &k.rstd2, &k.q, &k.k, &k.v, &k.probs, &k.pre,
          &k.normed1, &k.attention, &k.normed2})
      n += v->capacity();
  }
  return n * sizeof(T);
}

template <typename T>
void ClipPass<T>::Forward(const T* x, int N, int L, int skip_layers, bool final_norm, T* out) {
  const TextEncoderConfig& c = config_;
  DT_CHECK(skip_layers >= 0 && skip_layers < c.num_layers && L >= 1 && L <= c.max_positions,
           "ClipPass: {} texts of {} tokens skipping {} of {} layers", N, L, skip_layers,
           c.num_layers);
  N_ = N;
  L_ = L;
  taken_ = c.num_layers - skip_layers;
  final_norm_ = final_norm;
  const int D = c.hidden_size, F = c.intermediate_size, H = c.num_heads, rows = N * L;
  const size_t RD = size_t(rows) * D;
  layers_.resize(taken_);
  std::vector<T> stream(x, x + RD), h(RD), a(RD), mlp(size_t(rows) * F);
  const auto linear = [&](T* y, const T* in, const std::string& name, int I, int O) {
    cpu::LinearForward(y, in, W(name + ".weight"), W(name + ".bias"), rows, I, O);
  };
  for (int i = 0; i < taken_; ++i) {
    const text::LayerNames names = text::EncoderLayer(c, i);
    Layer& k = layers_[i];
    k.x = stream;
    k.mean1.resize(rows), k.rstd1.resize(rows), k.mean2.resize(rows), k.rstd2.resize(rows);
    k.q.resize(RD), k.k.resize(RD), k.v.resize(RD);
    k.probs.resize(size_t(N) * H * L * L);
    k.pre.resize(size_t(rows) * F);
    Norm(names.norm1, stream.data(), h.data(), k.mean1.data(), k.rstd1.data());
    if (grads_ != nullptr) k.normed1.assign(h.begin(), h.end());
    linear(k.q.data(), h.data(), names.q, D, D);
    linear(k.k.data(), h.data(), names.k, D, D);
    linear(k.v.data(), h.data(), names.v, D, D);
    CausalAttention(a.data(), k.probs.data(), k.q.data(), k.k.data(), k.v.data(), N, L, D, H);
    if (grads_ != nullptr) k.attention.assign(a.begin(), a.end());
    linear(h.data(), a.data(), names.out, D, D);
    for (size_t j = 0; j < RD; ++j)
      stream[j] += h[j];
    k.mid = stream;
    Norm(names.norm2, stream.data(), h.data(), k.mean2.data(), k.rstd2.data());
    if (grads_ != nullptr) k.normed2.assign(h.begin(), h.end());
    linear(k.pre.data(), h.data(), names.fc1, D, F);
    std::copy(k.pre.begin(), k.pre.end(), mlp.begin());
    text::Activate(c.activation, mlp.data(), mlp.size());
    linear(h.data(), mlp.data(), names.fc2, F, D);
    for (size_t j = 0; j < RD; ++j)
      stream[j] += h[j];
  }
  last_ = std::move(stream);
  if (final_norm) {
    mean_.resize(rows);
    rstd_.resize(rows);
    Norm(text::kClipFinalNorm, last_.data(), out, mean_.data(), rstd_.data());
  } else {
    std::copy(last_.begin(), last_.end(), out);
  }
}

template <typename T>
void ClipPass<T>::Backward(const T* dout, T* dx) {
  const TextEncoderConfig& c = config_;
  const int D = c.hidden_size, F = c.intermediate_size, H = c.num_heads, rows = N_ * L_;
  const size_t RD = size_t(rows) * D;
  // dx carries the stream's gradient, from the output back to the input.
  if (final_norm_) {
    std::fill(dx, dx + RD, T(0));
    NormBackward(text::kClipFinalNorm, dout, last_.data(), mean_.data(), rstd_.data(), dx);
  } else {
    std::copy(dout, dout + RD, dx);
  }
  std::vector<T> dmlp(size_t(rows) * F), dh(RD), dq(RD), dk(RD), dv(RD), act;
  // din = dout · W (written), and where asked the weight's gradient dout^T · in (added).
  const auto linear_back = [&](T* din, const T* d, const std::string& name, const T* in, int I,
                               int O) {
    std::fill(din, din + size_t(rows) * I, T(0));
    cpu::LinearBackward<T>(din, WeightGrad(name), nullptr, d, in, W(name + ".weight"), rows, I, O);
  };
  for (int i = taken_; i-- > 0;) {
    const text::LayerNames names = text::EncoderLayer(c, i);
    const Layer& k = layers_[i];
    // The MLP: stream += fc2(act(fc1(norm2(mid)))).
    if (WeightGrad(names.fc2) != nullptr) {
      act = k.pre;
      text::Activate(c.activation, act.data(), act.size());
    }
    linear_back(dmlp.data(), dx, names.fc2, act.data(), F, D);
    ActivationBackward(c.activation, dmlp.data(), k.pre.data(), dmlp.size());
    linear_back(dh.data(), dmlp.data(), names.fc1, k.normed2.data(), D, F);
    NormBackward(names.norm2, dh.data(), k.mid.data(), k.mean2.data(), k.rstd2.data(), dx);
    // The attention: mid = x + out(attention(norm1(x))).
    linear_back(dh.data(), dx, names.out, k.attention.data(), D, D);
    CausalAttentionBackward(dq.data(), dk.data(), dv.data(), dh.data(), k.q.data(), k.k.data(),
                            k.v.data(), k.probs.data(), N_, L_, D, H);
    linear_back(dh.data(), dq.data(), names.q, k.normed1.data(), D, D);
    for (const auto& [d, name] : {std::pair{dk.data(), names.k}, std::pair{dv.data(), names.v}}) {
      cpu::LinearBackward<T>(dh.data(), WeightGrad(name), nullptr, d, k.normed1.data(),
                             W(name + ".weight"), rows, D, D);
    }
    NormBackward(names.norm1, dh.data(), k.x.data(), k.mean1.data(), k.rstd1.data(), dx);
  }
}

template class ClipPass<float>;
template class ClipPass<double>;

}  // namespace difftrain
