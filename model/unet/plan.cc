#include "model/unet/plan.h"

#include "common/check.h"

namespace difftrain {
namespace {

// Appends the nodes and their parameters in forward order.
class PlanBuilder {
 public:
  PlanBuilder(const UNetConfig& c, UNetPlan& p) : c_(c), p_(p) {}

  void Build() {
    const int C0 = c_.block_out_channels[0];
    AddLinear("time_embedding.linear_1.", C0, c_.time_embed_dim());
    if (c_.time_cond_proj_dim > 0)
      AddLinear("time_embedding.cond_proj.", c_.time_cond_proj_dim, C0, /*bias=*/false);
    AddLinear("time_embedding.linear_2.", c_.time_embed_dim(), c_.time_embed_dim());
    if (c_.text_time()) {
      AddLinear("add_embedding.linear_1.", c_.projection_class_embeddings_input_dim,
                c_.time_embed_dim());
      AddLinear("add_embedding.linear_2.", c_.time_embed_dim(), c_.time_embed_dim());
    }
    int h = NewValue(c_.in_channels, c_.sample_size, c_.width());
    h = Conv("conv_in.", h, C0, 1);
    skips_.push_back(h);
    for (int i = 0; i < c_.levels(); ++i) {
      const std::string block = "down_blocks." + std::to_string(i) + ".";
      const bool attention = c_.down_block_types[i] == kCrossAttnDown;
      for (int j = 0; j < c_.layers_per_block; ++j) {
        h = Resnet(block + "resnets." + std::to_string(j) + ".", {h}, c_.block_out_channels[i]);
        if (attention) h = Transformer(block + "attentions." + std::to_string(j) + ".", h, i);
        skips_.push_back(h);
      }
      if (i + 1 < c_.levels()) {
        h = Conv(block + "downsamplers.0.conv.", h, c_.block_out_channels[i], 2);
        skips_.push_back(h);
      }
    }
    const int top = c_.block_out_channels.back();
    h = Resnet("mid_block.resnets.0.", {h}, top);
    h = Transformer("mid_block.attentions.0.", h, c_.levels() - 1);
    h = Resnet("mid_block.resnets.1.", {h}, top);
    for (int u = 0; u < c_.levels(); ++u) {
      const int level = c_.levels() - 1 - u;  // the down level this up block mirrors
      const std::string block = "up_blocks." + std::to_string(u) + ".";
      const bool attention = c_.up_block_types[u] == kCrossAttnUp;
      for (int j = 0; j <= c_.layers_per_block; ++j) {
        const int skip = skips_.back();
        skips_.pop_back();
        h = Resnet(block + "resnets." + std::to_string(j) + ".", {h, skip},
                   c_.block_out_channels[level]);
        if (attention) h = Transformer(block + "attentions." + std::to_string(j) + ".", h, level);
      }
      if (level > 0) h = UpsampleConv(block + "upsamplers.0.conv.", h);
    }
    DT_CHECK(skips_.empty(), "{} skips left over", skips_.size());
    Node({UNetNodeKind::kOutput,
          "",
          {h},
          NewValue(c_.out_channels, p_.values[h].H, p_.values[h].W)});
    AddNorm("conv_norm_out.", C0);
    AddConv("conv_out.", C0, c_.out_channels, 3);
  }

 private:
  int NewValue(int C, int H, int W) {
    p_.values.push_back({C, H, W});
    return static_cast<int>(p_.values.size()) - 1;
  }
  void Add(const std::string& name, std::vector<int64_t> shape) { p_.table.Add(name, shape); }
  void AddLinear(const std::string& prefix, int in, int out, bool bias = true) {
    Add(prefix + "weight", {out, in});
    if (bias) Add(prefix + "bias", {out});
  }
  void AddConv(const std::string& prefix, int in, int out, int K) {
    Add(prefix + "weight", {out, in, K, K});
    Add(prefix + "bias", {out});
  }
  void AddNorm(const std::string& prefix, int C) {
    Add(prefix + "weight", {C});
    Add(prefix + "bias", {C});
  }
  int Node(UNetNode n) {
    p_.nodes.push_back(std::move(n));
    return p_.nodes.back().output;
  }

  int Conv(const std::string& prefix, int in, int C, int stride) {
    const UNetValue& v = p_.values[in];
    AddConv(prefix, v.C, C, 3);
    return Node({UNetNodeKind::kConv,
                 prefix,
                 {in},
                 NewValue(C, (v.H - 1) / stride + 1, (v.W - 1) / stride + 1),
                 stride});
  }

