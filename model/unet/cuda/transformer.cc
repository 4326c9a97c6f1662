// Transformer2DModel with one BasicTransformerBlock on the GPU, the twin of
// model/unet/transformer.cc, over the T = H·W tokens of x [B, C, H, W]:
//   h0 = proj_in(GroupNorm(x))   h1 = h0 + attn1(norm1(h0))   h2 = h1 + attn2(norm2(h1), text)
//   h3 = h2 + ff.net.2(GEGLU(ff.net.0.proj(norm3(h2))))       out = proj_out(h3) + x
// The residual stream h0 … h3 is fp32 [B·T, C]; the norms write bf16 for the GEMMs after them;
// attention reads the packed q, k, v of attn1 and, for attn2, q and the text's fused k, v
// [B·L, 2C] (Tq = T ≠ Tk = L): the mma.sync flash kernels (model/cuda/flash_attention.h, two
// stages; the self-attention's forward with two m-tiles a warp where T fills them) wherever
// they take the head dim (multiples of 8 up to 128: SD2's 64, SD1.5's 40 and 80), else the fused
// kernels (model/cuda/attention.h: SD1.5's 160). The same operands, lse and layout; on an H100
// the two-stage flash kernels ran DiT-XL/2's attention 2.9-3.2x as fast as the fused ones
// (256 tokens) and Latte's 16-frame one 2.3x; at the UNet's shapes (4,096 tokens at 512 px,
// 77 text keys) not yet timed (bench_cuda_unet --attention flash|fused).
#include <algorithm>
#include <memory>

#include "model/cuda/activation.h"
#include "model/cuda/attention.h"
#include "model/cuda/cudnn_attention.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/geglu.h"
#include "model/cuda/spatial.h"
#include "model/unet/cuda/layers.h"
#include "model/unet/parts.h"

namespace difftrain::cuda::unet {
namespace {

using difftrain::unet::kLayerNormEps;
using difftrain::unet::kTransformerEps;
using difftrain::unet::Param;

class TransformerLayer final : public Layer {
 public:
  TransformerLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
                   Space& scratch, Workspaces& ws, const Kernels& kernels)
      : node_(n),
        B_(B),
        C_(plan.out(n).C),
        T_(plan.out(n).H * plan.out(n).W),
        L_(c.text_length),
        H_(n.heads),
        N_(B * T_),
        Dt_(c.cross_attention_dim),
        flash_(kernels.flash_attention && FlashAttentionTakes(C_ / H_)),
        cudnn_(kernels.cudnn != nullptr && CudnnAttentionTakes(C_ / H_)
                   ? kernels.cudnn->Get(B, T_, C_, H_)
                   : nullptr),
        gn_(plan, n.prefix + "norm.", {B, C_, T_, c.norm_num_groups}, kTransformerEps, false, acts,
            ws),
        proj_in_(plan, n.prefix + "proj_in.", C_, C_),
        ln1_(plan, Block("norm1."), {N_, C_, 1, 1}, kLayerNormEps, false, acts, ws),
        qkv_(plan, Block("attn1.to_q."), C_, 3 * C_, false),
        out1_(plan, Block("attn1.to_out.0."), C_, C_),
        ln2_(plan, Block("norm2."), {N_, C_, 1, 1}, kLayerNormEps, false, acts, ws),
        q2_(plan, Block("attn2.to_q."), C_, C_, false),
        kv2_(plan, Block("attn2.to_k."), Dt_, 2 * C_, false),
        out2_(plan, Block("attn2.to_out.0."), C_, C_),
        ln3_(plan, Block("norm3."), {N_, C_, 1, 1}, kLayerNormEps, false, acts, ws),
        ff0_(plan, Block("ff.net.0.proj."), C_, 8 * C_),
        ff2_(plan, Block("ff.net.2."), 4 * C_, C_),
        proj_out_(plan, n.prefix + "proj_out.", C_, C_) {
    // The fused projections read to_q, to_k, to_v (and to_k, to_v) as one matrix.
    DT_CHECK(Param(plan, Block("attn1.to_v.weight")) == qkv_.w + 2 * size_t(C_) * C_ &&
                 Param(plan, Block("attn2.to_v.weight")) == kv2_.w + size_t(C_) * Dt_,
             "{}: q, k and v are not adjacent in the parameter table", n.prefix);
    const size_t NC = size_t(N_) * C_, BL = size_t(B) * L_;
    tok_ = acts.Take<bf16>(NC);
    h0_ = acts.Take<float>(NC);
    ln1_out_ = acts.Take<bf16>(NC);
    qkv_out_ = acts.Take<bf16>(3 * NC);
    a1_ = acts.Take<bf16>(NC);
    lse1_ = acts.Take<float>(size_t(B) * H_ * T_);
    h1_ = acts.Take<float>(NC);
    ln2_out_ = acts.Take<bf16>(NC);
    q2_out_ = acts.Take<bf16>(NC);
    kv2_out_ = acts.Take<bf16>(BL * 2 * C_);
    a2_ = acts.Take<bf16>(NC);
    lse2_ = acts.Take<float>(size_t(B) * H_ * T_);
    h2_ = acts.Take<float>(NC);
    ln3_out_ = acts.Take<bf16>(NC);
    ff_in_ = acts.Take<bf16>(8 * NC);
    ff_mid_ = acts.Take<bf16>(4 * NC);
    h3_ = acts.Take<float>(NC);
    h3_bf16_ = acts.Take<bf16>(NC);
    // Scratch: f32_ is the GroupNorm's output and proj_out's in forward, the residual
    // stream's gradient in backward.
    f32_ = scratch.Take<float>(NC);
    dgn_ = scratch.Take<float>(NC);
    d_tok_ = scratch.Take<bf16>(NC);
    d_hb_ = scratch.Take<bf16>(NC);
    d_ln_ = scratch.Take<bf16>(NC);
    d_a_ = scratch.Take<bf16>(NC);
    d_q_ = scratch.Take<bf16>(3 * NC);
    d_kv_ = scratch.Take<bf16>(BL * 2 * C_);
    d_ff_in_ = scratch.Take<bf16>(8 * NC);
    d_ff_mid_ = scratch.Take<bf16>(4 * NC);
    ws.attention_floats =
        std::max(ws.attention_floats, flash_ ? FlashAttentionBackwardWorkspace(B, T_, H_)
                                             : AttentionBackwardWorkspace(B, T_, C_, H_));
  }

