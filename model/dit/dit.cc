#include "model/dit/dit.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/cpu/embed.h"
#include "model/cpu/layernorm.h"
#include "model/cpu/linear.h"
#include "model/cpu/modulate.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

constexpr float kLayerNormEps = 1e-6f;
constexpr int kFrequencyDim = 256;  // timestep embedder input width

void Zero(float* p, size_t n) {
  std::memset(p, 0, n * sizeof(float));
}

// Calls f(name, shape, member) for every activation of a micro-batch of B, in arena order.
// Laying out the arena and binding the pointers both walk this one list.
template <typename Acts, typename F>
void VisitActivations(const DiTConfig& c, int B, Acts& a, F&& f) {
  const int64_t T = c.tokens(), D = c.hidden_size, H = c.num_heads, M = c.mlp_hidden();
  const int64_t N = int64_t(B) * T;
  f("patches", {N, c.patch_features()}, a.patches);
  f("t_freq", {B, kFrequencyDim}, a.tfreq);
  f("t_hidden", {B, D}, a.t_hidden);
  f("t_act", {B, D}, a.t_act);
  f("t_emb", {B, D}, a.t_emb);
  f("y_emb", {B, D}, a.y_emb);
  f("c", {B, D}, a.c);
  f("silu_c", {B, D}, a.silu_c);
  a.blocks.resize(c.depth);
  for (int l = 0; l < c.depth; ++l) {
    auto& k = a.blocks[l];
    const std::string p = "blocks." + std::to_string(l) + ".";
    f(p + "resid_in", {N, D}, k.resid_in);
    f(p + "ada", {B, 6 * D}, k.ada);
    f(p + "ln1", {N, D}, k.ln1);
    f(p + "mean1", {N}, k.mean1);
    f(p + "rstd1", {N}, k.rstd1);
    f(p + "mod1", {N, D}, k.mod1);
    f(p + "qkv", {N, 3 * D}, k.qkv);
    f(p + "probs", {B, H, T, T}, k.probs);
    f(p + "attn", {N, D}, k.attn);
    f(p + "proj", {N, D}, k.proj);
    f(p + "mid", {N, D}, k.mid);
    f(p + "ln2", {N, D}, k.ln2);
    f(p + "mean2", {N}, k.mean2);
    f(p + "rstd2", {N}, k.rstd2);
    f(p + "mod2", {N, D}, k.mod2);
    f(p + "fc1", {N, M}, k.fc1);
    f(p + "gelu", {N, M}, k.gelu);
    f(p + "fc2", {N, D}, k.fc2);
  }
  const int64_t out_features = int64_t(c.patch_size) * c.patch_size * c.out_channels();
  f("resid_out", {N, D}, a.resid_out);
  f("final.ada", {B, 2 * D}, a.ada_f);
  f("final.ln", {N, D}, a.lnf);
  f("final.mean", {N}, a.meanf);
  f("final.rstd", {N}, a.rstdf);
  f("final.mod", {N, D}, a.modf);
  f("final.linear", {N, out_features}, a.final_out);
  f("output", {B, c.out_channels(), c.input_size, c.input_size}, a.out);
  // Backward scratch: the residual-stream gradient and reusable per-layer buffers.
  f("grad.resid", {N, D}, a.d_resid);
  f("grad.a", {N, D}, a.d_a);
  f("grad.b", {N, D}, a.d_b);
  f("grad.qkv", {N, 3 * D}, a.d_qkv);
  f("grad.h1", {N, M}, a.d_h1);
  f("grad.h2", {N, M}, a.d_h2);
  f("grad.ada", {B, 6 * D}, a.d_ada);
  f("grad.silu_c", {B, D}, a.d_silu_c);
  f("grad.c", {B, D}, a.d_c);
  f("grad.t1", {B, D}, a.d_t1);
  f("grad.t2", {B, D}, a.d_t2);
  f("grad.final_linear", {N, out_features}, a.d_final_out);
}

