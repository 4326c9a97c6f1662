// The UNet's convolution, output and resnet layers on the GPU, and the pieces every layer is
// made of (model/unet/cuda/layers.h); the transformer is in transformer.cc.
#include "model/unet/cuda/layers.h"

#include <algorithm>

#include "model/cuda/activation.h"
#include "model/cuda/groupnorm.h"
#include "model/cuda/spatial.h"
#include "model/unet/parts.h"

namespace difftrain::cuda::unet {

using difftrain::unet::kResnetEps;
using difftrain::unet::Param;

Norm::Norm(const UNetPlan& plan, const std::string& prefix, cpu::GroupNormShape shape, float e,
           bool with_silu, Space& acts, Workspaces& ws)
    : w(Param(plan, prefix + "weight")),
      b(Param(plan, prefix + "bias")),
      s(shape),
      eps(e),
      silu(with_silu) {
  mean = acts.Take<float>(size_t(s.B) * s.G);
  rstd = acts.Take<float>(size_t(s.B) * s.G);
  ws.norm_floats = std::max(ws.norm_floats, GroupNormBackwardWorkspace(s));
}

template <typename Out>
void Norm::Forward(const Run& r, Out* out, const float* x) const {
  GroupNormForward(out, r.A<float>(mean), r.A<float>(rstd), x, r.P + w, r.P + b, s, eps, silu,
                   r.stream);
}

template <typename Dout>
void Norm::Backward(const Run& r, float* dx, const Dout* dout, const float* x) const {
  GroupNormBackward(dx, r.G + w, r.G + b, dout, x, r.A<float>(mean), r.A<float>(rstd), r.P + w,
                    r.P + b, s, silu, r.norm_workspace, r.stream);
}

template void Norm::Forward<float>(const Run&, float*, const float*) const;
template void Norm::Forward<bf16>(const Run&, bf16*, const float*) const;
template void Norm::Backward<float>(const Run&, float*, const float*, const float*) const;
template void Norm::Backward<bf16>(const Run&, float*, const bf16*, const float*) const;

Conv::Conv(const UNetPlan& plan, const std::string& prefix, const cpu::Conv2dShape& shape,
           Workspaces& ws)
    : w(Param(plan, prefix + "weight")), b(Param(plan, prefix + "bias")), conv(shape) {
  ws.conv_bytes = std::max(ws.conv_bytes, conv.WorkspaceBytes());
}

void Conv::Forward(const Run& r, float* out, const float* in, bool accumulate) const {
  conv.Forward(*r.gemm, out, in, r.W + w, r.P + b, accumulate, r.conv_workspace, r.stream);
}

void Conv::Backward(const Run& r, float* din, const float* dout, const float* in) const {
  conv.Backward(*r.gemm, din, r.G + w, r.G + b, dout, in, r.W + w, r.conv_workspace, r.stream);
}

Linear::Linear(const UNetPlan& plan, const std::string& prefix, int in, int out, bool bias)
    : w(Param(plan, prefix + "weight")),
      b(bias ? Param(plan, prefix + "bias") : 0),
      has_bias(bias),
      I(in),
      O(out) {}

template <typename Out>
void Linear::Forward(const Run& r, Out* out, const bf16* in, int N) const {
  r.gemm->Forward(out, in, r.W + w, has_bias ? r.W + b : nullptr, N, I, O,
                  has_bias ? Epilogue::kBias : Epilogue::kNone);
}

template void Linear::Forward<float>(const Run&, float*, const bf16*, int) const;
template void Linear::Forward<bf16>(const Run&, bf16*, const bf16*, int) const;

void Linear::Backward(const Run& r, bf16* din, const bf16* dout, const bf16* in, int N,
                      const float* dout_f32) const {
  r.gemm->BackwardWeight(r.G + w, dout, in, N, I, O);
  if (has_bias) {
    if (dout_f32 != nullptr) {
      BiasGradient(r.G + b, dout_f32, N, O, r.stream);
    } else {
      BiasGradient(r.G + b, dout, N, O, r.stream);
    }
  }
  if (din != nullptr) r.gemm->BackwardInput(din, dout, r.W + w, N, I, O);
}

namespace {

void Zero(void* p, size_t bytes, cudaStream_t stream) {
  DT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

// conv_in and the downsamplers (stride 2), and the upsamplers: nearest ×2, then the conv.
class ConvLayer final : public Layer {
 public:
  ConvLayer(const UNetPlan& plan, const UNetNode& n, int B, Space& acts, Space& scratch,
            Workspaces& ws)
      : node_(n),
        upsample_(n.kind == UNetNodeKind::kUpsampleConv),
        in_(plan.in(n)),
        B_(B),
        conv_(plan, n.prefix,
              {B, in_.C, in_.H * (upsample_ ? 2 : 1), in_.W * (upsample_ ? 2 : 1), plan.out(n).C, 3,
               n.stride, 1},
              ws) {
    if (upsample_) {
      up_ = acts.Take<float>(conv_.conv.in_size());
      dup_ = scratch.Take<float>(conv_.conv.in_size());
    }
  }
  void Forward(const Run& r) override {
    const float* in = r.value(node_.inputs[0]);
    if (upsample_) {
      Upsample2xForward(r.A<float>(up_), in, B_ * in_.C, in_.H, in_.W, r.stream);
      in = r.A<float>(up_);
    }
    conv_.Forward(r, r.value(node_.output), in);
  }
  void Backward(const Run& r) override {
    const float* dout = r.grad(node_.output);
    float* din = r.grad(node_.inputs[0]);  // null for conv_in: the input x_t is data
    if (!upsample_) {
      conv_.Backward(r, din, dout, r.value(node_.inputs[0]));
      return;
    }
    Zero(r.S<float>(dup_), conv_.conv.in_size() * sizeof(float), r.stream);
    conv_.Backward(r, r.S<float>(dup_), dout, r.A<float>(up_));
    Upsample2xBackward(din, r.S<float>(dup_), B_ * in_.C, in_.H, in_.W, r.stream);
  }

 private:
  const UNetNode& node_;
  bool upsample_;
  UNetValue in_;
  int B_;
  Conv conv_;
  size_t up_ = 0, dup_ = 0;
};

// conv_norm_out → SiLU (fused) → conv_out.
class OutputLayer final : public Layer {
 public:
  OutputLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
              Space& scratch, Workspaces& ws)
      : node_(n),
        in_(plan.in(n)),
        norm_(plan, "conv_norm_out.", {B, in_.C, in_.H * in_.W, c.norm_num_groups}, kResnetEps,
              /*with_silu=*/true, acts, ws),
        conv_(plan, "conv_out.", {B, in_.C, in_.H, in_.W, plan.out(n).C, 3, 1, 1}, ws) {
    act_ = acts.Take<float>(norm_.size());
    dact_ = scratch.Take<float>(norm_.size());
  }
  void Forward(const Run& r) override {
    norm_.Forward(r, r.A<float>(act_), r.value(node_.inputs[0]));
    conv_.Forward(r, r.value(node_.output), r.A<float>(act_));
  }
  void Backward(const Run& r) override {
    Zero(r.S<float>(dact_), norm_.size() * sizeof(float), r.stream);
    conv_.Backward(r, r.S<float>(dact_), r.grad(node_.output), r.A<float>(act_));
    norm_.Backward(r, r.grad(node_.inputs[0]), r.S<float>(dact_), r.value(node_.inputs[0]));
  }

 private:
  const UNetNode& node_;
  UNetValue in_;
  Norm norm_;
  Conv conv_;
  size_t act_ = 0, dact_ = 0;
};

// ResnetBlock2D: out = conv2(SiLU(norm2(conv1(SiLU(norm1(x))) + time_emb_proj(SiLU(temb)))))
// + shortcut(x); an up block's resnet first concatenates [h, skip] on channels.
class ResnetLayer final : public Layer {
 public:
  ResnetLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
              Space& scratch, Workspaces& ws)
      : node_(n),
        B_(B),
        HW_(plan.out(n).H * plan.out(n).W),
        Cin_(plan.in_channels(n)),
        C0_(plan.in(n).C),
        C_(plan.out(n).C),
        E_(c.time_embed_dim()),
        norm1_(plan, n.prefix + "norm1.", {B, Cin_, HW_, c.norm_num_groups}, kResnetEps, true, acts,
               ws),
        conv1_(plan, n.prefix + "conv1.", {B, Cin_, plan.out(n).H, plan.out(n).W, C_, 3, 1, 1}, ws),
        temb_(plan, n.prefix + "time_emb_proj.", E_, C_),
        norm2_(plan, n.prefix + "norm2.", {B, C_, HW_, c.norm_num_groups}, kResnetEps, true, acts,
               ws),
        conv2_(plan, n.prefix + "conv2.", {B, C_, plan.out(n).H, plan.out(n).W, C_, 3, 1, 1}, ws) {
    if (Cin_ != C_) {
      shortcut_ = std::make_unique<Conv>(
          plan, n.prefix + "conv_shortcut.",
          cpu::Conv2dShape{B, Cin_, plan.out(n).H, plan.out(n).W, C_, 1, 1, 0}, ws);
    }
    if (n.inputs.size() == 2) {
      cat_ = acts.Take<float>(in_size());
      dcat_ = scratch.Take<float>(in_size());
    }
    act1_ = acts.Take<float>(in_size());
    h_ = acts.Take<float>(out_size());
    act2_ = acts.Take<float>(out_size());
    dact1_ = scratch.Take<float>(in_size());
    dact2_ = scratch.Take<float>(out_size());
    dh_ = scratch.Take<float>(out_size());
    tproj_ = scratch.Take<float>(size_t(B) * C_);
    tproj_bf16_ = scratch.Take<bf16>(size_t(B) * C_);
  }

