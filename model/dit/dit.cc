#include "model/dit/dit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/cpu/embed.h"
#include "model/cpu/layernorm.h"
#include "model/cpu/linear.h"
#include "model/cpu/modulate.h"
#include "model/parallel/mappings.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

using parallel::CopyToTensorParallel;
using parallel::GatherSequence;
using parallel::GatherSequenceSplitGrad;
using parallel::ReduceFromTensorParallel;
using parallel::SequenceShape;

constexpr float kLayerNormEps = 1e-6f;

void Zero(float* p, size_t n) {
  std::memset(p, 0, n * sizeof(float));
}

// out[n, :] += bias for N rows of width D: the bias of a row-parallel layer, added once the
// partial products are summed.
void AddBias(float* out, const float* bias, int N, int D) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int d = 0; d < D; ++d)
      out[size_t(n) * D + d] += bias[d];
  }
}

// Copies context-parallel rank r's tokens [r·Tl, (r+1)·Tl) of every sample out of [B, T, w].
void KeepTokens(float* local, const float* full, int B, int T, int Tl, int w, int r) {
  const size_t chunk = size_t(Tl) * w;
  for (int b = 0; b < B; ++b)
    std::memcpy(local + b * chunk, full + size_t(b) * T * w + r * chunk, chunk * sizeof(float));
}

// [B, X, Y, w] → [B, Y, X, w]: a video's tokens from frame-major ([frames, tokens]) to
// token-major ([tokens, frames]), or back with X and Y swapped.
void SwapAxes(float* out, const float* in, int B, int X, int Y, int w) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int x = 0; x < X; ++x) {
      for (int y = 0; y < Y; ++y) {
        std::memcpy(out + ((size_t(b) * Y + y) * X + x) * w, in + ((size_t(b) * X + x) * Y + y) * w,
                    size_t(w) * sizeof(float));
      }
    }
  }
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

// B samples of Fr frames (1 for an image) of T tokens each, Tl of them on this rank; a sample's
// Fr·Tl = P tokens lie frame after frame, so the token-wise ops and the per-sample adaLN see
// B samples of P tokens, and a spatial attention BF = B·Fr sequences of T tokens.
struct Dims {
  int B, Fr, BF, T, Tl, P, N, D, Dl, Hl, Ml, F, Fo, S;
  Dims(const DiTConfig& c, const DiTShard& s, int B_)
      : B(B_),
        Fr(c.frames()),
        BF(B_ * c.frames()),
        T(c.tokens()),
        Tl(c.tokens() / s.cp),
        P(c.frames() * (c.tokens() / s.cp)),
        N(B_ * c.frames() * (c.tokens() / s.cp)),
        D(c.hidden_size),
        Dl(c.hidden_size / s.tp),
        Hl(c.num_heads / s.tp),
        Ml(c.mlp_hidden() / s.tp),
        F(c.patch_features()),
        Fo(c.patch_size * c.patch_size * c.out_channels()),
        S(c.input_size) {}
};

}  // namespace

// `kind`: a spatial or a temporal block's activations, or (kWorkspace) room for either.
template <typename F>
void DiT::VisitBlock(const DiTConfig& c, const DiTShard& s, int B, const std::string& p,
                     BlockKind kind, BlockActs& k, F&& f) {
  const Dims d(c, s, B);
  const int64_t N = d.N, D = d.D;
  // A spatial block gathers the keys and values of the frame's whole sequence (context
  // parallel); a temporal one keeps its qkv token-major [B, Tl, Fr, 3·Dl] there.
  const int64_t spatial_kv = s.cp > 1 ? int64_t(d.BF) * d.T * 3 * d.Dl : 0;
  const int64_t temporal_kv = N * 3 * d.Dl;
  const int64_t spatial_probs = int64_t(d.BF) * d.Hl * d.Tl * d.T;
  const int64_t temporal_probs = int64_t(B) * d.Tl * d.Hl * d.Fr * d.Fr;
  const bool spatial = kind != BlockKind::kTemporal, temporal = kind != BlockKind::kSpatial;
  f(p + "ada", {B, 6 * D}, k.ada);
  f(p + "ln1", {N, D}, k.ln1);
  f(p + "mean1", {N}, k.mean1);
  f(p + "rstd1", {N}, k.rstd1);
  f(p + "mod1", {N, D}, k.mod1);
  f(p + "qkv", {N, 3 * d.Dl}, k.qkv);
  const int64_t kv = std::max(spatial ? spatial_kv : 0, temporal ? temporal_kv : 0);
  if (kv > 0) f(p + "kv", {kv}, k.kv);
  f(p + "probs", {std::max(spatial ? spatial_probs : 0, temporal ? temporal_probs : 0)}, k.probs);
  f(p + "attn", {N, d.Dl}, k.attn);
  f(p + "proj", {N, D}, k.proj);
  f(p + "mid", {N, D}, k.mid);
  f(p + "ln2", {N, D}, k.ln2);
  f(p + "mean2", {N}, k.mean2);
  f(p + "rstd2", {N}, k.rstd2);
  f(p + "mod2", {N, D}, k.mod2);
  f(p + "fc1", {N, d.Ml}, k.fc1);
  f(p + "gelu", {N, d.Ml}, k.gelu);
  f(p + "fc2", {N, D}, k.fc2);
}

