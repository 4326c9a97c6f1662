// Transformer2DModel with `depth` BasicTransformerBlocks (diffusers' transformer_2d.py and
// attention.py; SD 1.x/2.x have one, SDXL up to 10), over the T = H·W tokens of a [B, C, H, W]
// input x:
//   h0 = proj_in(GroupNorm(x, eps 1e-6))            (a 1×1 conv or a Linear: the same map)
//   each block, from h = h0:
//     h1 = h + attn1(norm1(h))                       self-attention
//     h2 = h1 + attn2(norm2(h1), text)               cross-attention to the text embedding
//     h3 = h2 + ff.net.2(GEGLU(ff.net.0.proj(norm3(h2))))   (the next block's h)
//   out = proj_out(h3 of the last block) + x
// The LayerNorms (eps 1e-5) have affine weights; attention projections q, k, v have no bias,
// to_out.0 has one; the scale is head_dim^-0.5.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/unet/parts.h"

namespace difftrain::unet {
namespace {

// One BasicTransformerBlock of the stream h → h + attn1 → + attn2 → + ff: its layers and the
// activations its backward reads.
struct Block {
  Norm ln1;
  Linear qkv, out1;
  Norm ln2;
  Linear q2, kv2, out2;
  Norm ln3;
  Linear ff0, ff2;
  size_t qkv_out = 0, probs1 = 0, a1 = 0, h1 = 0, q2_out = 0, kv2_out = 0, probs2 = 0, a2 = 0,
         h2 = 0, ff_in = 0, ff_mid = 0, h3 = 0;

  Block(const UNetConfig& c, const UNetPlan& plan, const std::string& b, int B, int N, int C, int T,
        int H, Space& acts)
      : ln1(plan, b + "norm1.", {N, C, 1, 1}, kLayerNormEps, acts),
        qkv(plan, b + "attn1.to_q.", C, 3 * C, false),
        out1(plan, b + "attn1.to_out.0.", C, C),
        ln2(plan, b + "norm2.", {N, C, 1, 1}, kLayerNormEps, acts),
        q2(plan, b + "attn2.to_q.", C, C, false),
        kv2(plan, b + "attn2.to_k.", c.cross_attention_dim, 2 * C, false),
        out2(plan, b + "attn2.to_out.0.", C, C),
        ln3(plan, b + "norm3.", {N, C, 1, 1}, kLayerNormEps, acts),
        ff0(plan, b + "ff.net.0.proj.", C, 8 * C),
        ff2(plan, b + "ff.net.2.", 4 * C, C) {
    // The fused projections read to_q, to_k, to_v (and to_k, to_v) as one matrix.
    DT_CHECK(Param(plan, b + "attn1.to_v.weight") == qkv.w + 2 * size_t(C) * C &&
                 Param(plan, b + "attn2.to_v.weight") == kv2.w + size_t(C) * c.cross_attention_dim,
             "{}: q, k and v are not adjacent in the parameter table", b);
    const size_t NC = size_t(N) * C, BL = size_t(B) * c.text_length;
    qkv_out = acts.Take(3 * NC);
    probs1 = acts.Take(size_t(B) * H * T * T);
    a1 = acts.Take(NC);
    h1 = acts.Take(NC);
    q2_out = acts.Take(NC);
    kv2_out = acts.Take(BL * 2 * C);
    probs2 = acts.Take(size_t(B) * H * T * c.text_length);
    a2 = acts.Take(NC);
    h2 = acts.Take(NC);
    ff_in = acts.Take(8 * NC);
    ff_mid = acts.Take(4 * NC);
    h3 = acts.Take(NC);
  }
};

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
        proj_out_(plan, n.prefix + "proj_out.", C_, C_) {
    first_param = gn_.w;
    const size_t NC = size_t(N_) * C_;
    tok_ = acts.Take(NC);
    h0_ = acts.Take(NC);
    blocks_.reserve(n.depth);
    for (int k = 0; k < n.depth; ++k) {
      blocks_.emplace_back(c, plan, n.prefix + "transformer_blocks." + std::to_string(k) + ".", B,
                           N_, C_, T_, H_, acts);
    }
    d_tok_ = scratch.Take(NC);
    d_h_ = scratch.Take(NC);
    d_ln_ = scratch.Take(NC);
    d_a_ = scratch.Take(NC);
    d_q_ = scratch.Take(3 * NC);
    d_kv_ = scratch.Take(size_t(B) * L_ * 2 * C_);
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
    size_t h = h0_;  // the stream: each block's input
    for (const Block& k : blocks_) {
      BlockForward(r, k, r.A(h));
      h = k.h3;
    }
    if (r.recomputing) return;
    // Back to [B, C, H, W], plus the input.
    float* out = r.value(node_.output);
    proj_out_.Forward(r, r.S(d_tok_), r.A(h), N_);  // d_tok_ is free until backward
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
    float* dh = r.S(d_h_);  // the stream's gradient, from the last block's output back to h0
    Zero(dh, NC);
    proj_out_.Backward(r, dh, r.S(d_tok_), r.A(blocks_.back().h3), N_);
    for (size_t k = blocks_.size(); k-- > 0;)
      BlockBackward(r, blocks_[k], r.A(k == 0 ? h0_ : blocks_[k - 1].h3), dh);
    // proj_in and the GroupNorm.
    Zero(r.S(d_tok_), NC);
    proj_in_.Backward(r, r.S(d_tok_), dh, r.A(tok_), N_);
    Zero(r.S(d_ln_), NC);
    AddFromTokens(r.S(d_ln_), r.S(d_tok_), B_, C_, T_);
    gn_.Backward(r, dx, r.S(d_ln_), x, r.S(d_xhat_));
  }