  void Forward(const Run& r) override {
    if (node_.inputs.size() == 2) {
      ConcatChannels(r.A<float>(cat_), r.value(node_.inputs[0]), C0_, r.value(node_.inputs[1]),
                     Cin_ - C0_, B_, HW_, r.stream);
    }
    const float* x = Input(r);
    norm1_.Forward(r, r.A<float>(act1_), x);
    conv1_.Forward(r, r.A<float>(h_), r.A<float>(act1_));
    // The time embedding, one value per sample and channel, added over the whole plane.
    temb_.Forward(r, r.S<float>(tproj_), r.temb_silu, B_);
    AddToPlanes(r.A<float>(h_), r.S<float>(tproj_), B_ * C_, HW_, r.stream);
    norm2_.Forward(r, r.A<float>(act2_), r.A<float>(h_));
    float* out = r.value(node_.output);
    conv2_.Forward(r, out, r.A<float>(act2_));
    if (shortcut_) {
      shortcut_->Forward(r, out, x, /*accumulate=*/true);
    } else {
      AddInto(out, x, out_size(), r.stream);
    }
  }

  void Backward(const Run& r) override {
    const float* x = Input(r);
    const float* dout = r.grad(node_.output);
    const bool concat = node_.inputs.size() == 2;
    float* dx = concat ? r.S<float>(dcat_) : r.grad(node_.inputs[0]);
    if (concat) Zero(dx, in_size() * sizeof(float), r.stream);
    if (shortcut_) {
      shortcut_->Backward(r, dx, dout, x);
    } else {
      AddInto(dx, dout, out_size(), r.stream);
    }
    Zero(r.S<float>(dact2_), out_size() * sizeof(float), r.stream);
    conv2_.Backward(r, r.S<float>(dact2_), dout, r.A<float>(act2_));
    Zero(r.S<float>(dh_), out_size() * sizeof(float), r.stream);
    norm2_.Backward(r, r.S<float>(dh_), r.S<float>(dact2_), r.A<float>(h_));
    // The time embedding's gradient: each plane's sum, through time_emb_proj into SiLU(temb).
    float* dtp = r.S<float>(tproj_);
    bf16* dtp_bf16 = r.S<bf16>(tproj_bf16_);
    SumPlanes(dtp, r.S<float>(dh_), B_, C_, HW_, /*over_batch=*/false, /*accumulate=*/false,
              r.stream);
    CastToBf16(dtp_bf16, dtp, size_t(B_) * C_, r.stream);
    temb_.Backward(r, r.temb_scratch, dtp_bf16, r.temb_silu, B_, dtp);
    CastToFloat(r.dtemb_silu, r.temb_scratch, size_t(B_) * E_, /*accumulate=*/true, r.stream);
    Zero(r.S<float>(dact1_), in_size() * sizeof(float), r.stream);
    conv1_.Backward(r, r.S<float>(dact1_), r.S<float>(dh_), r.A<float>(act1_));
    norm1_.Backward(r, dx, r.S<float>(dact1_), x);
    if (concat) {
      ConcatChannelsBackward(r.grad(node_.inputs[0]), r.grad(node_.inputs[1]), dx, C0_, Cin_ - C0_,
                             B_, HW_, r.stream);
    }
  }