// Calls f(name, shape, member) for every activation of one slot, in arena order. Laying out
// the arena and binding the pointers both walk this one list. Context parallelism adds the
// gathered keys/values and output; with cp = 1 those are the local buffers themselves. With
// recomputation a slot keeps only each block's input.
template <typename F>
void DiT::VisitActivations(const DiTConfig& c, const DiTShard& s, int B, bool recompute, Acts& a,
                           F&& f) {
  const Dims d(c, s, B);
  const int64_t N = d.N, D = d.D;
  if (s.first_stage()) {
    f("patches", {N, d.F}, a.patches);
    f("t_freq", {B, kFrequencyDim}, a.tfreq);
    f("t_hidden", {B, D}, a.t_hidden);
    f("t_act", {B, D}, a.t_act);
    f("t_emb", {B, D}, a.t_emb);
    if (c.has_labels()) f("y_emb", {B, D}, a.y_emb);
  }
  f("c", {B, D}, a.c);
  f("silu_c", {B, D}, a.silu_c);
  a.blocks.resize(s.end_block - s.first_block);
  for (int l = s.first_block; l < s.end_block; ++l) {
    auto& k = a.blocks[l - s.first_block];
    const std::string p = "blocks." + std::to_string(l) + ".";
    f(p + "resid_in", {N, D}, k.resid_in);
    if (!recompute)
      VisitBlock(c, s, B, p, c.temporal_block(l) ? BlockKind::kTemporal : BlockKind::kSpatial, k,
                 f);
  }
  f("resid_out", {N, D}, a.resid_out);
  if (s.last_stage()) {
    f("final.ada", {B, 2 * D}, a.ada_f);
    f("final.ln", {N, D}, a.lnf);
    f("final.mean", {N}, a.meanf);
    f("final.rstd", {N}, a.rstdf);
    f("final.mod", {N, D}, a.modf);
    f("final.linear", {N, d.Fo}, a.final_out);
    if (s.cp > 1) f("final.gathered", {int64_t(d.BF) * d.T, d.Fo}, a.final_full);
    f("output", {d.BF, c.out_channels(), d.S, d.S}, a.out);
  }
}

template <typename F>
void DiT::VisitScratch(const DiTConfig& c, const DiTShard& s, int B, bool recompute, Scratch& a,
                       F&& f) {
  const Dims d(c, s, B);
  const int64_t N = d.N, D = d.D;
  if (s.first_stage()) f("patches_full", {int64_t(d.BF) * d.T, d.F}, a.patches_full);
  f("grad.resid", {N, D}, a.d_resid);
  f("grad.a", {N, D}, a.d_a);
  f("grad.b", {N, D}, a.d_b);
  f("grad.qkv", {N, 3 * d.Dl}, a.d_qkv);
  f("grad.h1", {N, d.Ml}, a.d_h1);
  f("grad.h2", {N, d.Ml}, a.d_h2);
  f("grad.ada", {B, 6 * D}, a.d_ada);
  f("grad.silu_c", {B, D}, a.d_silu_c);
  f("grad.c", {B, D}, a.d_c);
  if (s.first_stage()) {
    f("grad.t1", {B, D}, a.d_t1);
    f("grad.t2", {B, D}, a.d_t2);
  }
  if (s.last_stage()) f("grad.final_linear", {N, d.Fo}, a.d_final_out);
  if (s.cp > 1) {
    f("grad.kv", {int64_t(d.BF) * d.T, 3 * d.Dl}, a.d_kv);
    if (s.last_stage()) f("grad.final_gathered", {int64_t(d.BF) * d.T, d.Fo}, a.d_final_full);
    // The rank-major buffer of the sequence exchanges (keys/values and the output).
    f("sequence", {int64_t(d.BF) * d.T * std::max(3 * d.Dl, s.last_stage() ? d.Fo : 0)},
      a.sequence);
  }
  if (c.video) {  // a temporal block's attention, token-major
    f("temporal.attn", {N, d.Dl}, a.t_attn);
    f("temporal.grad_qkv", {N, 3 * d.Dl}, a.t_dqkv);
  }
  if (recompute)
    VisitBlock(c, s, B, "recompute.", c.video ? BlockKind::kWorkspace : BlockKind::kSpatial,
               a.block, f);
}