void XavierUniform(float* w, int64_t fan_out, int64_t fan_in, Rng& rng) {
  const double bound = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  for (int64_t i = 0; i < fan_out * fan_in; ++i)
    w[i] = static_cast<float>((2 * rng.Uniform() - 1) * bound);
}

void Normal(float* w, size_t n, double std, Rng& rng) {
  for (size_t i = 0; i < n; ++i)
    w[i] = static_cast<float>(rng.Normal() * std);
}

}  // namespace

DiT::DiT(const DiTConfig& config) : config_(config) {
  Status valid = config_.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  const int64_t D = config_.hidden_size, M = config_.mlp_hidden(), p = config_.patch_size;
  x_w_ = table_.Add("x_embedder.proj.weight", {D, config_.in_channels, p, p});
  x_b_ = table_.Add("x_embedder.proj.bias", {D});
  t1_w_ = table_.Add("t_embedder.mlp.0.weight", {D, kFrequencyDim});
  t1_b_ = table_.Add("t_embedder.mlp.0.bias", {D});
  t2_w_ = table_.Add("t_embedder.mlp.2.weight", {D, D});
  t2_b_ = table_.Add("t_embedder.mlp.2.bias", {D});
  y_table_ = table_.Add("y_embedder.embedding_table.weight", {config_.label_rows(), D});
  for (int l = 0; l < config_.depth; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    BlockOffsets o;
    o.qkv_w = table_.Add(b + "attn.qkv.weight", {3 * D, D});
    o.qkv_b = table_.Add(b + "attn.qkv.bias", {3 * D});
    o.proj_w = table_.Add(b + "attn.proj.weight", {D, D});
    o.proj_b = table_.Add(b + "attn.proj.bias", {D});
    o.fc1_w = table_.Add(b + "mlp.fc1.weight", {M, D});
    o.fc1_b = table_.Add(b + "mlp.fc1.bias", {M});
    o.fc2_w = table_.Add(b + "mlp.fc2.weight", {D, M});
    o.fc2_b = table_.Add(b + "mlp.fc2.bias", {D});
    o.ada_w = table_.Add(b + "adaLN_modulation.1.weight", {6 * D, D});
    o.ada_b = table_.Add(b + "adaLN_modulation.1.bias", {6 * D});
    blocks_.push_back(o);
  }
  fada_w_ = table_.Add("final_layer.adaLN_modulation.1.weight", {2 * D, D});
  fada_b_ = table_.Add("final_layer.adaLN_modulation.1.bias", {2 * D});
  flin_w_ = table_.Add("final_layer.linear.weight", {p * p * config_.out_channels(), D});
  flin_b_ = table_.Add("final_layer.linear.bias", {p * p * config_.out_channels()});
  DT_CHECK(static_cast<int64_t>(table_.total()) == TrainableParameterCount(config_),
           "parameter table and parameter count disagree");

  params_ = Buffer<float>(table_.total());
  grads_ = Buffer<float>(table_.total());
  pos_embed_ = Buffer<float>(static_cast<size_t>(config_.tokens()) * D);
  cpu::SinCos2DPositionEmbedding(pos_embed_.data(), config_.grid(), config_.hidden_size);
}

void DiT::InitializeReference(uint64_t seed) {
  Rng rng(seed, RngStream::kInit);
  params_.Zero();  // every bias, adaLN and the final linear start at zero
  for (const TensorSpec& t : table_.tensors()) {
    if (t.shape.size() < 2) continue;
    const int64_t fan_out = t.shape[0], fan_in = static_cast<int64_t>(t.numel) / fan_out;
    float* w = params_.data() + t.offset;
    const bool zero_init = t.name.find("adaLN_modulation") != std::string::npos ||
                           t.name == "final_layer.linear.weight";
    if (t.offset == y_table_ || t.offset == t1_w_ || t.offset == t2_w_) {
      Normal(w, t.numel, 0.02, rng);
    } else if (!zero_init) {
      XavierUniform(w, fan_out, fan_in, rng);
    }
  }
}