 private:
  size_t in_size() const { return size_t(B_) * Cin_ * HW_; }
  size_t out_size() const { return size_t(B_) * C_ * HW_; }
  // The input: the value itself, or [input, skip] concatenated on channels.
  const float* Input(const Run& r) const {
    return node_.inputs.size() == 1 ? r.value(node_.inputs[0]) : r.A<float>(cat_);
  }

  const UNetNode& node_;
  int B_, HW_, Cin_, C0_, C_, E_;  // C0_: the channels of the first input
  Norm norm1_;
  Conv conv1_;
  Linear temb_;
  Norm norm2_;
  Conv conv2_;
  std::unique_ptr<Conv> shortcut_;
  size_t cat_ = 0, dcat_ = 0, act1_ = 0, h_ = 0, act2_ = 0, dact1_ = 0, dact2_ = 0, dh_ = 0,
         tproj_ = 0, tproj_bf16_ = 0;
};

}  // namespace

std::unique_ptr<Layer> MakeLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& node,
                                 int B, Space& acts, Space& scratch, Workspaces& ws,
                                 const Kernels& kernels) {
  switch (node.kind) {
    case UNetNodeKind::kConv:
    case UNetNodeKind::kUpsampleConv:
      return std::make_unique<ConvLayer>(plan, node, B, acts, scratch, ws);
    case UNetNodeKind::kResnet:
      return std::make_unique<ResnetLayer>(c, plan, node, B, acts, scratch, ws);
    case UNetNodeKind::kTransformer:
      return MakeTransformerLayer(c, plan, node, B, acts, scratch, ws, kernels);
    case UNetNodeKind::kOutput:
      return std::make_unique<OutputLayer>(c, plan, node, B, acts, scratch, ws);
  }
  DT_CHECK(false, "unknown UNet node kind");
  return nullptr;
}

}  // namespace difftrain::cuda::unet