DiT::DiT(const DiTConfig& config) : DiT(config, DiTShard::Whole(config), DiTComms{}) {}

DiT::DiT(const DiTConfig& config, const DiTShard& shard, const DiTComms& comms, bool gradients)
    : config_(config), shard_(shard), comms_(comms) {
  Status valid = config_.Validate();
  DT_CHECK(valid.ok(), "{}", valid.message());
  DT_CHECK((comms.tp ? comms.tp->size() : 1) == shard.tp, "tp group of {} for a shard of tp {}",
           comms.tp ? comms.tp->size() : 1, shard.tp);
  DT_CHECK((comms.cp ? comms.cp->size() : 1) == shard.cp, "cp group of {} for a shard of cp {}",
           comms.cp ? comms.cp->size() : 1, shard.cp);
  sharded_ = ShardParameters(config_, shard_);
  global_table_ = ShardParameters(config_, DiTShard::Whole(config_)).table;
  DT_CHECK(static_cast<int64_t>(global_table_.total()) == TrainableParameterCount(config_),
           "parameter table and parameter count disagree");
  p_ = DiTParams::Bind(sharded_.table, shard_);
  // A model made for inference is filled from a file by the threads that copy the weights in.
  params_ =
      Buffer<float>(num_params(), gradients ? BufferPages::kTouched : BufferPages::kOnFirstTouch);
  // Touched only where gradients are computed (a LoRA run skips most).
  grads_ = Buffer<float>(gradients ? num_params() : 0, BufferPages::kOnFirstTouch);
  if (shard_.first_stage()) {
    pos_embed_ = Buffer<float>(static_cast<size_t>(config_.tokens()) * config_.hidden_size);
    cpu::SinCos2DPositionEmbedding(pos_embed_.data(), config_.grid(), config_.hidden_size);
    if (config_.video) {
      temp_embed_ = Buffer<float>(static_cast<size_t>(config_.num_frames) * config_.hidden_size);
      cpu::SinCos1DEmbedding(temp_embed_.data(), config_.num_frames, config_.hidden_size);
    }
  }
}

std::vector<FixedTensor> DiT::fixed_tensors() const {
  if (!shard_.first_stage()) return {};
  std::vector<FixedTensor> fixed = {
      {"pos_embed", {1, config_.tokens(), config_.hidden_size}, pos_embed_.data()}};
  if (config_.video) {
    fixed.push_back(
        {"temp_embed", {1, config_.num_frames, config_.hidden_size}, temp_embed_.data()});
  }
  return fixed;
}

// Initialisation draws every tensor of the whole model in order from one stream, so each
// shard takes the very values one process would have.
template <typename Fill>
void DiT::InitializeGlobal(Fill&& fill) {
  Buffer<float> whole(global_table_.total());
  for (const TensorSpec& t : global_table_.tensors())
    fill(t, whole.data() + t.offset);
  ScatterFromGlobal(whole.data(), params_.data());
}

void DiT::InitializeReference(uint64_t seed) {
  Rng rng(seed, RngStream::kInit);
  // Every bias, adaLN and the final linear start at zero (the buffer starts zeroed).
  InitializeGlobal([&](const TensorSpec& t, float* w) {
    if (t.shape.size() < 2) return;
    const int64_t fan_out = t.shape[0], fan_in = static_cast<int64_t>(t.numel) / fan_out;
    const bool zero_init = t.name.find("adaLN_modulation") != std::string::npos ||
                           t.name == "final_layer.linear.weight";
    if (t.name == "y_embedder.embedding_table.weight" || t.name == "t_embedder.mlp.0.weight" ||
        t.name == "t_embedder.mlp.2.weight") {
      Normal(w, t.numel, 0.02, rng);
    } else if (!zero_init) {
      XavierUniform(w, fan_out, fan_in, rng);
    }
  });
}

void DiT::InitializeRandom(uint64_t seed) {
  Rng rng(seed, RngStream::kInit);
  InitializeGlobal([&](const TensorSpec& t, float* w) {
    if (t.shape.size() >= 2) {
      XavierUniform(w, t.shape[0], static_cast<int64_t>(t.numel) / t.shape[0], rng);
    } else {
      Normal(w, t.numel, 0.1, rng);
    }
  });
}