  void Forward(const Run& r) override {
    const float* x = r.value(node_.inputs[0]);
    const size_t NC = size_t(N_) * C_;
    cudaStream_t s = r.stream;
    gn_.Forward(r, r.S<float>(f32_), x);
    ToTokens(r.A<bf16>(tok_), r.S<float>(f32_), B_, C_, T_, s);
    proj_in_.Forward(r, r.A<float>(h0_), r.A<bf16>(tok_), N_);
    // Self-attention.
    ln1_.Forward(r, r.A<bf16>(ln1_out_), r.A<float>(h0_));
    qkv_.Forward(r, r.A<bf16>(qkv_out_), r.A<bf16>(ln1_out_), N_);
    SelfAttentionForward(r.A<bf16>(a1_), r.A<float>(lse1_), r.A<bf16>(qkv_out_), s);
    out1_.Forward(r, r.A<float>(h1_), r.A<bf16>(a1_), N_);
    AddInto(r.A<float>(h1_), r.A<float>(h0_), NC, s);
    // Cross-attention: keys and values from the text.
    ln2_.Forward(r, r.A<bf16>(ln2_out_), r.A<float>(h1_));
    q2_.Forward(r, r.A<bf16>(q2_out_), r.A<bf16>(ln2_out_), N_);
    kv2_.Forward(r, r.A<bf16>(kv2_out_), r.context, B_ * L_);
    const bf16* kv = r.A<bf16>(kv2_out_);
    CrossAttentionForward(r.A<bf16>(a2_), r.A<float>(lse2_), r.A<bf16>(q2_out_), kv, s);
    out2_.Forward(r, r.A<float>(h2_), r.A<bf16>(a2_), N_);
    AddInto(r.A<float>(h2_), r.A<float>(h1_), NC, s);
    // GEGLU feed-forward.
    ln3_.Forward(r, r.A<bf16>(ln3_out_), r.A<float>(h2_));
    ff0_.Forward(r, r.A<bf16>(ff_in_), r.A<bf16>(ln3_out_), N_);
    GegluForward(r.A<bf16>(ff_mid_), r.A<bf16>(ff_in_), N_, 4 * size_t(C_), s);
    ff2_.Forward(r, r.A<float>(h3_), r.A<bf16>(ff_mid_), N_);
    AddInto(r.A<float>(h3_), r.A<float>(h2_), NC, s);
    // Back to [B, C, H, W], plus the input.
    CastToBf16(r.A<bf16>(h3_bf16_), r.A<float>(h3_), NC, s);
    proj_out_.Forward(r, r.S<float>(f32_), r.A<bf16>(h3_bf16_), N_);
    float* out = r.value(node_.output);
    DT_CUDA_CHECK(cudaMemcpyAsync(out, x, NC * sizeof(float), cudaMemcpyDeviceToDevice, s));
    AddFromTokens(out, r.S<float>(f32_), B_, C_, T_, s);
  }

