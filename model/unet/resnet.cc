// ResnetBlock2D (diffusers' resnet.py, time_embedding_norm "default"):
//   h = conv1(SiLU(norm1(x))) + time_emb_proj(SiLU(temb))[:, :, None, None]
//   out = conv2(SiLU(norm2(h))) + shortcut(x),  shortcut a 1×1 conv when channels change.
// An up block's resnet first concatenates [h, skip] on channels.
#include <algorithm>
#include <cstring>
#include <memory>

#include "model/cpu/activation.h"
#include "model/unet/parts.h"

namespace difftrain::unet {
namespace {

class ResnetLayer final : public UNetLayer {
 public:
  ResnetLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
              Space& scratch)
      : node_(n),
        B_(B),
        HW_(plan.out(n).H * plan.out(n).W),
        Cin_(plan.in_channels(n)),
        C0_(plan.in(n).C),
        C_(plan.out(n).C),
        norm1_(plan, n.prefix + "norm1.", {B, Cin_, HW_, c.norm_num_groups}, kResnetEps, acts),
        conv1_(plan, n.prefix + "conv1.", {B, Cin_, plan.out(n).H, plan.out(n).W, C_, 3, 1, 1}),
        temb_(plan, n.prefix + "time_emb_proj.", c.time_embed_dim(), C_),
        norm2_(plan, n.prefix + "norm2.", {B, C_, HW_, c.norm_num_groups}, kResnetEps, acts),
        conv2_(plan, n.prefix + "conv2.", {B, C_, plan.out(n).H, plan.out(n).W, C_, 3, 1, 1}) {
    first_param = norm1_.w;
    if (Cin_ != C_) {
      shortcut_ = std::make_unique<Conv>(
          plan, n.prefix + "conv_shortcut.",
          cpu::Conv2dShape{B, Cin_, plan.out(n).H, plan.out(n).W, C_, 1, 1, 0});
    }
    const size_t in_size = size_t(B) * Cin_ * HW_, out_size = size_t(B) * C_ * HW_;
    const size_t wide = std::max(in_size, out_size);
    if (n.inputs.size() == 2) {
      cat_ = acts.Take(in_size);
      dcat_ = scratch.Take(in_size);
    }
    silu1_ = acts.Take(in_size);
    h1_ = acts.Take(out_size);
    silu2_ = acts.Take(out_size);
    ds_ = scratch.Take(wide);
    dy_ = scratch.Take(wide);
    dh_ = scratch.Take(out_size);
    dxhat_ = scratch.Take(wide);
    tproj_ = scratch.Take(size_t(B) * C_);
  }

  void Forward(const UNetRun& r) override {
    if (node_.inputs.size() == 2) Concat</*kBackward=*/false>(r);
    const float* x = Input(r);
    const size_t out_size = size_t(B_) * C_ * HW_;
    norm1_.Forward(r, x);
    cpu::SiluForward(r.A(silu1_), r.A(norm1_.out), norm1_.size());
    conv1_.Forward(r, r.A(h1_), r.A(silu1_));
    // The time embedding, one value per sample and channel, added over the whole plane.
    temb_.Forward(r, r.S(tproj_), r.temb_silu, B_);
    float* h = r.A(h1_);
    const float* tp = r.S(tproj_);
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B_ * C_; ++bc)
      for (int i = 0; i < HW_; ++i)
        h[size_t(bc) * HW_ + i] += tp[bc];
    norm2_.Forward(r, h);
    cpu::SiluForward(r.A(silu2_), r.A(norm2_.out), out_size);
    if (r.recomputing) return;
    float* out = r.value(node_.output);
    conv2_.Forward(r, out, r.A(silu2_));
    if (shortcut_) {
      shortcut_->Forward(r, r.S(dh_), x);  // dh_ is free until backward
      Add(out, r.S(dh_), out_size);
    } else {
      Add(out, x, out_size);
    }
  }

  void Backward(const UNetRun& r) override {
    const float* x = Input(r);
    const float* dout = r.grad(node_.output);
    const size_t in_size = size_t(B_) * Cin_ * HW_, out_size = size_t(B_) * C_ * HW_;
    float* dx = node_.inputs.size() == 2 ? r.S(dcat_) : r.grad(node_.inputs[0]);
    if (node_.inputs.size() == 2) Zero(dx, in_size);
    if (shortcut_) {
      shortcut_->Backward(r, dx, dout, x);
    } else {
      Add(dx, dout, out_size);
    }
    Zero(r.S(ds_), out_size);
    conv2_.Backward(r, r.S(ds_), dout, r.A(silu2_));
    Zero(r.S(dy_), out_size);
    cpu::SiluBackward(r.S(dy_), r.S(ds_), r.A(norm2_.out), out_size);
    Zero(r.S(dh_), out_size);
    norm2_.Backward(r, r.S(dh_), r.S(dy_), r.A(h1_), r.S(dxhat_));
    // The time embedding's gradient: each plane's sum.
    const float* dh = r.S(dh_);
    float* dtp = r.S(tproj_);
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B_ * C_; ++bc) {
      float sum = 0;
      for (int i = 0; i < HW_; ++i)
        sum += dh[size_t(bc) * HW_ + i];
      dtp[bc] = sum;
    }
    temb_.Backward(r, r.dtemb_silu, dtp, r.temb_silu, B_);
    Zero(r.S(ds_), in_size);
    conv1_.Backward(r, r.S(ds_), dh, r.A(silu1_));
    Zero(r.S(dy_), in_size);
    cpu::SiluBackward(r.S(dy_), r.S(ds_), r.A(norm1_.out), in_size);
    norm1_.Backward(r, dx, r.S(dy_), x, r.S(dxhat_));
    if (node_.inputs.size() == 2) Concat</*kBackward=*/true>(r);
  }

 private:
  // The input: the value itself, or [input, skip] concatenated on channels.
  const float* Input(const UNetRun& r) const {
    if (node_.inputs.size() == 1) return r.value(node_.inputs[0]);
    return r.A(cat_);
  }

  // Copies input and skip into the concatenation (forward), or adds its gradient's two parts
  // into theirs (backward).
  template <bool kBackward>
  void Concat(const UNetRun& r) const {
    size_t at = 0;
    for (int b = 0; b < B_; ++b) {
      for (int id : node_.inputs) {
        const size_t n = size_t(id == node_.inputs[0] ? C0_ : Cin_ - C0_) * HW_;
        if (kBackward) {
          Add(r.grad(id) + b * n, r.S(dcat_) + at, n);
        } else {
          std::memcpy(r.A(cat_) + at, r.value(id) + b * n, n * sizeof(float));
        }
        at += n;
      }
    }
  }
  const UNetNode& node_;
  int B_, HW_, Cin_, C0_, C_;  // C0_: the channels of the first input
  Norm norm1_;
  Conv conv1_;
  Linear temb_;
  Norm norm2_;
  Conv conv2_;
  std::unique_ptr<Conv> shortcut_;
  size_t cat_ = 0, dcat_ = 0, silu1_ = 0, h1_ = 0, silu2_ = 0, ds_ = 0, dy_ = 0, dh_ = 0,
         dxhat_ = 0, tproj_ = 0;
};

}  // namespace

std::unique_ptr<UNetLayer> MakeResnetLayer(const UNetConfig& c, const UNetPlan& plan,
                                           const UNetNode& node, int B, Space& acts,
                                           Space& scratch) {
  return std::make_unique<ResnetLayer>(c, plan, node, B, acts, scratch);
}

}  // namespace difftrain::unet
