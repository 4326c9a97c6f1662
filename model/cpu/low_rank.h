// A weight with a low-rank update (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
// Language Models"): W = W0 + s·B·A for a frozen W0 [out, in], A [rank, in], B [out, rank] and
// a scale s (peft's lora_alpha / r). A convolution's weight is [out, in·kh·kw] here, its A the
// kernel-sized down projection and B the 1×1 up projection, as kohya's LoCon and peft's Conv2d
// LoRA flatten them.
//
// Backward from the model's gradient of W: ∂L/∂A += s·Bᵀ·∂L/∂W and ∂L/∂B += s·∂L/∂W·Aᵀ (W0
// gets none). Forward is the product diffusers' fuse_lora adds (model/io/lora.h: the same GEMM
// on the same operands), so a trained LoRA fused into W0 elsewhere gives W bit for bit.
//
// DoRA (Liu et al. 2024, "DoRA: Weight-Decomposed Low-Rank Adaptation") splits W into a
// magnitude m [out] and a direction: W = (m / n) ⊙ V with V = W0 + s·B·A and n the L2 norm of
// each of V's rows (a Linear's output feature; a convolution's output channel over in·kh·kw,
// as peft's norms are taken). The paper's §4.3, and peft, treat n as a constant in the
// backward pass: ∂L/∂m = Σ_row ∂L/∂W ⊙ V / n and ∂L/∂V = (m / n) ⊙ ∂L/∂W, from which ∂A and ∂B
// follow as for LoRA. A row whose n is 0 (V's row zero) is zero, and gets no gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "model/cpu/gemm.h"

namespace difftrain::cpu {

// w = w0 + scale · b·a (w and w0 may be the same arena).
template <typename Real>
void LowRankForward(Real* w, const Real* w0, const Real* a, const Real* b, int out, int rank,
                    int in, Real scale) {
  if (w != w0) std::copy(w0, w0 + static_cast<size_t>(out) * in, w);
  Gemm(false, false, out, in, rank, scale, b, rank, a, in, Real(1), w, in);
}

// da += scale · bᵀ·dw, db += scale · dw·aᵀ.
template <typename Real>
void LowRankBackward(Real* da, Real* db, const Real* dw, const Real* a, const Real* b, int out,
                     int rank, int in, Real scale) {
  Gemm(true, false, rank, in, out, scale, b, rank, dw, in, Real(1), da, in);
  Gemm(false, true, out, rank, in, scale, dw, in, a, in, Real(1), db, rank);
}

// m / n, 0 where n is 0.
template <typename Real>
Real DoraFactor(Real magnitude, Real norm) {
  return norm > 0 ? magnitude / norm : Real(0);
}

// DoRA's ops take V a row at a time, made where it is used (rank multiply-adds an element,
// from A in cache), so that V is never held whole: a step reads W0 and writes W once
// (DoraForward, which FuseLora's DoRA merge uses too), and reads W0 once and ∂W three times
// (DoraBackward: two GEMMs and one pass).

// Row o of V = w0 + scale · b·a into v [in].
template <typename Real>
void LowRankRow(Real* v, const Real* w0, const Real* a, const Real* b, int o, int rank, int in,
                Real scale) {
  const Real* w0_row = w0 + static_cast<size_t>(o) * in;
  const Real* b_row = b + static_cast<size_t>(o) * rank;
  std::fill(v, v + in, Real(0));
  for (int r = 0; r < rank; ++r) {
    const Real br = b_row[r];
    const Real* a_row = a + static_cast<size_t>(r) * in;
    for (int i = 0; i < in; ++i)
      v[i] += br * a_row[i];
  }
  for (int i = 0; i < in; ++i)
    v[i] = w0_row[i] + scale * v[i];
}

// ‖v‖ over `in` elements, accumulated in double.
template <typename Real>
Real RowNorm(const Real* v, int in) {
  double sum = 0;
  for (int i = 0; i < in; ++i)
    sum += static_cast<double>(v[i]) * v[i];
  return static_cast<Real>(std::sqrt(sum));
}

// The norms of the rows of V = w0 + scale · b·a.
template <typename Real>
void DoraNorms(Real* norms, const Real* w0, const Real* a, const Real* b, int out, int rank, int in,
               Real scale) {
#pragma omp parallel
  {
    std::vector<Real> v(in);
#pragma omp for schedule(static)
    for (int o = 0; o < out; ++o) {
      LowRankRow(v.data(), w0, a, b, o, rank, in, scale);
      norms[o] = RowNorm(v.data(), in);
    }
  }
}

// w = (magnitude / n) ⊙ (w0 + scale · b·a), n the given `norms` (the constant the backward
// treats them as), or with norms null each row's own norm (DoraNorms'). w may be w0.
template <typename Real>
void DoraForward(Real* w, const Real* w0, const Real* a, const Real* b, const Real* magnitude,
                 int out, int rank, int in, Real scale, const Real* norms = nullptr) {
#pragma omp parallel
  {
    std::vector<Real> v(in);
#pragma omp for schedule(static)
    for (int o = 0; o < out; ++o) {
      LowRankRow(v.data(), w0, a, b, o, rank, in, scale);
      const Real factor =
          DoraFactor(magnitude[o], norms != nullptr ? norms[o] : RowNorm(v.data(), in));
      Real* row = w + static_cast<size_t>(o) * in;
      for (int i = 0; i < in; ++i)
        row[i] = factor * v[i];
    }
  }
}

// With ∂V = (m / n) ⊙ dw (the norms n of V's rows constant), f = m / n:
//   da += scale · bᵀ·∂V = scale · (f ⊙ b)ᵀ·dw,   db += scale · ∂V·aᵀ = scale · f ⊙ (dw·aᵀ),
//   dmagnitude += Σ_row dw ⊙ V / n.
template <typename Real>
void DoraBackward(Real* da, Real* db, Real* dmagnitude, const Real* dw, const Real* w0,
                  const Real* a, const Real* b, const Real* magnitude, int out, int rank, int in,
                  Real scale) {
  std::vector<Real> dw_at(static_cast<size_t>(out) * rank), scaled_b(dw_at.size());
  Gemm(false, true, out, rank, in, Real(1), dw, in, a, in, Real(0), dw_at.data(), rank);
#pragma omp parallel
  {
    std::vector<Real> v(in);
#pragma omp for schedule(static)
    for (int o = 0; o < out; ++o) {
      LowRankRow(v.data(), w0, a, b, o, rank, in, scale);
      const Real* g = dw + static_cast<size_t>(o) * in;
      double norm = 0, dot = 0;
      for (int i = 0; i < in; ++i) {
        norm += static_cast<double>(v[i]) * v[i];
        dot += static_cast<double>(g[i]) * v[i];
      }
      const Real n = static_cast<Real>(std::sqrt(norm));
      if (n > 0) dmagnitude[o] += static_cast<Real>(dot / n);
      const Real factor = DoraFactor(magnitude[o], n);
      for (int r = 0; r < rank; ++r) {
        const size_t k = static_cast<size_t>(o) * rank + r;
        db[k] += scale * factor * dw_at[k];
        scaled_b[k] = factor * b[k];
      }
    }
  }
  Gemm(true, false, rank, in, out, scale, scaled_b.data(), rank, dw, in, Real(1), da, in);
}

}  // namespace difftrain::cpu