  void Backward(const Run& r) override {
    const float* x = r.value(node_.inputs[0]);
    const float* dout = r.grad(node_.output);
    float* dx = r.grad(node_.inputs[0]);
    const size_t NC = size_t(N_) * C_;
    cudaStream_t s = r.stream;
    float* dh = r.S<float>(f32_);  // the residual stream's gradient, h3 back to h0
    bf16* dhb = r.S<bf16>(d_hb_);
    bf16* dln = r.S<bf16>(d_ln_);
    bf16* da = r.S<bf16>(d_a_);
    AddInto(dx, dout, NC, s);
    ToTokens(r.S<bf16>(d_tok_), dout, B_, C_, T_, s);
    proj_out_.Backward(r, dhb, r.S<bf16>(d_tok_), r.A<bf16>(h3_bf16_), N_);
    CastToFloat(dh, dhb, NC, /*accumulate=*/false, s);
    // GEGLU feed-forward (dhb holds dh in bf16 already).
    ff2_.Backward(r, r.S<bf16>(d_ff_mid_), dhb, r.A<bf16>(ff_mid_), N_, dh);
    GegluBackward(r.S<bf16>(d_ff_in_), r.S<bf16>(d_ff_mid_), r.A<bf16>(ff_in_), N_, 4 * size_t(C_),
                  s);
    ff0_.Backward(r, dln, r.S<bf16>(d_ff_in_), r.A<bf16>(ln3_out_), N_);
    ln3_.Backward(r, dh, dln, r.A<float>(h2_));
    // Cross-attention; the text gets no gradient.
    CastToBf16(dhb, dh, NC, s);
    out2_.Backward(r, da, dhb, r.A<bf16>(a2_), N_, dh);
    const bf16* kv = r.A<bf16>(kv2_out_);
    bf16* dkv = r.S<bf16>(d_kv_);
    CrossAttentionBackward(r.S<bf16>(d_q_), dkv, da, r.A<bf16>(q2_out_), kv, r.A<bf16>(a2_),
                           r.A<float>(lse2_), r.attention_workspace, s);
    kv2_.Backward(r, nullptr, dkv, r.context, B_ * L_);
    q2_.Backward(r, dln, r.S<bf16>(d_q_), r.A<bf16>(ln2_out_), N_);
    ln2_.Backward(r, dh, dln, r.A<float>(h1_));
    // Self-attention.
    CastToBf16(dhb, dh, NC, s);
    out1_.Backward(r, da, dhb, r.A<bf16>(a1_), N_, dh);
    SelfAttentionBackward(r.S<bf16>(d_q_), da, r.A<bf16>(qkv_out_), r.A<bf16>(a1_),
                          r.A<float>(lse1_), r.attention_workspace, s);
    qkv_.Backward(r, dln, r.S<bf16>(d_q_), r.A<bf16>(ln1_out_), N_);
    ln1_.Backward(r, dh, dln, r.A<float>(h0_));
    // proj_in and the GroupNorm.
    CastToBf16(dhb, dh, NC, s);
    proj_in_.Backward(r, r.S<bf16>(d_tok_), dhb, r.A<bf16>(tok_), N_, dh);
    float* dgn = r.S<float>(dgn_);
    DT_CUDA_CHECK(cudaMemsetAsync(dgn, 0, NC * sizeof(float), s));
    AddFromTokens(dgn, r.S<bf16>(d_tok_), B_, C_, T_, s);
    gn_.Backward(r, dx, dgn, x);
  }