size_t DiT::ActivationBytes(const DiTConfig& c, const DiTShard& s, int B, int slots,
                            bool recompute) {
  size_t slot = 0, scratch = 0;
  Acts acts{};
  Scratch sc{};
  auto count = [](size_t& total) {
    return [&total](const std::string&, const std::vector<int64_t>& shape, float*&) {
      size_t n = 1;
      for (int64_t d : shape)
        n *= static_cast<size_t>(d);
      total += n;
    };
  };
  VisitActivations(c, s, B, recompute, acts, count(slot));
  VisitScratch(c, s, B, recompute, sc, count(scratch));
  return (slot * static_cast<size_t>(slots) + scratch) * sizeof(float);
}

void DiT::Reserve(int B, int slots, bool recompute) {
  DT_CHECK(B > 0 && slots > 0, "micro-batch {} and slots {} must be positive", B, slots);
  if (B == batch_ && slots == static_cast<int>(acts_.size()) && recompute == recompute_) return;
  TensorTable slot_layout, scratch_layout;
  Acts unused{};
  Scratch unused_scratch{};
  auto add = [](TensorTable& t) {
    return [&t](const std::string& name, std::vector<int64_t> shape, float*&) {
      t.Add(name, std::move(shape));
    };
  };
  VisitActivations(config_, shard_, B, recompute, unused, add(slot_layout));
  VisitScratch(config_, shard_, B, recompute, unused_scratch, add(scratch_layout));
  act_buffer_ = Buffer<float>(slot_layout.total() * slots + scratch_layout.total());
  acts_.assign(slots, Acts{});
  y_.assign(slots, {});
  auto bind = [](const TensorTable& t, float* base) {
    return [&t, base](const std::string& name, const std::vector<int64_t>&, float*& member) {
      member = base + t.Find(name)->offset;
    };
  };
  VisitScratch(config_, shard_, B, recompute, scratch_,
               bind(scratch_layout, act_buffer_.data() + slot_layout.total() * slots));
  if (shard_.cp == 1) {  // one rank's sequence is the whole sequence
    scratch_.d_kv = scratch_.d_qkv;
    scratch_.d_final_full = scratch_.d_final_out;
    if (!config_.video) scratch_.block.kv = scratch_.block.qkv;
  }
  for (int i = 0; i < slots; ++i) {
    Acts& a = acts_[i];
    VisitActivations(config_, shard_, B, recompute, a,
                     bind(slot_layout, act_buffer_.data() + slot_layout.total() * i));
    for (BlockActs& k : a.blocks) {
      if (recompute) {  // the block's input is the slot's; the rest is the shared workspace
        float* input = k.resid_in;
        k = scratch_.block;
        k.resid_in = input;
      } else if (shard_.cp == 1 && !config_.video) {
        k.kv = k.qkv;
      }
    }
    if (shard_.cp == 1) a.final_full = a.final_out;
  }
  batch_ = B;
  recompute_ = recompute;
}

size_t DiT::boundary_elements() const {
  const Dims d(config_, shard_, batch_);
  return size_t(d.N) * d.D + size_t(d.B) * d.D;
}