void DiT::InitializeRandom(uint64_t seed) {
  Rng rng(seed, RngStream::kInit);
  for (const TensorSpec& t : table_.tensors()) {
    float* w = params_.data() + t.offset;
    if (t.shape.size() >= 2) {
      XavierUniform(w, t.shape[0], static_cast<int64_t>(t.numel) / t.shape[0], rng);
    } else {
      Normal(w, t.numel, 0.1, rng);
    }
  }
}

TensorTable DiT::ActivationLayout(const DiTConfig& c, int B) {
  TensorTable layout;
  Acts unused{};
  VisitActivations(c, B, unused, [&](const std::string& name, std::vector<int64_t> shape, float*&) {
    layout.Add(name, std::move(shape));
  });
  return layout;
}

size_t DiT::ActivationBytes(const DiTConfig& c, int B) {
  return ActivationLayout(c, B).total() * sizeof(float);
}

void DiT::EnsureActivations(int B) {
  if (B == batch_) return;
  const TensorTable layout = ActivationLayout(config_, B);
  act_buffer_ = Buffer<float>(layout.total());
  float* base = act_buffer_.data();
  VisitActivations(config_, B, acts_,
                   [&](const std::string& name, const std::vector<int64_t>&, float*& member) {
                     member = base + layout.Find(name)->offset;
                   });
  batch_ = B;
}

const float* DiT::Forward(const float* x, const float* t, const int32_t* y, int B) {
  DT_CHECK(B > 0, "micro-batch must be positive, got {}", B);
  for (int b = 0; b < B; ++b) {
    DT_CHECK(y[b] >= 0 && y[b] < config_.label_rows(), "label {} out of range [0, {})", y[b],
             config_.label_rows());
  }
  EnsureActivations(B);
  y_.assign(y, y + B);
  Acts& a = acts_;
  const DiTConfig& c = config_;
  const int T = c.tokens(), D = c.hidden_size, H = c.num_heads, M = c.mlp_hidden();
  const int N = B * T, S = c.input_size, p = c.patch_size;

  // Patch embed (a Linear over flattened patches) plus the fixed position embedding.
  float* x_tokens = a.blocks.empty() ? a.resid_out : a.blocks[0].resid_in;
  cpu::Patchify(a.patches, x, B, c.in_channels, S, S, p);
  cpu::LinearForward(x_tokens, a.patches, P(x_w_), P(x_b_), N, c.patch_features(), D);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* pos = pos_embed_.data() + static_cast<size_t>(n % T) * D;
    for (int d = 0; d < D; ++d)
      x_tokens[static_cast<size_t>(n) * D + d] += pos[d];
  }

  // Conditioning c = t_embedder(t) + y_embedder(y); every adaLN reads SiLU(c).
  cpu::TimestepFrequencies(a.tfreq, t, B, kFrequencyDim);
  cpu::LinearForward(a.t_hidden, a.tfreq, P(t1_w_), P(t1_b_), B, kFrequencyDim, D);
  cpu::SiluForward(a.t_act, a.t_hidden, size_t(B) * D);
  cpu::LinearForward(a.t_emb, a.t_act, P(t2_w_), P(t2_b_), B, D, D);
  cpu::EmbeddingForward(a.y_emb, P(y_table_), y, B, D);
  for (int i = 0; i < B * D; ++i)
    a.c[i] = a.t_emb[i] + a.y_emb[i];
  cpu::SiluForward(a.silu_c, a.c, size_t(B) * D);

  for (int l = 0; l < c.depth; ++l) {
    const BlockOffsets& o = blocks_[l];
    BlockActs& k = a.blocks[l];
    float* resid_out = l + 1 < c.depth ? a.blocks[l + 1].resid_in : a.resid_out;
    // adaLN: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunks of 6D.
    cpu::LinearForward(k.ada, a.silu_c, P(o.ada_w), P(o.ada_b), B, D, 6 * D);
    // x = x + gate_msa · attn(modulate(norm1(x), shift_msa, scale_msa))
    cpu::LayerNormForward(k.ln1, k.mean1, k.rstd1, k.resid_in, N, D, kLayerNormEps);
    cpu::ModulateForward(k.mod1, k.ln1, k.ada, k.ada + D, 6 * D, B, T, D);
    cpu::LinearForward(k.qkv, k.mod1, P(o.qkv_w), P(o.qkv_b), N, D, 3 * D);
    cpu::AttentionForward(k.attn, k.probs, k.qkv, B, T, D, H);
    cpu::LinearForward(k.proj, k.attn, P(o.proj_w), P(o.proj_b), N, D, D);
    cpu::GatedResidualForward(k.mid, k.resid_in, k.proj, k.ada + 2 * D, 6 * D, B, T, D);
    // x = x + gate_mlp · mlp(modulate(norm2(x), shift_mlp, scale_mlp))
    cpu::LayerNormForward(k.ln2, k.mean2, k.rstd2, k.mid, N, D, kLayerNormEps);
    cpu::ModulateForward(k.mod2, k.ln2, k.ada + 3 * D, k.ada + 4 * D, 6 * D, B, T, D);
    cpu::LinearForward(k.fc1, k.mod2, P(o.fc1_w), P(o.fc1_b), N, D, M);
    cpu::GeluForward(k.gelu, k.fc1, size_t(N) * M);
    cpu::LinearForward(k.fc2, k.gelu, P(o.fc2_w), P(o.fc2_b), N, M, D);
    cpu::GatedResidualForward(resid_out, k.mid, k.fc2, k.ada + 5 * D, 6 * D, B, T, D);
  }

  // Final layer: modulate(norm(x), shift, scale) → Linear → unpatchify.
  const int out_features = p * p * c.out_channels();
  cpu::LinearForward(a.ada_f, a.silu_c, P(fada_w_), P(fada_b_), B, D, 2 * D);
  cpu::LayerNormForward(a.lnf, a.meanf, a.rstdf, a.resid_out, N, D, kLayerNormEps);
  cpu::ModulateForward(a.modf, a.lnf, a.ada_f, a.ada_f + D, 2 * D, B, T, D);
  cpu::LinearForward(a.final_out, a.modf, P(flin_w_), P(flin_b_), N, D, out_features);
  cpu::UnpatchifyForward(a.out, a.final_out, B, c.out_channels(), S, S, p);
  return a.out;
}