  int UpsampleConv(const std::string& prefix, int in) {
    const UNetValue& v = p_.values[in];
    AddConv(prefix, v.C, v.C, 3);
    return Node({UNetNodeKind::kUpsampleConv, prefix, {in}, NewValue(v.C, 2 * v.H, 2 * v.W)});
  }

  int Resnet(const std::string& prefix, std::vector<int> inputs, int C) {
    int Cin = 0;
    for (int i : inputs)
      Cin += p_.values[i].C;
    AddNorm(prefix + "norm1.", Cin);
    AddConv(prefix + "conv1.", Cin, C, 3);
    AddLinear(prefix + "time_emb_proj.", c_.time_embed_dim(), C);
    AddNorm(prefix + "norm2.", C);
    AddConv(prefix + "conv2.", C, C, 3);
    if (Cin != C) AddConv(prefix + "conv_shortcut.", Cin, C, 1);
    const UNetValue v = p_.values[inputs[0]];
    return Node({UNetNodeKind::kResnet, prefix, std::move(inputs), NewValue(C, v.H, v.W)});
  }

  int Transformer(const std::string& prefix, int in, int level) {
    const UNetValue v = p_.values[in];
    const int C = v.C, D = c_.cross_attention_dim;
    const std::vector<int64_t> projection =
        c_.use_linear_projection ? std::vector<int64_t>{C, C} : std::vector<int64_t>{C, C, 1, 1};
    AddNorm(prefix + "norm.", C);
    Add(prefix + "proj_in.weight", projection);
    Add(prefix + "proj_in.bias", {C});
    const int depth = c_.transformer_depth(level);
    for (int k = 0; k < depth; ++k) {
      const std::string b = prefix + "transformer_blocks." + std::to_string(k) + ".";
      // to_q, to_k and to_v back to back: the self-attention's are one [3C, C] matrix, the
      // cross-attention's to_k and to_v one [2C, D] matrix (model/unet/unet.h).
      for (const char* attn : {"attn1.", "attn2."}) {
        const int kv_in = attn[4] == '1' ? C : D;
        AddNorm(b + (attn[4] == '1' ? "norm1." : "norm2."), C);
        AddLinear(b + attn + "to_q.", C, C, false);
        AddLinear(b + attn + "to_k.", kv_in, C, false);
        AddLinear(b + attn + "to_v.", kv_in, C, false);
        AddLinear(b + attn + "to_out.0.", C, C);
      }
      AddNorm(b + "norm3.", C);
      AddLinear(b + "ff.net.0.proj.", C, 8 * C);
      AddLinear(b + "ff.net.2.", 4 * C, C);
    }
    Add(prefix + "proj_out.weight", projection);
    Add(prefix + "proj_out.bias", {C});
    UNetNode n{UNetNodeKind::kTransformer, prefix, {in}, NewValue(C, v.H, v.W)};
    n.heads = c_.heads(level);
    n.depth = depth;
    return Node(std::move(n));
  }