Status DiT::Forward(int slot, const float* x, const float* t, const int32_t* y, const float* input,
                    float* output) {
  DT_CHECK(slot >= 0 && slot < static_cast<int>(acts_.size()), "slot {} of {}", slot, acts_.size());
  Acts& a = acts_[slot];
  Scratch& s = scratch_;
  const DiTConfig& c = config_;
  const Dims d(c, shard_, batch_);
  const int B = d.B, D = d.D, N = d.N, p = c.patch_size;
  float* x_tokens = a.blocks.front().resid_in;

  if (shard_.first_stage()) {
    if (c.has_labels()) {
      for (int b = 0; b < B; ++b) {
        DT_CHECK(y[b] >= 0 && y[b] < c.label_rows(), "label {} out of range [0, {})", y[b],
                 c.label_rows());
      }
      y_[slot].assign(y, y + B);
    }
    // Patch embed (a Linear over flattened patches) plus the fixed position embedding, for
    // this rank's tokens of the sequence (of every frame).
    cpu::Patchify(s.patches_full, x, d.BF, c.in_channels, d.S, d.S, p);
    KeepTokens(a.patches, s.patches_full, d.BF, d.T, d.Tl, d.F, shard_.cp_rank);
    cpu::LinearForward(x_tokens, a.patches, P(p_.x_w), P(p_.x_b), N, d.F, D);
    const float* pos0 = pos_embed_.data() + size_t(shard_.cp_rank) * d.Tl * D;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* pos = pos0 + static_cast<size_t>(n % d.Tl) * D;
      for (int i = 0; i < D; ++i)
        x_tokens[static_cast<size_t>(n) * D + i] += pos[i];
    }
    // Conditioning c = t_embedder(t) + y_embedder(y), one per sample (Latte repeats it for
    // every frame and token: the same values); every adaLN reads SiLU(c).
    cpu::TimestepFrequencies(a.tfreq, t, B, kFrequencyDim);
    cpu::LinearForward(a.t_hidden, a.tfreq, P(p_.t1_w), P(p_.t1_b), B, kFrequencyDim, D);
    cpu::SiluForward(a.t_act, a.t_hidden, size_t(B) * D);
    cpu::LinearForward(a.t_emb, a.t_act, P(p_.t2_w), P(p_.t2_b), B, D, D);
    std::memcpy(a.c, a.t_emb, size_t(B) * D * sizeof(float));
    if (c.has_labels()) {
      cpu::EmbeddingForward(a.y_emb, P(p_.y_table), y, B, D);
      for (int i = 0; i < B * D; ++i)
        a.c[i] += a.y_emb[i];
    }
  } else {
    // The previous stage's boundary: hidden tokens, then the conditioning.
    std::memcpy(x_tokens, input, size_t(N) * D * sizeof(float));
    std::memcpy(a.c, input + size_t(N) * D, size_t(B) * D * sizeof(float));
  }
  cpu::SiluForward(a.silu_c, a.c, size_t(B) * D);

  for (size_t i = 0; i < a.blocks.size(); ++i)
    DT_RETURN_IF_ERROR(BlockForward(static_cast<int>(i), a));

  if (!shard_.last_stage()) {
    std::memcpy(output, a.resid_out, size_t(N) * D * sizeof(float));
    std::memcpy(output + size_t(N) * D, a.c, size_t(B) * D * sizeof(float));
    return Status::Ok();
  }
  // Final layer: modulate(norm(x), shift, scale) → Linear → (gather the sequence) →
  // unpatchify.
  cpu::LinearForward(a.ada_f, a.silu_c, P(p_.fada_w), P(p_.fada_b), B, D, 2 * D);
  cpu::LayerNormForward(a.lnf, a.meanf, a.rstdf, a.resid_out, N, D, kLayerNormEps);
  cpu::ModulateForward(a.modf, a.lnf, a.ada_f, a.ada_f + D, 2 * D, B, d.P, D);
  cpu::LinearForward(a.final_out, a.modf, P(p_.flin_w), P(p_.flin_b), N, D, d.Fo);
  DT_RETURN_IF_ERROR(GatherSequenceSplitGrad::Forward(comms_.cp, a.final_out, a.final_full,
                                                      {d.BF, d.Tl, d.Fo}, s.sequence)
                         .WithContext("final layer"));
  cpu::UnpatchifyForward(a.out, a.final_full, d.BF, c.out_channels(), d.S, d.S, p);
  return Status::Ok();
}

