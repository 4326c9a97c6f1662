#include "model/unet/layers.h"
#include "model/unet/parts.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/cpu/conv2d.h"
#include "model/cpu/groupnorm.h"
#include "model/cpu/linear.h"
#include "model/cpu/upsample.h"

namespace difftrain {
namespace {

using namespace unet;  // NOLINT: the layers' pieces

// conv_in and the downsamplers (stride 2), and the upsamplers: nearest ×2, then the conv.
class ConvLayer final : public UNetLayer {
 public:
  ConvLayer(const UNetPlan& plan, const UNetNode& n, int B, Space& acts, Space& scratch)
      : node_(n),
        upsample_(n.kind == UNetNodeKind::kUpsampleConv),
        in_(plan.in(n)),
        conv_(plan, n.prefix,
              {B, in_.C, in_.H * (upsample_ ? 2 : 1), in_.W * (upsample_ ? 2 : 1), plan.out(n).C, 3,
               n.stride, 1}) {
    first_param = conv_.w;
    if (upsample_) {
      up_ = acts.Take(size_t(B) * in_.C * 4 * in_.H * in_.W);
      dup_ = scratch.Take(size_t(B) * in_.C * 4 * in_.H * in_.W);
    }
  }
  void Forward(const UNetRun& r) override {
    const float* in = r.value(node_.inputs[0]);
    if (upsample_) {
      cpu::Upsample2xForward(r.A(up_), in, r.B * in_.C, in_.H, in_.W);
      in = r.A(up_);
    }
    if (!r.recomputing) conv_.Forward(r, r.value(node_.output), in);
  }
  void Backward(const UNetRun& r) override {
    const float* dout = r.grad(node_.output);
    float* din = r.grad(node_.inputs[0]);  // null for conv_in: the input x_t is data
    if (!upsample_) {
      conv_.Backward(r, din, dout, r.value(node_.inputs[0]));
      return;
    }
    Zero(r.S(dup_), size_t(r.B) * in_.C * 4 * in_.H * in_.W);
    conv_.Backward(r, r.S(dup_), dout, r.A(up_));
    cpu::Upsample2xBackward(din, r.S(dup_), r.B * in_.C, in_.H, in_.W);
  }

 private:
  const UNetNode& node_;
  bool upsample_;
  UNetValue in_;
  Conv conv_;
  size_t up_ = 0, dup_ = 0;
};

// conv_norm_out → SiLU → conv_out.
class OutputLayer final : public UNetLayer {
 public:
  OutputLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
              Space& scratch)
      : node_(n),
        in_(plan.in(n)),
        norm_(plan, "conv_norm_out.", {B, in_.C, in_.H * in_.W, c.norm_num_groups}, kResnetEps,
              acts),
        conv_(plan, "conv_out.", {B, in_.C, in_.H, in_.W, plan.out(n).C, 3, 1, 1}) {
    first_param = norm_.w;
    silu_ = acts.Take(norm_.size());
    ds_ = scratch.Take(norm_.size());
    dy_ = scratch.Take(norm_.size());
    dxhat_ = scratch.Take(norm_.size());
  }
  void Forward(const UNetRun& r) override {
    norm_.Forward(r, r.value(node_.inputs[0]));
    cpu::SiluForward(r.A(silu_), r.A(norm_.out), norm_.size());
    if (!r.recomputing) conv_.Forward(r, r.value(node_.output), r.A(silu_));
  }
  void Backward(const UNetRun& r) override {
    Zero(r.S(ds_), norm_.size());
    Zero(r.S(dy_), norm_.size());
    conv_.Backward(r, r.S(ds_), r.grad(node_.output), r.A(silu_));
    cpu::SiluBackward(r.S(dy_), r.S(ds_), r.A(norm_.out), norm_.size());
    norm_.Backward(r, r.grad(node_.inputs[0]), r.S(dy_), r.value(node_.inputs[0]), r.S(dxhat_));
  }

 private:
  const UNetNode& node_;
  UNetValue in_;
  Norm norm_;
  Conv conv_;
  size_t silu_ = 0, ds_ = 0, dy_ = 0, dxhat_ = 0;
};

}  // namespace

std::unique_ptr<UNetLayer> MakeUNetLayer(const UNetConfig& c, const UNetPlan& plan,
                                         const UNetNode& node, int B, Space& acts, Space& scratch) {
  switch (node.kind) {
    case UNetNodeKind::kConv:
    case UNetNodeKind::kUpsampleConv:
      return std::make_unique<ConvLayer>(plan, node, B, acts, scratch);
    case UNetNodeKind::kResnet:
      return unet::MakeResnetLayer(c, plan, node, B, acts, scratch);
    case UNetNodeKind::kTransformer:
      return unet::MakeTransformerLayer(c, plan, node, B, acts, scratch);
    case UNetNodeKind::kOutput:
      return std::make_unique<OutputLayer>(c, plan, node, B, acts, scratch);
  }
  DT_CHECK(false, "unknown UNet node kind");
  return nullptr;
}

}  // namespace difftrain
