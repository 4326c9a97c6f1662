// Transformer2DModel with one BasicTransformerBlock (diffusers' transformer_2d.py and
// attention.py), over the T = H·W tokens of a [B, C, H, W] input x:
//   h0 = proj_in(GroupNorm(x, eps 1e-6))            (a 1×1 conv or a Linear: the same map)
//   h1 = h0 + attn1(norm1(h0))                       self-attention
//   h2 = h1 + attn2(norm2(h1), text)                 cross-attention to the text embedding
//   h3 = h2 + ff.net.2(GEGLU(ff.net.0.proj(norm3(h2))))
//   out = proj_out(h3) + x
// The LayerNorms (eps 1e-5) have affine weights; attention projections q, k, v have no bias,
// to_out.0 has one; the scale is head_dim^-0.5.
#include <algorithm>
#include <cstring>
#include <memory>

#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/unet/parts.h"

namespace difftrain::unet {
namespace {

class TransformerLayer final : public UNetLayer {
 public:
  TransformerLayer(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n, int B, Space& acts,
                   Space& scratch)
      : node_(n),
        B_(B),
        C_(plan.out(n).C),
        T_(plan.out(n).H * plan.out(n).W),
        L_(c.text_length),
        H_(n.heads),
        N_(B * T_),
        gn_(plan, n.prefix + "norm.", {B, C_, T_, c.norm_num_groups}, kTransformerEps, acts),
        proj_in_(plan, n.prefix + "proj_in.", C_, C_),
        ln1_(plan, Block("norm1."), {N_, C_, 1, 1}, kLayerNormEps, acts),
        qkv_(plan, Block("attn1.to_q."), C_, 3 * C_, false),
        out1_(plan, Block("attn1.to_out.0."), C_, C_),
        ln2_(plan, Block("norm2."), {N_, C_, 1, 1}, kLayerNormEps, acts),
        q2_(plan, Block("attn2.to_q."), C_, C_, false),
        kv2_(plan, Block("attn2.to_k."), c.cross_attention_dim, 2 * C_, false),
        out2_(plan, Block("attn2.to_out.0."), C_, C_),
        ln3_(plan, Block("norm3."), {N_, C_, 1, 1}, kLayerNormEps, acts),
        ff0_(plan, Block("ff.net.0.proj."), C_, 8 * C_),
        ff2_(plan, Block("ff.net.2."), 4 * C_, C_),
        proj_out_(plan, n.prefix + "proj_out.", C_, C_) {
    first_param = gn_.w;
    // The fused projections read to_q, to_k, to_v (and to_k, to_v) as one matrix.
    DT_CHECK(
        Param(plan, Block("attn1.to_v.weight")) == qkv_.w + 2 * size_t(C_) * C_ &&
            Param(plan, Block("attn2.to_v.weight")) == kv2_.w + size_t(C_) * c.cross_attention_dim,
        "{}: q, k and v are not adjacent in the parameter table", n.prefix);
    const size_t NC = size_t(N_) * C_, BL = size_t(B) * L_;
    tok_ = acts.Take(NC);
    h0_ = acts.Take(NC);
    qkv_out_ = acts.Take(3 * NC);
    probs1_ = acts.Take(size_t(B) * H_ * T_ * T_);
    a1_ = acts.Take(NC);
    h1_ = acts.Take(NC);
    q2_out_ = acts.Take(NC);
    kv2_out_ = acts.Take(BL * 2 * C_);
    probs2_ = acts.Take(size_t(B) * H_ * T_ * L_);
    a2_ = acts.Take(NC);
    h2_ = acts.Take(NC);
    ff_in_ = acts.Take(8 * NC);
    ff_mid_ = acts.Take(4 * NC);
    h3_ = acts.Take(NC);
    d_tok_ = scratch.Take(NC);
    d_h_ = scratch.Take(NC);
    d_ln_ = scratch.Take(NC);
    d_a_ = scratch.Take(NC);
    d_q_ = scratch.Take(3 * NC);
    d_kv_ = scratch.Take(BL * 2 * C_);
    d_ff_in_ = scratch.Take(8 * NC);
    d_ff_mid_ = scratch.Take(4 * NC);
    d_xhat_ = scratch.Take(NC);
  }

  void Forward(const UNetRun& r) override {
    const float* x = r.value(node_.inputs[0]);
    const size_t NC = size_t(N_) * C_;
    gn_.Forward(r, x);
    ToTokens(r.A(tok_), r.A(gn_.out), B_, C_, T_);
    proj_in_.Forward(r, r.A(h0_), r.A(tok_), N_);
    // Self-attention.
    ln1_.Forward(r, r.A(h0_));
    qkv_.Forward(r, r.A(qkv_out_), r.A(ln1_.out), N_);
    const float* qkv = r.A(qkv_out_);
    cpu::AttentionForward(r.A(a1_), r.A(probs1_), qkv, 3 * C_, qkv + C_, qkv + 2 * C_, 3 * C_, B_,
                          T_, T_, C_, H_);
    out1_.Forward(r, r.A(h1_), r.A(a1_), N_);
    Add(r.A(h1_), r.A(h0_), NC);
    // Cross-attention: keys and values from the text.
    ln2_.Forward(r, r.A(h1_));
    q2_.Forward(r, r.A(q2_out_), r.A(ln2_.out), N_);
    kv2_.Forward(r, r.A(kv2_out_), r.context, B_ * L_);
    const float* kv = r.A(kv2_out_);
    cpu::AttentionForward(r.A(a2_), r.A(probs2_), r.A(q2_out_), C_, kv, kv + C_, 2 * C_, B_, T_, L_,
                          C_, H_);
    out2_.Forward(r, r.A(h2_), r.A(a2_), N_);
    Add(r.A(h2_), r.A(h1_), NC);
    // GEGLU feed-forward.
    ln3_.Forward(r, r.A(h2_));
    ff0_.Forward(r, r.A(ff_in_), r.A(ln3_.out), N_);
    cpu::GegluForward(r.A(ff_mid_), r.A(ff_in_), size_t(N_), size_t(4 * C_));
    ff2_.Forward(r, r.A(h3_), r.A(ff_mid_), N_);
    Add(r.A(h3_), r.A(h2_), NC);
    if (r.recomputing) return;
    // Back to [B, C, H, W], plus the input.
    float* out = r.value(node_.output);
    proj_out_.Forward(r, r.S(d_tok_), r.A(h3_), N_);  // d_tok_ is free until backward
    std::memcpy(out, x, NC * sizeof(float));
    AddFromTokens(out, r.S(d_tok_), B_, C_, T_);
  }