Status DiT::BlockForward(int i, Acts& a) {
  const DiTBlockParams& o = p_.blocks[i];
  BlockActs& k = a.blocks[i];
  float* resid_out =
      i + 1 < static_cast<int>(a.blocks.size()) ? a.blocks[i + 1].resid_in : a.resid_out;
  const Dims d(config_, shard_, batch_);
  const int B = d.B, D = d.D, N = d.N, Ts = d.P;  // a sample's tokens, every frame's
  const size_t ND = size_t(N) * D;
  // adaLN: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunks of 6D.
  cpu::LinearForward(k.ada, a.silu_c, P(o.ada_w), P(o.ada_b), B, D, 6 * D);
  // x = x + gate_msa · attn(modulate(norm1(x), shift_msa, scale_msa)); this rank's heads.
  cpu::LayerNormForward(k.ln1, k.mean1, k.rstd1, k.resid_in, N, D, kLayerNormEps);
  cpu::ModulateForward(k.mod1, k.ln1, k.ada, k.ada + D, 6 * D, B, Ts, D);
  DT_RETURN_IF_ERROR(CopyToTensorParallel::Forward(comms_.tp, k.mod1, ND));
  cpu::LinearForward(k.qkv, k.mod1, P(o.qkv_w), P(o.qkv_b), N, D, 3 * d.Dl);
  if (config_.temporal_block(shard_.first_block + i)) {
    // Across frames: every token of this rank is a sequence of Fr frames.
    SwapAxes(k.kv, k.qkv, B, d.Fr, d.Tl, 3 * d.Dl);
    cpu::AttentionForward(scratch_.t_attn, k.probs, k.kv, k.kv, B * d.Tl, d.Fr, d.Fr, d.Dl, d.Hl);
    SwapAxes(k.attn, scratch_.t_attn, B, d.Tl, d.Fr, d.Dl);
  } else {
    // Within a frame: the frame's whole sequence of keys and values.
    float* kv = shard_.cp > 1 ? k.kv : k.qkv;
    DT_RETURN_IF_ERROR(
        GatherSequence::Forward(comms_.cp, k.qkv, kv, {d.BF, d.Tl, 3 * d.Dl}, scratch_.sequence)
            .WithContext("attention keys and values"));
    cpu::AttentionForward(k.attn, k.probs, k.qkv, kv, d.BF, d.Tl, d.T, d.Dl, d.Hl);
  }
  cpu::LinearForward<float>(k.proj, k.attn, P(o.proj_w), nullptr, N, d.Dl, D);
  DT_RETURN_IF_ERROR(
      ReduceFromTensorParallel::Forward(comms_.tp, k.proj, ND).WithContext("attention output"));
  AddBias(k.proj, P(o.proj_b), N, D);
  cpu::GatedResidualForward(k.mid, k.resid_in, k.proj, k.ada + 2 * D, 6 * D, B, Ts, D);
  // x = x + gate_mlp · mlp(modulate(norm2(x), shift_mlp, scale_mlp)); this rank's columns.
  cpu::LayerNormForward(k.ln2, k.mean2, k.rstd2, k.mid, N, D, kLayerNormEps);
  cpu::ModulateForward(k.mod2, k.ln2, k.ada + 3 * D, k.ada + 4 * D, 6 * D, B, Ts, D);
  DT_RETURN_IF_ERROR(CopyToTensorParallel::Forward(comms_.tp, k.mod2, ND));
  cpu::LinearForward(k.fc1, k.mod2, P(o.fc1_w), P(o.fc1_b), N, D, d.Ml);
  cpu::GeluForward(k.gelu, k.fc1, size_t(N) * d.Ml);
  cpu::LinearForward<float>(k.fc2, k.gelu, P(o.fc2_w), nullptr, N, d.Ml, D);
  DT_RETURN_IF_ERROR(
      ReduceFromTensorParallel::Forward(comms_.tp, k.fc2, ND).WithContext("MLP output"));
  AddBias(k.fc2, P(o.fc2_b), N, D);
  cpu::GatedResidualForward(resid_out, k.mid, k.fc2, k.ada + 5 * D, 6 * D, B, Ts, D);
  // Latte adds the fixed temporal embedding once, to the first temporal block's input.
  if (config_.video && shard_.first_block + i == 0) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int f = 0; f < d.Fr; ++f) {
        float* x = resid_out + (size_t(b) * d.Fr + f) * d.Tl * D;
        const float* e = temp_embed_.data() + size_t(f) * D;
        for (int n = 0; n < d.Tl; ++n)
          for (int j = 0; j < D; ++j)
            x[size_t(n) * D + j] += e[j];
      }
    }
  }
  return Status::Ok();
}