  const UNetConfig& c_;
  UNetPlan& p_;
  std::vector<int> skips_;
};

}  // namespace

UNetPlan::UNetPlan(const UNetConfig& c) {
  PlanBuilder(c, *this).Build();
}

UNetNodeMacs NodeMacs(const UNetConfig& c, const UNetPlan& plan, const UNetNode& n) {
  const double E = c.time_embed_dim(), L = c.text_length, D = c.cross_attention_dim;
  const UNetValue& out = plan.out(n);
  const double Ci = plan.in_channels(n), C = out.C, T = double(out.H) * out.W;
  UNetNodeMacs m;
  UNetMacs& f = m.forward;
  switch (n.kind) {
    case UNetNodeKind::kConv:
    case UNetNodeKind::kUpsampleConv:
    case UNetNodeKind::kOutput:
      f.conv = Ci * C * 9 * T;
      break;
    case UNetNodeKind::kResnet:
      f.conv = (Ci * C * 9 + C * C * 9 + (Ci != C ? Ci * C : 0)) * T;
      f.linear = E * C;
      m.recomputed = Ci * C * 9 * T + E * C;  // conv1 and the time projection
      break;
    case UNetNodeKind::kTransformer:
      // proj_in and proj_out: 2 C² per token; each block's q/k/v/out of self-attention and
      // q/out of cross-attention 6 C², GEGLU 12 C², the text's keys and values 2 C·D per text
      // token.
      f.linear = (2 + 18.0 * n.depth) * C * C * T + n.depth * 2 * C * D * L;
      f.attention = n.depth * (2 * T * T * C + 2 * T * L * C);
      m.recomputed = f.total() - C * C * T;  // all but proj_out
      break;
  }
  return m;
}

namespace {

constexpr double kF32 = 4, kBf16 = 2;

// A GroupNorm (with its SiLU) of n fp32 elements into fp32: forward reads x twice (statistics,
// then normalise) and writes; backward reads x and the output gradient twice and writes dx.
UNetNodeBytes GroupNorm(double n) {
  return {3 * kF32 * n, 5 * kF32 * n};
}

// An elementwise op over n fp32 elements reading two and writing one (AddInto, a concatenation
// or its backward, AddToPlanes), in the forward or the backward.
double Elementwise(double n) {
  return 3 * kF32 * n;
}

// A convolution of x input elements into y outputs through p = patch × output pixels bf16
// columns (model/cuda/conv2d.h): forward im2col (read x, write p) and the tokens to planes
// (read, write y; read y too when it accumulates); backward the bias sum, the tokens' bf16
// copy, im2col again, col2im (read p, read and write din) and the zeroing of din by its caller.
UNetNodeBytes ConvBytes(double x, double p, double y, bool accumulate = false) {
  return {kF32 * x + kBf16 * p + kF32 * (accumulate ? 3 : 2) * y,
          kF32 * y + (kF32 + kBf16) * y + kF32 * x + kBf16 * p + kBf16 * p + 3 * kF32 * x};
}

UNetNodeBytes operator+(UNetNodeBytes a, UNetNodeBytes b) {
  return {a.forward + b.forward, a.backward + b.backward};
}

}  // namespace

UNetNodeBytes NodeBytes(const UNetPlan& plan, const UNetNode& n) {
  const UNetValue& in = plan.in(n);
  const UNetValue& out = plan.out(n);
  const double T = double(out.H) * out.W, X = plan.in_channels(n) * T, Y = out.C * T;
  switch (n.kind) {
    case UNetNodeKind::kConv: {
      const double Xin = double(in.C) * in.H * in.W;
      return ConvBytes(Xin, 9.0 * in.C * T, Y);
    }
    case UNetNodeKind::kUpsampleConv: {
      // Nearest ×2 into a map 4× the input (x = in.C · in.H · in.W); backward zeroes its
      // gradient and sums each 2×2 back.
      const double x = double(in.C) * in.H * in.W, up = 4 * x;
      return UNetNodeBytes{kF32 * (x + up), kF32 * up + kF32 * (up + x)} + ConvBytes(up, 9 * up, Y);
    }
    case UNetNodeKind::kOutput:
      return GroupNorm(X) + UNetNodeBytes{0, kF32 * X} + ConvBytes(X, 9 * X, Y);
    case UNetNodeKind::kResnet: {
      UNetNodeBytes b =
          GroupNorm(X) + ConvBytes(X, 9 * X, Y) + GroupNorm(Y) + ConvBytes(Y, 9 * Y, Y);
      b.forward += kF32 * 2 * Y;                    // the time embedding added over the planes
      b.backward += kF32 * Y + kF32 * (2 * Y + X);  // its plane sums; dact2, dh, dact1 zeroed
      if (n.inputs.size() == 2) b = b + UNetNodeBytes{Elementwise(X), kF32 * X + Elementwise(X)};
      if (X != Y) return b + ConvBytes(X, X, Y, /*accumulate=*/true);  // the 1×1 shortcut
      return b + UNetNodeBytes{Elementwise(Y), Elementwise(Y)};        // the identity's add
    }
    case UNetNodeKind::kTransformer: {
      // Per element of the [T, C] tokens (model/unet/cuda/transformer.cc). Forward: the
      // GroupNorm (12), to tokens (6), three LayerNorms into bf16 (6 each), three residual
      // adds (12 each), GEGLU's gate (reads 8C, writes 4C bf16 per token: 24), h3 to bf16
      // (6), the input copied to the output (8) and proj_out's tokens added back (12).
      // Backward: dx += dout (12), to tokens (6), to fp32 (6), GEGLU (40), three LayerNorms
      // (14 each), three casts to bf16 (6 each), the zeroed and gathered GroupNorm gradient
      // (14) and the GroupNorm into dx (24). Each further block: its LayerNorms, adds, GEGLU
      // and casts again (84 forward, 100 backward).
      return {(122 + 84.0 * (n.depth - 1)) * Y, (162 + 100.0 * (n.depth - 1)) * Y};
    }
  }
  return {};
}

int UNetPlan::in_channels(const UNetNode& n) const {
  int C = 0;
  for (int i : n.inputs)
    C += values[i].C;
  return C;
}

}  // namespace difftrain