  void Backward(const UNetRun& r) override {
    const float* x = r.value(node_.inputs[0]);
    const float* dout = r.grad(node_.output);
    float* dx = r.grad(node_.inputs[0]);
    const size_t NC = size_t(N_) * C_;
    Add(dx, dout, NC);
    ToTokens(r.S(d_tok_), dout, B_, C_, T_);
    float* dh = r.S(d_h_);  // the residual stream's gradient, h3 back to h0
    Zero(dh, NC);
    proj_out_.Backward(r, dh, r.S(d_tok_), r.A(h3_), N_);
    // GEGLU feed-forward.
    Zero(r.S(d_ff_mid_), 4 * NC);
    ff2_.Backward(r, r.S(d_ff_mid_), dh, r.A(ff_mid_), N_);
    Zero(r.S(d_ff_in_), 8 * NC);
    cpu::GegluBackward(r.S(d_ff_in_), r.S(d_ff_mid_), r.A(ff_in_), size_t(N_), size_t(4 * C_));
    Zero(r.S(d_ln_), NC);
    ff0_.Backward(r, r.S(d_ln_), r.S(d_ff_in_), r.A(ln3_.out), N_);
    ln3_.Backward(r, dh, r.S(d_ln_), r.A(h2_), r.S(d_xhat_));
    // Cross-attention; the text gets no gradient.
    Zero(r.S(d_a_), NC);
    out2_.Backward(r, r.S(d_a_), dh, r.A(a2_), N_);
    Zero(r.S(d_q_), NC);
    Zero(r.S(d_kv_), size_t(B_) * L_ * 2 * C_);
    const float* kv = r.A(kv2_out_);
    float* dkv = r.S(d_kv_);
    cpu::AttentionBackward(r.S(d_q_), dkv, dkv + C_, r.S(d_a_), r.A(q2_out_), C_, kv, kv + C_,
                           2 * C_, r.A(probs2_), B_, T_, L_, C_, H_);
    kv2_.Backward(r, nullptr, dkv, r.context, B_ * L_);
    Zero(r.S(d_ln_), NC);
    q2_.Backward(r, r.S(d_ln_), r.S(d_q_), r.A(ln2_.out), N_);
    ln2_.Backward(r, dh, r.S(d_ln_), r.A(h1_), r.S(d_xhat_));
    // Self-attention.
    Zero(r.S(d_a_), NC);
    out1_.Backward(r, r.S(d_a_), dh, r.A(a1_), N_);
    Zero(r.S(d_q_), 3 * NC);
    const float* qkv = r.A(qkv_out_);
    float* dqkv = r.S(d_q_);
    cpu::AttentionBackward(dqkv, dqkv + C_, dqkv + 2 * C_, r.S(d_a_), qkv, 3 * C_, qkv + C_,
                           qkv + 2 * C_, 3 * C_, r.A(probs1_), B_, T_, T_, C_, H_);
    Zero(r.S(d_ln_), NC);
    qkv_.Backward(r, r.S(d_ln_), dqkv, r.A(ln1_.out), N_);
    ln1_.Backward(r, dh, r.S(d_ln_), r.A(h0_), r.S(d_xhat_));
    // proj_in and the GroupNorm.
    Zero(r.S(d_tok_), NC);
    proj_in_.Backward(r, r.S(d_tok_), dh, r.A(tok_), N_);
    Zero(r.S(d_ln_), NC);
    AddFromTokens(r.S(d_ln_), r.S(d_tok_), B_, C_, T_);
    gn_.Backward(r, dx, r.S(d_ln_), x, r.S(d_xhat_));
  }

 private:
  std::string Block(const std::string& name) const {
    return node_.prefix + "transformer_blocks.0." + name;
  }

  const UNetNode& node_;
  int B_, C_, T_, L_, H_, N_;
  Norm gn_;
  Linear proj_in_;
  Norm ln1_;
  Linear qkv_, out1_;
  Norm ln2_;
  Linear q2_, kv2_, out2_;
  Norm ln3_;
  Linear ff0_, ff2_, proj_out_;
  size_t tok_, h0_, qkv_out_, probs1_, a1_, h1_, q2_out_, kv2_out_, probs2_, a2_, h2_, ff_in_,
      ff_mid_, h3_;
  size_t d_tok_, d_h_, d_ln_, d_a_, d_q_, d_kv_, d_ff_in_, d_ff_mid_, d_xhat_;
};

}  // namespace

std::unique_ptr<UNetLayer> MakeTransformerLayer(const UNetConfig& c, const UNetPlan& plan,
                                                const UNetNode& node, int B, Space& acts,
                                                Space& scratch) {
  return std::make_unique<TransformerLayer>(c, plan, node, B, acts, scratch);
}

}  // namespace difftrain::unet