Status DiT::Backward(int slot, const float* output_grad, float* input_grad,
                     const GradientsReady& ready) {
  DT_CHECK(grads_.size() > 0, "a DiT made for inference has no gradients");
  auto report = [&](size_t from) {
    if (ready) ready(from);
  };
  DT_CHECK(slot >= 0 && slot < static_cast<int>(acts_.size()), "Backward of slot {} of {}", slot,
           acts_.size());
  Acts& a = acts_[slot];
  Scratch& s = scratch_;
  const DiTConfig& c = config_;
  const Dims d(c, shard_, batch_);
  const int B = d.B, D = d.D, N = d.N, p = c.patch_size;
  const size_t ND = size_t(N) * D;

  Zero(s.d_silu_c, size_t(B) * D);
  if (shard_.last_stage()) {
    // Final layer, in reverse. Every context-parallel rank holds the whole output gradient
    // and keeps its own tokens.
    Zero(s.d_final_full, size_t(d.BF) * d.T * d.Fo);
    cpu::UnpatchifyBackward(s.d_final_full, output_grad, d.BF, c.out_channels(), d.S, d.S, p);
    if (s.d_final_out != s.d_final_full) {
      Zero(s.d_final_out, size_t(N) * d.Fo);
      GatherSequenceSplitGrad::Backward(comms_.cp, s.d_final_full, s.d_final_out,
                                        {d.BF, d.Tl, d.Fo});
    }
    Zero(s.d_a, ND);
    cpu::LinearBackward(s.d_a, G(p_.flin_w), G(p_.flin_b), s.d_final_out, a.modf, P(p_.flin_w), N,
                        D, d.Fo);
    Zero(s.d_b, ND);
    Zero(s.d_ada, size_t(B) * 2 * D);
    cpu::ModulateBackward(s.d_b, s.d_ada, s.d_ada + D, s.d_a, a.lnf, a.ada_f + D, 2 * D, B, d.P, D);
    cpu::LinearBackward(s.d_silu_c, G(p_.fada_w), G(p_.fada_b), s.d_ada, a.silu_c, P(p_.fada_w), B,
                        D, 2 * D);
    Zero(s.d_resid, ND);
    cpu::LayerNormBackward(s.d_resid, s.d_b, a.resid_out, a.meanf, a.rstdf, N, D);
    report(p_.fada_w);  // the final layer's parameters sit at the end of the arena
  } else {
    std::memcpy(s.d_resid, output_grad, ND * sizeof(float));
  }

  // Blocks, last to first. d_resid holds the residual-stream gradient throughout: the gated
  // residuals pass it through unchanged and the LayerNorms add their branch into it.
  // With recomputation the workspace holds another block's activations: run this block's
  // forward again first. Its output is rewritten with the value backward already consumed.
  for (int i = static_cast<int>(a.blocks.size()) - 1; i >= 0; --i) {
    if (recompute_) DT_RETURN_IF_ERROR(BlockForward(i, a).WithContext("recomputing a block"));
    DT_RETURN_IF_ERROR(BlockBackward(i, a));
    report(p_.blocks[i].qkv_w);  // the block's first tensor
  }

  // Conditioning: the gradient of c from this stage's adaLNs, plus the later stages'.
  Zero(s.d_c, size_t(B) * D);
  cpu::SiluBackward(s.d_c, s.d_silu_c, a.c, size_t(B) * D);
  if (!shard_.last_stage()) {
    const float* later = output_grad + ND;
    for (int i = 0; i < B * D; ++i)
      s.d_c[i] += later[i];
  }
  if (!shard_.first_stage()) {
    std::memcpy(input_grad, s.d_resid, ND * sizeof(float));
    std::memcpy(input_grad + ND, s.d_c, size_t(B) * D * sizeof(float));
    report(0);
    return Status::Ok();
  }
  // Patch embed (the position embedding is fixed; the input is data: no input gradient).
  cpu::LinearBackward<float>(nullptr, G(p_.x_w), G(p_.x_b), s.d_resid, a.patches, P(p_.x_w), N, d.F,
                             D);
  // c = t_emb (+ y_emb).
  if (c.has_labels() && G(p_.y_table) != nullptr) {
    cpu::EmbeddingBackward(G(p_.y_table), s.d_c, y_[slot].data(), B, D);
  }
  Zero(s.d_t1, size_t(B) * D);
  cpu::LinearBackward(s.d_t1, G(p_.t2_w), G(p_.t2_b), s.d_c, a.t_act, P(p_.t2_w), B, D, D);
  Zero(s.d_t2, size_t(B) * D);
  cpu::SiluBackward(s.d_t2, s.d_t1, a.t_hidden, size_t(B) * D);
  cpu::LinearBackward<float>(nullptr, G(p_.t1_w), G(p_.t1_b), s.d_t2, a.tfreq, P(p_.t1_w), B,
                             kFrequencyDim, D);
  report(0);
  return Status::Ok();
}