void DiT::Backward(const float* dout, const GradientsReady& ready) {
  auto report = [&](size_t from) {
    if (ready) ready(from);
  };
  DT_CHECK(batch_ > 0, "Backward called before Forward");
  Acts& a = acts_;
  const DiTConfig& c = config_;
  const int B = batch_, T = c.tokens(), D = c.hidden_size, H = c.num_heads, M = c.mlp_hidden();
  const int N = B * T, S = c.input_size, p = c.patch_size;
  const int out_features = p * p * c.out_channels();
  const size_t ND = size_t(N) * D;

  // Final layer, in reverse.
  Zero(a.d_final_out, size_t(N) * out_features);
  cpu::UnpatchifyBackward(a.d_final_out, dout, B, c.out_channels(), S, S, p);
  Zero(a.d_a, ND);
  cpu::LinearBackward(a.d_a, G(flin_w_), G(flin_b_), a.d_final_out, a.modf, P(flin_w_), N, D,
                      out_features);
  Zero(a.d_b, ND);
  Zero(a.d_ada, size_t(B) * 2 * D);
  cpu::ModulateBackward(a.d_b, a.d_ada, a.d_ada + D, a.d_a, a.lnf, a.ada_f + D, 2 * D, B, T, D);
  Zero(a.d_silu_c, size_t(B) * D);
  cpu::LinearBackward(a.d_silu_c, G(fada_w_), G(fada_b_), a.d_ada, a.silu_c, P(fada_w_), B, D,
                      2 * D);
  Zero(a.d_resid, ND);
  cpu::LayerNormBackward(a.d_resid, a.d_b, a.resid_out, a.meanf, a.rstdf, N, D);
  report(fada_w_);  // the final layer's parameters sit at the end of the arena

  // Blocks, last to first. d_resid holds the residual-stream gradient throughout: the gated
  // residuals pass it through unchanged and the LayerNorms add their branch into it.
  for (int l = c.depth - 1; l >= 0; --l) {
    const BlockOffsets& o = blocks_[l];
    BlockActs& k = a.blocks[l];
    Zero(a.d_ada, size_t(B) * 6 * D);
    // MLP branch.
    Zero(a.d_a, ND);
    cpu::GatedResidualBackward<float>(nullptr, a.d_a, a.d_ada + 5 * D, a.d_resid, k.fc2,
                                      k.ada + 5 * D, 6 * D, B, T, D);
    Zero(a.d_h1, size_t(N) * M);
    cpu::LinearBackward(a.d_h1, G(o.fc2_w), G(o.fc2_b), a.d_a, k.gelu, P(o.fc2_w), N, M, D);
    Zero(a.d_h2, size_t(N) * M);
    cpu::GeluBackward(a.d_h2, a.d_h1, k.fc1, size_t(N) * M);
    Zero(a.d_a, ND);
    cpu::LinearBackward(a.d_a, G(o.fc1_w), G(o.fc1_b), a.d_h2, k.mod2, P(o.fc1_w), N, D, M);
    Zero(a.d_b, ND);
    cpu::ModulateBackward(a.d_b, a.d_ada + 3 * D, a.d_ada + 4 * D, a.d_a, k.ln2, k.ada + 4 * D,
                          6 * D, B, T, D);
    cpu::LayerNormBackward(a.d_resid, a.d_b, k.mid, k.mean2, k.rstd2, N, D);
    // Attention branch.
    Zero(a.d_a, ND);
    cpu::GatedResidualBackward<float>(nullptr, a.d_a, a.d_ada + 2 * D, a.d_resid, k.proj,
                                      k.ada + 2 * D, 6 * D, B, T, D);
    Zero(a.d_b, ND);
    cpu::LinearBackward(a.d_b, G(o.proj_w), G(o.proj_b), a.d_a, k.attn, P(o.proj_w), N, D, D);
    Zero(a.d_qkv, 3 * ND);
    cpu::AttentionBackward(a.d_qkv, a.d_b, k.qkv, k.probs, B, T, D, H);
    Zero(a.d_a, ND);
    cpu::LinearBackward(a.d_a, G(o.qkv_w), G(o.qkv_b), a.d_qkv, k.mod1, P(o.qkv_w), N, D, 3 * D);
    Zero(a.d_b, ND);
    cpu::ModulateBackward(a.d_b, a.d_ada, a.d_ada + D, a.d_a, k.ln1, k.ada + D, 6 * D, B, T, D);
    cpu::LayerNormBackward(a.d_resid, a.d_b, k.resid_in, k.mean1, k.rstd1, N, D);
    // adaLN of this block.
    cpu::LinearBackward(a.d_silu_c, G(o.ada_w), G(o.ada_b), a.d_ada, a.silu_c, P(o.ada_w), B, D,
                        6 * D);
    report(o.qkv_w);  // the block's first tensor
  }

  // Patch embed (the position embedding is fixed; the input is data: no input gradient).
  cpu::LinearBackward<float>(nullptr, G(x_w_), G(x_b_), a.d_resid, a.patches, P(x_w_), N,
                             c.patch_features(), D);
  // Conditioning: c = t_emb + y_emb.
  Zero(a.d_c, size_t(B) * D);
  cpu::SiluBackward(a.d_c, a.d_silu_c, a.c, size_t(B) * D);
  cpu::EmbeddingBackward(G(y_table_), a.d_c, y_.data(), B, D);
  Zero(a.d_t1, size_t(B) * D);
  cpu::LinearBackward(a.d_t1, G(t2_w_), G(t2_b_), a.d_c, a.t_act, P(t2_w_), B, D, D);
  Zero(a.d_t2, size_t(B) * D);
  cpu::SiluBackward(a.d_t2, a.d_t1, a.t_hidden, size_t(B) * D);
  cpu::LinearBackward<float>(nullptr, G(t1_w_), G(t1_b_), a.d_t2, a.tfreq, P(t1_w_), B,
                             kFrequencyDim, D);
  report(0);
}

}  // namespace difftrain