 private:
  // attn1 over the packed q, k, v [B·T, 3C], and attn2 from q [B·T, C] to the text's k, v
  // [B·L, 2C]: the flash kernels where they take the head dim, else the fused ones.
  void SelfAttentionForward(bf16* out, float* lse, const bf16* qkv, cudaStream_t s) const {
    if (cudnn_ != nullptr) return cudnn_->Forward(out, lse, qkv, B_, T_, C_, H_, s);
    if (!flash_) return AttentionForward(out, lse, qkv, B_, T_, C_, H_, s);
    if (FlashWideForwardFills(T_)) {
      return FlashAttentionForwardWide(out, lse, qkv, B_, T_, C_, H_, FlashStages::kTwo, s);
    }
    FlashAttentionForwardPipelined(out, lse, qkv, B_, T_, C_, H_, s);
  }
  // dqkv [B·T, 3C] (written).
  void SelfAttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                             const float* lse, float* workspace, cudaStream_t s) const {
    if (cudnn_ != nullptr) return cudnn_->Backward(dqkv, dout, qkv, out, lse, B_, T_, C_, H_, s);
    if (!flash_) return AttentionBackward(dqkv, dout, qkv, out, lse, workspace, B_, T_, C_, H_, s);
    FlashAttentionBackwardPipelined(dqkv, dout, qkv, out, lse, workspace, B_, T_, C_, H_, s);
  }
  using CrossForward = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, size_t,
                                size_t, int, int, int, int, int, cudaStream_t);
  using CrossBackward = void (*)(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*,
                                 const bf16*, size_t, size_t, const bf16*, const float*, float*,
                                 int, int, int, int, int, cudaStream_t);
  void CrossAttentionForward(bf16* out, float* lse, const bf16* q, const bf16* kv,
                             cudaStream_t s) const {
    const CrossForward forward =
        flash_ ? CrossForward{FlashAttentionForwardPipelined} : CrossForward{AttentionForward};
    forward(out, lse, q, kv, kv + C_, C_, 2 * C_, B_, T_, L_, C_, H_, s);
  }
  // dq [B·T, C] and the text's dk, dv [B·L, 2C] (written).
  void CrossAttentionBackward(bf16* dq, bf16* dkv, const bf16* dout, const bf16* q, const bf16* kv,
                              const bf16* out, const float* lse, float* workspace,
                              cudaStream_t s) const {
    const CrossBackward backward =
        flash_ ? CrossBackward{FlashAttentionBackwardPipelined} : CrossBackward{AttentionBackward};
    backward(dq, dkv, dkv + C_, dout, q, kv, kv + C_, C_, 2 * C_, out, lse, workspace, B_, T_, L_,
             C_, H_, s);
  }
  std::string Block(const std::string& name) const {
    return node_.prefix + "transformer_blocks.0." + name;
  }

  const UNetNode& node_;
  int B_, C_, T_, L_, H_, N_, Dt_;
  bool flash_;  // else the fused kernels (head dim 160, or UNet::Options::flash_attention off)
  CudnnAttention* cudnn_;  // the self-attention's, prepared by UNet::Reserve; else null
  Norm gn_;
  Linear proj_in_;
  Norm ln1_;
  Linear qkv_, out1_;
  Norm ln2_;
  Linear q2_, kv2_, out2_;
  Norm ln3_;
  Linear ff0_, ff2_, proj_out_;
  size_t tok_, h0_, ln1_out_, qkv_out_, a1_, lse1_, h1_, ln2_out_, q2_out_, kv2_out_, a2_, lse2_,
      h2_, ln3_out_, ff_in_, ff_mid_, h3_, h3_bf16_;
  size_t f32_, dgn_, d_tok_, d_hb_, d_ln_, d_a_, d_q_, d_kv_, d_ff_in_, d_ff_mid_;
};

}  // namespace

std::unique_ptr<Layer> MakeTransformerLayer(const UNetConfig& c, const UNetPlan& plan,
                                            const UNetNode& node, int B, Space& acts,
                                            Space& scratch, Workspaces& ws,
                                            const Kernels& kernels) {
  return std::make_unique<TransformerLayer>(c, plan, node, B, acts, scratch, ws, kernels);
}

}  // namespace difftrain::cuda::unet
