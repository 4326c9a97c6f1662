// A weight with a low-rank update (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
// Language Models"): W = W0 + s·B·A for a frozen W0 [out, in], A [rank, in], B [out, rank] and
// a scale s (peft's lora_alpha / r). A convolution's weight is [out, in·kh·kw] here, its A the
// kernel-sized down projection and B the 1×1 up projection, as kohya's LoCon and peft's Conv2d
// LoRA flatten them.
//
// Backward from the model's gradient of W: ∂L/∂A += s·Bᵀ·∂L/∂W and ∂L/∂B += s·∂L/∂W·Aᵀ (W0
// gets none). Forward is the product diffusers' fuse_lora adds (model/io/lora.h: the same GEMM
// on the same operands), so a trained LoRA fused into W0 elsewhere gives W bit for bit.
#pragma once

#include <algorithm>
#include <cstddef>

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

}  // namespace difftrain::cpu