Status DiT::BlockBackward(int i, Acts& a) {
  const DiTBlockParams& o = p_.blocks[i];
  BlockActs& k = a.blocks[i];
  Scratch& s = scratch_;
  const Dims d(config_, shard_, batch_);
  const int B = d.B, D = d.D, N = d.N, Ts = d.P, Ml = d.Ml, Dl = d.Dl;
  const size_t ND = size_t(N) * D;
  Zero(s.d_ada, size_t(B) * 6 * D);
  // MLP branch.
  Zero(s.d_a, ND);
  cpu::GatedResidualBackward<float>(nullptr, s.d_a, s.d_ada + 5 * D, s.d_resid, k.fc2,
                                    k.ada + 5 * D, 6 * D, B, Ts, D);
  DT_RETURN_IF_ERROR(ReduceFromTensorParallel::Backward(comms_.tp, s.d_a, ND));
  Zero(s.d_h1, size_t(N) * Ml);
  cpu::LinearBackward(s.d_h1, G(o.fc2_w), G(o.fc2_b), s.d_a, k.gelu, P(o.fc2_w), N, Ml, D);
  Zero(s.d_h2, size_t(N) * Ml);
  cpu::GeluBackward(s.d_h2, s.d_h1, k.fc1, size_t(N) * Ml);
  Zero(s.d_a, ND);
  cpu::LinearBackward(s.d_a, G(o.fc1_w), G(o.fc1_b), s.d_h2, k.mod2, P(o.fc1_w), N, D, Ml);
  DT_RETURN_IF_ERROR(
      CopyToTensorParallel::Backward(comms_.tp, s.d_a, ND).WithContext("MLP input gradient"));
  Zero(s.d_b, ND);
  cpu::ModulateBackward(s.d_b, s.d_ada + 3 * D, s.d_ada + 4 * D, s.d_a, k.ln2, k.ada + 4 * D, 6 * D,
                        B, Ts, D);
  cpu::LayerNormBackward(s.d_resid, s.d_b, k.mid, k.mean2, k.rstd2, N, D);
  // Attention branch.
  Zero(s.d_a, ND);
  cpu::GatedResidualBackward<float>(nullptr, s.d_a, s.d_ada + 2 * D, s.d_resid, k.proj,
                                    k.ada + 2 * D, 6 * D, B, Ts, D);
  DT_RETURN_IF_ERROR(ReduceFromTensorParallel::Backward(comms_.tp, s.d_a, ND));
  Zero(s.d_b, size_t(N) * Dl);
  cpu::LinearBackward(s.d_b, G(o.proj_w), G(o.proj_b), s.d_a, k.attn, P(o.proj_w), N, Dl, D);
  if (config_.temporal_block(shard_.first_block + i)) {
    SwapAxes(s.t_attn, s.d_b, B, d.Fr, d.Tl, Dl);  // the attention output's gradient
    Zero(s.t_dqkv, size_t(N) * 3 * Dl);
    cpu::AttentionBackward(s.t_dqkv, s.t_dqkv, s.t_attn, k.kv, k.kv, k.probs, B * d.Tl, d.Fr, d.Fr,
                           Dl, d.Hl);
    SwapAxes(s.d_qkv, s.t_dqkv, B, d.Tl, d.Fr, 3 * Dl);
  } else {
    const float* kv = shard_.cp > 1 ? k.kv : k.qkv;
    Zero(s.d_qkv, size_t(N) * 3 * Dl);
    if (s.d_kv != s.d_qkv) Zero(s.d_kv, size_t(d.BF) * d.T * 3 * Dl);
    cpu::AttentionBackward(s.d_qkv, s.d_kv, s.d_b, k.qkv, kv, k.probs, d.BF, d.Tl, d.T, Dl, d.Hl);
    DT_RETURN_IF_ERROR(
        GatherSequence::Backward(comms_.cp, s.d_kv, s.d_qkv, {d.BF, d.Tl, 3 * Dl}, s.sequence)
            .WithContext("attention key and value gradients"));
  }
  Zero(s.d_a, ND);
  cpu::LinearBackward(s.d_a, G(o.qkv_w), G(o.qkv_b), s.d_qkv, k.mod1, P(o.qkv_w), N, D, 3 * Dl);
  DT_RETURN_IF_ERROR(
      CopyToTensorParallel::Backward(comms_.tp, s.d_a, ND).WithContext("attention input gradient"));
  Zero(s.d_b, ND);
  cpu::ModulateBackward(s.d_b, s.d_ada, s.d_ada + D, s.d_a, k.ln1, k.ada + D, 6 * D, B, Ts, D);
  cpu::LayerNormBackward(s.d_resid, s.d_b, k.resid_in, k.mean1, k.rstd1, N, D);
  // adaLN of this block.
  cpu::LinearBackward(s.d_silu_c, G(o.ada_w), G(o.ada_b), s.d_ada, a.silu_c, P(o.ada_w), B, D,
                      6 * D);
  return Status::Ok();
}

const float* DiT::Forward(const float* x, const float* t, const int32_t* y, int B) {
  Reserve(B, std::max<int>(1, static_cast<int>(acts_.size())), recompute_);
  Status s = Forward(0, x, t, y, nullptr, nullptr);
  DT_CHECK(s.ok(), "{}", s.message());
  return output(0);
}

void DiT::Backward(const float* dout, const GradientsReady& ready) {
  DT_CHECK(batch_ > 0, "Backward called before Forward");
  Status s = Backward(0, dout, nullptr, ready);
  DT_CHECK(s.ok(), "{}", s.message());
}

}  // namespace difftrain