 private:
  // h → k.h3 (h1, h2 on the way).
  void BlockForward(const UNetRun& r, const Block& k, const float* h) const {
    const size_t NC = size_t(N_) * C_;
    // Self-attention.
    k.ln1.Forward(r, h);
    k.qkv.Forward(r, r.A(k.qkv_out), r.A(k.ln1.out), N_);
    const float* qkv = r.A(k.qkv_out);
    cpu::AttentionForward(r.A(k.a1), r.A(k.probs1), qkv, 3 * C_, qkv + C_, qkv + 2 * C_, 3 * C_, B_,
                          T_, T_, C_, H_);
    k.out1.Forward(r, r.A(k.h1), r.A(k.a1), N_);
    Add(r.A(k.h1), h, NC);
    // Cross-attention: keys and values from the text.
    k.ln2.Forward(r, r.A(k.h1));
    k.q2.Forward(r, r.A(k.q2_out), r.A(k.ln2.out), N_);
    k.kv2.Forward(r, r.A(k.kv2_out), r.context, B_ * L_);
    const float* kv = r.A(k.kv2_out);
    cpu::AttentionForward(r.A(k.a2), r.A(k.probs2), r.A(k.q2_out), C_, kv, kv + C_, 2 * C_, B_, T_,
                          L_, C_, H_);
    k.out2.Forward(r, r.A(k.h2), r.A(k.a2), N_);
    Add(r.A(k.h2), r.A(k.h1), NC);
    // GEGLU feed-forward.
    k.ln3.Forward(r, r.A(k.h2));
    k.ff0.Forward(r, r.A(k.ff_in), r.A(k.ln3.out), N_);
    cpu::GegluForward(r.A(k.ff_mid), r.A(k.ff_in), size_t(N_), size_t(4 * C_));
    k.ff2.Forward(r, r.A(k.h3), r.A(k.ff_mid), N_);
    Add(r.A(k.h3), r.A(k.h2), NC);
  }

  // dh: the gradient of k.h3 on entry, of the block's input h on return.
  void BlockBackward(const UNetRun& r, const Block& k, const float* h, float* dh) const {
    const size_t NC = size_t(N_) * C_;
    // GEGLU feed-forward.
    Zero(r.S(d_ff_mid_), 4 * NC);
    k.ff2.Backward(r, r.S(d_ff_mid_), dh, r.A(k.ff_mid), N_);
    Zero(r.S(d_ff_in_), 8 * NC);
    cpu::GegluBackward(r.S(d_ff_in_), r.S(d_ff_mid_), r.A(k.ff_in), size_t(N_), size_t(4 * C_));
    Zero(r.S(d_ln_), NC);
    k.ff0.Backward(r, r.S(d_ln_), r.S(d_ff_in_), r.A(k.ln3.out), N_);
    k.ln3.Backward(r, dh, r.S(d_ln_), r.A(k.h2), r.S(d_xhat_));
    // Cross-attention; the text's gradient where one is asked for (textual inversion).
    Zero(r.S(d_a_), NC);
    k.out2.Backward(r, r.S(d_a_), dh, r.A(k.a2), N_);
    Zero(r.S(d_q_), NC);
    Zero(r.S(d_kv_), size_t(B_) * L_ * 2 * C_);
    const float* kv = r.A(k.kv2_out);
    float* dkv = r.S(d_kv_);
    cpu::AttentionBackward(r.S(d_q_), dkv, dkv + C_, r.S(d_a_), r.A(k.q2_out), C_, kv, kv + C_,
                           2 * C_, r.A(k.probs2), B_, T_, L_, C_, H_);
    k.kv2.Backward(r, r.dcontext, dkv, r.context, B_ * L_);
    Zero(r.S(d_ln_), NC);
    k.q2.Backward(r, r.S(d_ln_), r.S(d_q_), r.A(k.ln2.out), N_);
    k.ln2.Backward(r, dh, r.S(d_ln_), r.A(k.h1), r.S(d_xhat_));
    // Self-attention.
    Zero(r.S(d_a_), NC);
    k.out1.Backward(r, r.S(d_a_), dh, r.A(k.a1), N_);
    Zero(r.S(d_q_), 3 * NC);
    const float* qkv = r.A(k.qkv_out);
    float* dqkv = r.S(d_q_);
    cpu::AttentionBackward(dqkv, dqkv + C_, dqkv + 2 * C_, r.S(d_a_), qkv, 3 * C_, qkv + C_,
                           qkv + 2 * C_, 3 * C_, r.A(k.probs1), B_, T_, T_, C_, H_);
    Zero(r.S(d_ln_), NC);
    k.qkv.Backward(r, r.S(d_ln_), dqkv, r.A(k.ln1.out), N_);
    k.ln1.Backward(r, dh, r.S(d_ln_), h, r.S(d_xhat_));
  }

  const UNetNode& node_;
  int B_, C_, T_, L_, H_, N_;
  Norm gn_;
  Linear proj_in_, proj_out_;
  std::vector<Block> blocks_;
  size_t tok_, h0_;
  size_t d_tok_, d_h_, d_ln_, d_a_, d_q_, d_kv_, d_ff_in_, d_ff_mid_, d_xhat_;
};

}  // namespace

std::unique_ptr<UNetLayer> MakeTransformerLayer(const UNetConfig& c, const UNetPlan& plan,
                                                const UNetNode& node, int B, Space& acts,
                                                Space& scratch) {
  return std::make_unique<TransformerLayer>(c, plan, node, B, acts, scratch);
}

}  // namespace difftrain::unet
