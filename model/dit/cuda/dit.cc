#include "model/dit/cuda/dit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "model/cpu/embed.h"
#include "model/cuda/activation.h"
#include "model/cuda/embed.h"
#include "model/cuda/loss.h"
#include "model/cuda/modulate.h"
#include "model/dit/shard.h"

namespace difftrain::cuda {
namespace {

constexpr size_t kAlignment = 256;  // bytes; every activation starts on this boundary

// Hands out aligned pieces of an arena at `base`; with a null base it only counts, so the
// same sequence of Take calls first sizes the arena and then binds it.
class ArenaCursor {
 public:
  explicit ArenaCursor(unsigned char* base) : base_(base) {}
  template <typename T>
  void Take(T*& member, size_t n) {
    offset_ = (offset_ + kAlignment - 1) / kAlignment * kAlignment;
    member = base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += n * sizeof(T);
  }
  size_t bytes() const { return offset_; }

 private:
  unsigned char* base_;
  size_t offset_ = 0;
};

}  // namespace

DiT::DiT(const DiTConfig& config, cudaStream_t stream, Options options)
    : config_(config),
      stream_(stream),
      options_(options),
      table_(ShardParameters(config, DiTShard::Whole(config)).table),
      gemm_(stream),
      state_(table_.total(), stream),
      graph_(stream, options.use_graph) {
  const Status supported = Supports(config_);
  DT_CHECK(supported.ok(), "{}", supported.message());
  DT_CHECK(!options_.vb_loss || config_.learn_sigma, "the vb loss needs a learn_sigma model");
  if (!options_.gemm_autotune) gemm_.set_autotune(false);  // (on unless the environment says)
  const AttentionChoice attention = ChooseAttention(config_, options_);
  spatial_attention_ = attention.spatial;
  temporal_attention_ = attention.temporal;
  p_ = DiTParams::Bind(table_, DiTShard::Whole(config_));
  if (options_.fp8)
    fp8_ = std::make_unique<Fp8Linears>(Fp8InFeatures(config_),
                                        Fp8Recipe{options_.fp8_amax_history, options_.fp8_margin});

  const size_t T = config_.tokens(), D = config_.hidden_size;
  std::vector<float> pos(T * D);
  cpu::SinCos2DPositionEmbedding(pos.data(), config_.grid(), config_.hidden_size);
  pos_embed_ = DeviceBuffer<float>(pos.size());
  pos_embed_.Upload(pos);
  if (config_.video) {
    // Latte's temporal embedding, frame f's row repeated for each of its T tokens, so that
    // adding it is AddPositionEmbedding over a video's F·T tokens.
    const int F = config_.num_frames;
    std::vector<float> temp(size_t(F) * D), full(size_t(F) * T * D);
    cpu::SinCos1DEmbedding(temp.data(), F, config_.hidden_size);
    for (int f = 0; f < F; ++f)
      for (size_t t = 0; t < T; ++t)
        std::copy_n(temp.data() + f * D, D, full.data() + (f * T + t) * D);
    temp_embed_ = DeviceBuffer<float>(full.size());
    temp_embed_.Upload(full);
  }

  // What a step's first micro-batch zeroes itself.
  const std::vector<uint64_t> ranges = FirstMicroBatchZeroes(table_, p_);
  zero_range_count_ = static_cast<int>(ranges.size() / 2);
  for (size_t r = 1; r < ranges.size(); r += 2)
    longest_zero_range_ = std::max<size_t>(longest_zero_range_, ranges[r]);
  if (!ranges.empty()) {
    zero_ranges_ = DeviceBuffer<uint64_t>(ranges.size());
    zero_ranges_.Upload(ranges);
  }
}

std::vector<uint64_t> DiT::FirstMicroBatchZeroes(const TensorTable& table, const DiTParams& p) {
  const std::vector<size_t> gemm_weights = GemmWeights(p);
  std::vector<uint64_t> ranges;
  for (const TensorSpec& t : table.tensors()) {
    if (std::find(gemm_weights.begin(), gemm_weights.end(), t.offset) != gemm_weights.end()) {
      continue;
    }
    if (!ranges.empty() && ranges[ranges.size() - 2] + ranges.back() == t.offset) {
      ranges.back() += t.numel;  // adjacent to the run before: one range
    } else {
      ranges.push_back(t.offset);
      ranges.push_back(t.numel);
    }
  }
  return ranges;
}

std::vector<size_t> DiT::GemmWeights(const DiTParams& p) {
  std::vector<size_t> w = {p.x_w, p.t1_w, p.t2_w, p.fada_w, p.flin_w};
  for (const DiTBlockParams& o : p.blocks) {
    for (const size_t b : {o.ada_w, o.qkv_w, o.proj_w, o.fc1_w, o.fc2_w})
      w.push_back(b);
  }
  return w;
}

void DiT::MaterializeZeroGradients() {
  if (!overwrite_pending_) return;
  state_.ZeroGradients();
  overwrite_pending_ = false;
}

std::vector<float> DiT::DownloadGradients() const {
  if (overwrite_pending_) return std::vector<float>(table_.total(), 0.0f);
  return state_.DownloadGradients();
}

float* DiT::gradients() {
  MaterializeZeroGradients();
  return state_.gradients();
}

Status DiT::Supports(const DiTConfig& c) {
  DT_RETURN_IF_ERROR(c.Validate());
  const int p2 = c.patch_size * c.patch_size;
  const std::pair<const char*, int> sizes[] = {
      {"hidden_size", c.hidden_size},
      {"the MLP width", c.mlp_hidden()},
      {"in_channels × patch_size²", c.patch_features()},
      {"out_channels × patch_size²", p2 * c.out_channels()}};
  for (const auto& [what, size] : sizes) {
    if (size % 8 != 0) {
      return Errorf(
          "the CUDA backend needs {} to be a multiple of 8 (16-byte aligned bf16 GEMMs), "
          "found {}",
          what, size);
    }
  }
  if (c.hidden_size > GatedResidualNormMaxWidth()) {
    return Errorf("the CUDA backend's LayerNorm kernels take hidden sizes up to {}, found {}",
                  GatedResidualNormMaxWidth(), c.hidden_size);
  }
  const int head_dim = c.hidden_size / c.num_heads;
  if (head_dim % 8 != 0 || head_dim > 128) {
    return Errorf(
        "the CUDA backend's attention takes head dimensions that are multiples of 8 up "
        "to 128, found hidden_size / num_heads = {}",
        head_dim);
  }
  const ShardedParameters whole = ShardParameters(c, DiTShard::Whole(c));
  for (const TensorSpec& t : whole.table.tensors()) {
    if (t.offset % 8 != 0) {
      return Errorf("the CUDA backend needs every weight 16-byte aligned: {} starts at element {}",
                    t.name, t.offset);
    }
  }
  return Status::Ok();
}

void DiT::UploadState(const float* params, const float* ema, const float* exp_avg,
                      const float* exp_avg_sq) {
  DT_CHECK(batch_ > 0, "UploadState before a successful Reserve");
  state_.Upload(params, ema, exp_avg, exp_avg_sq);  // zeroes the gradients
  overwrite_pending_ = false;
}

void DiT::DownloadState(float* params, float* ema, float* exp_avg, float* exp_avg_sq) const {
  DT_CHECK(batch_ > 0, "DownloadState before a successful Reserve");
  state_.Download(params, ema, exp_avg, exp_avg_sq);
}

size_t DiT::device_bytes() const {
  return state_.bytes() + pos_embed_.bytes() + temp_embed_.bytes() + acts_buffer_.bytes() +
         (cudnn_ != nullptr ? cudnn_->workspace_bytes() : 0);  // (fp8_'s scaling state: KiBs)
}

size_t DiT::StateBytes(const DiTConfig& config) {
  const size_t embeds = size_t(config.tokens()) * config.hidden_size * sizeof(float) *
                        (1 + (config.video ? config.num_frames : 0));
  return TrainState::BytesFor(ShardParameters(config, DiTShard::Whole(config)).table.total()) +
         embeds;
}

size_t DiT::ActivationBytes(const DiTConfig& config, int B, const Options& options) {
  DiTActivations counted;
  return BindActivations(config, ChooseAttention(config, options), options.fp8, nullptr, B,
                         counted);
}

size_t DiT::ActivationBytes(const DiTConfig& config, int B) {
  return ActivationBytes(config, B, Options{});
}

size_t DiT::BindActivations(const DiTConfig& c, AttentionChoice attention, bool fp8,
                            unsigned char* base, int B, DiTActivations& acts) {
  // A sample is BF/B frames (1 for an image) of T tokens each.
  const int Fr = c.frames(), BF = B * Fr;
  const size_t T = c.tokens(), D = c.hidden_size, N = BF * T, M = c.mlp_hidden();
  const size_t image = size_t(Fr) * c.in_channels * c.input_size * c.input_size;
  const size_t out_image = size_t(Fr) * c.out_channels() * c.input_size * c.input_size;
  const size_t Fo = size_t(c.patch_size) * c.patch_size * c.out_channels();
  // Attention's log-sum-exp: a row per head and token, spatial and temporal blocks alike.
  const size_t rows = N * c.num_heads;
  ArenaCursor a(base);
  a.Take(acts.in_x_, B * image);
  a.Take(acts.in_t_, B);
  a.Take(acts.in_y_, B);
  a.Take(acts.in_target_, B * image);
  a.Take(acts.in_x0_, B * image);
  a.Take(acts.in_samples_, BF);  // the loss's samples are frames
  a.Take(acts.loss_workspace_, DiffusionLossWorkspace(BF));
  a.Take(acts.patches_, N * c.patch_features());
  a.Take(acts.tfreq_, size_t(B) * kFrequencyDim);
  a.Take(acts.t_hidden_, B * D);
  a.Take(acts.t_act_, B * D);
  a.Take(acts.t_emb_, B * D);
  a.Take(acts.c_, B * D);
  a.Take(acts.silu_c_, B * D);
  acts.acts_.resize(c.depth);
  for (int l = 0; l < c.depth; ++l) {
    BlockActs& k = acts.acts_[l];
    a.Take(k.resid_in, N * D);
    a.Take(k.ada, B * 6 * D);
    a.Take(k.mean1, N);
    a.Take(k.rstd1, N);
    a.Take(k.mod1, N * D);
    a.Take(k.qkv, N * 3 * D);
    a.Take(k.attn, N * D);
    a.Take(k.lse, rows);
    a.Take(k.proj, N * D);
    a.Take(k.mid, N * D);
    a.Take(k.mean2, N);
    a.Take(k.rstd2, N);
    a.Take(k.mod2, N * D);
    a.Take(k.fc1_pre, N * M);
    a.Take(k.gelu, N * M);
    a.Take(k.fc2, N * D);
    // A temporal block's attention runs token-major: its qkv and output in that order (the
    // flash kernels read the frame-major tensors in place instead).
    k.qkv_t = k.attn_t = nullptr;
    if (c.temporal_block(l) && attention.temporal != AttentionKernels::kFlash) {
      a.Take(k.qkv_t, N * 3 * D);
      a.Take(k.attn_t, N * D);
    }
  }
  a.Take(acts.resid_out_, N * D);
  a.Take(acts.ada_f_, B * 2 * D);
  a.Take(acts.meanf_, N);
  a.Take(acts.rstdf_, N);
  a.Take(acts.modf_, N * D);
  a.Take(acts.final_out_, N * Fo);
  a.Take(acts.out_, B * out_image);
  a.Take(acts.loss_, 1);
  // Backward scratch, shared by every block.
  a.Take(acts.d_out_, B * out_image);
  a.Take(acts.d_final_, N * Fo);
  a.Take(acts.d_final_bf16_, N * Fo);
  a.Take(acts.d_resid_, N * D);
  a.Take(acts.d_ada_[0], B * 6 * D);
  a.Take(acts.d_ada_[1], B * 6 * D);
  a.Take(acts.d_ada_f_, B * 2 * D);
  a.Take(acts.norm_workspace_, GatedResidualNormWorkspace(B, Fr * T, D));
  a.Take(acts.bias_scratch_, std::max(3 * D, M));  // the widest bias a GEMM's epilogue reduces
  a.Take(acts.d_ada_bf16_, B * 6 * D);
  a.Take(acts.d_small_, B * D);
  a.Take(acts.d_silu_c_, B * D);
  a.Take(acts.d_c_, B * D);
  a.Take(acts.d_c_bf16_, B * D);
  a.Take(acts.d_t_, B * D);
  a.Take(acts.d_a_, N * D);
  a.Take(acts.d_b_, N * D);
  a.Take(acts.d_h_, N * M);
  a.Take(acts.d_qkv_, N * 3 * D);
  // One attention workspace serves both directions of every block, in floats.
  size_t workspace = AttentionWorkspace(c, attention.spatial, attention.flash, BF, T);
  if (c.video) {
    if (attention.temporal != AttentionKernels::kFlash) {
      a.Take(acts.d_attn_t_, N * D);
      a.Take(acts.d_qkv_t_, N * 3 * D);
    }
    // Across frames the backward always recomputes (FlashAttentionBackwardAcrossFrames).
    FlashVariant temporal = attention.flash;
    temporal.stored_scores = false;
    workspace = std::max(workspace, AttentionWorkspace(c, attention.temporal, temporal, B * T, Fr));
  }
  a.Take(acts.attn_workspace_, workspace);
  acts.fp8_workspace_ = nullptr;
  if (fp8) a.Take(acts.fp8_workspace_, Fp8WorkspaceBytes(c, fp8, B));
  return a.bytes();
}

Status DiT::Reserve(int B) {
  DT_CHECK(B > 0, "micro-batch {} must be positive", B);
  if (B == batch_) return Status::Ok();
  DT_RETURN_IF_ERROR(TakesMicroBatch(config_, B, options_));
  if (options_.fp8) DT_RETURN_IF_ERROR(Fp8Supported());
  if (!state_.allocated()) DT_RETURN_IF_ERROR(state_.Allocate());
  graph_.Reset();  // it holds the old activation pointers
  batch_ = 0;
  DT_RETURN_IF_ERROR(PrepareAttention(B));
  acts_buffer_ = DeviceBuffer<unsigned char>();
  Result<DeviceBuffer<unsigned char>> acts =
      DeviceBuffer<unsigned char>::TryAllocate(ActivationBytes(config_, B, options_));
  if (!acts.ok()) {
    return acts.status().WithContext(fmt::format("the activations of a micro-batch of {}", B));
  }
  acts_buffer_ = std::move(acts).value();
  BindActivations(config_, ChooseAttention(config_, options_), options_.fp8, acts_buffer_.data(), B,
                  *this);
  batch_ = B;
  BindFp8();
  UploadUnweightedSamples(in_samples_, size_t(B) * config_.frames(), stream_);
  return Status::Ok();
}

// The per-sample loss weights live in the arena too: they are written again (they are the
// state Reserve leaves, not an activation; poisoning them made the first GPU run's loss NaN).
void DiT::PoisonActivations() {
  DT_CUDA_CHECK(cudaMemsetAsync(acts_buffer_.data(), 0xFF, acts_buffer_.bytes(), stream_));
  UploadUnweightedSamples(in_samples_, size_t(batch_) * config_.frames(), stream_);
}

void DiT::Forward() {
  DT_CHECK(batch_ > 0, "Forward before Reserve");
  const DiTConfig& c = config_;
  const int B = batch_, BF = B * c.frames(), T = c.tokens(), D = c.hidden_size, N = BF * T;
  const int p = c.patch_size;
  // Patch embed (one GEMM over the flattened patches of every frame, fp32 out with its bias)
  // plus the fixed position embedding: the residual stream entering block 0.
  float* x_tokens = acts_.front().resid_in;
  Patchify(patches_, in_x_, BF, c.in_channels, c.input_size, p, stream_);
  gemm_.Forward(x_tokens, patches_, W(p_.x_w), W(p_.x_b), N, c.patch_features(), D,
                Epilogue::kBias);
  AddPositionEmbedding(x_tokens, x_tokens, pos_embed_.data(), BF, T, D, stream_);
  // Conditioning c = t_embedder(t) (+ y_embedder(y)), one per sample; every adaLN reads
  // SiLU(c).
  TimestepFrequencies(tfreq_, in_t_, B, kFrequencyDim, stream_);
  gemm_.Forward(t_hidden_, tfreq_, W(p_.t1_w), W(p_.t1_b), B, kFrequencyDim, D, Epilogue::kBias);
  SiluForward(t_act_, t_hidden_, size_t(B) * D, stream_);
  gemm_.Forward(t_emb_, t_act_, W(p_.t2_w), W(p_.t2_b), B, D, D, Epilogue::kBias);
  if (c.has_labels()) {
    AddLabelEmbedding(c_, t_emb_, Master(p_.y_table), in_y_, B, D, stream_);
  } else {
    DT_CUDA_CHECK(cudaMemcpyAsync(c_, t_emb_, size_t(B) * D * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream_));
  }
  SiluForward(silu_c_, c_, size_t(B) * D, stream_);

  // Block 0's first norm; every later norm runs fused with the gated residual before it, at the
  // end of the block before (BlockForward).
  AdaLNForward(0);
  const NormSite first = FirstNorm(0);
  GatedResidualNormForward(nullptr, first.h, first.mean, first.rstd, first.x, GatedBranch{},
                           nullptr, first.mod, B, N / B, D, stream_);
  for (int l = 0; l < c.depth; ++l)
    BlockForward(l);

  // Final layer: modulate(norm(x), shift, scale) (the last block computed it) → Linear →
  // unpatchify.
  const int Fo = p * p * c.out_channels();
  gemm_.Forward(final_out_, modf_, W(p_.flin_w), W(p_.flin_b), N, D, Fo, Epilogue::kBias);
  Unpatchify(out_, final_out_, BF, c.out_channels(), c.input_size, p, stream_);
}

void DiT::BlockForward(int l) {
  const DiTBlockParams& o = p_.blocks[l];
  BlockActs& k = acts_[l];
  const int B = batch_, Fr = config_.frames(), T = config_.tokens(), D = config_.hidden_size;
  const int Ts = Fr * T, N = B * Ts;  // a sample's tokens, every frame's
  const int M = config_.mlp_hidden(), S = 6 * D;
  // adaLN (k.ada): shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunks of 6D.
  // x = x + gate_msa · proj(attention(qkv(modulate(norm1(x), shift_msa, scale_msa)))), with
  // k.mod1 = modulate(norm1(x), …) computed before.
  LinearForward(l, kQkv, k.qkv, k.mod1, o.qkv_w, o.qkv_b, N, D, 3 * D, Epilogue::kBias);
  BlockAttentionForward(l);
  LinearForward(l, kProj, k.proj, k.attn, o.proj_w, o.proj_b, N, D, D, Epilogue::kBias);
  // The gated residual and norm2 in one pass.
  GatedResidualNormForward(k.mid, k.mod2, k.mean2, k.rstd2, k.resid_in,
                           GatedBranch{k.proj, k.ada, S, 2 * D}, nullptr,
                           Modulation{k.ada, S, 3 * D, 4 * D}, B, Ts, D, stream_);
  // x = x + gate_mlp · fc2(gelu(fc1(modulate(norm2(x), shift_mlp, scale_mlp)))).
  LinearForward(l, kFc1, k.gelu, k.mod2, o.fc1_w, o.fc1_b, N, D, M, Epilogue::kBiasGelu, k.fc1_pre);
  LinearForward(l, kFc2, k.fc2, k.gelu, o.fc2_w, o.fc2_b, N, M, D, Epilogue::kBias);
  // The gated residual and the next layer's first norm in one pass, after that layer's adaLN.
  // Latte: the temporal embedding, once, into the first temporal block's input.
  AdaLNForward(l + 1);
  const NormSite next = FirstNorm(l + 1);
  const float* add = config_.video && l == 0 ? temp_embed_.data() : nullptr;
  GatedResidualNormForward(next.x, next.h, next.mean, next.rstd, k.mid,
                           GatedBranch{k.fc2, k.ada, S, 5 * D}, add, next.mod, B, Ts, D, stream_);
}

DiT::NormSite DiT::FirstNorm(int l) {
  const int D = config_.hidden_size;
  if (l == config_.depth) return {resid_out_, modf_, meanf_, rstdf_, {ada_f_, 2 * D, 0, D}};
  BlockActs& k = acts_[l];
  return {k.resid_in, k.mod1, k.mean1, k.rstd1, {k.ada, 6 * D, 0, D}};
}

void DiT::AdaLNForward(int l) {
  const int B = batch_, D = config_.hidden_size;
  if (l == config_.depth) {
    gemm_.Forward(ada_f_, silu_c_, W(p_.fada_w), W(p_.fada_b), B, D, 2 * D, Epilogue::kBias);
  } else {
    const DiTBlockParams& o = p_.blocks[l];
    gemm_.Forward(acts_[l].ada, silu_c_, W(o.ada_w), W(o.ada_b), B, D, 6 * D, Epilogue::kBias);
  }
}

void DiT::AdaLNBackward(int l) {
  const bool is_final = l == config_.depth;
  const int B = batch_, D = config_.hidden_size, width = (is_final ? 2 : 6) * D;
  const size_t w = is_final ? p_.fada_w : p_.blocks[l].ada_w;
  const size_t b = is_final ? p_.fada_b : p_.blocks[l].ada_b;
  const float* d_ada = DAda(l);
  CastToBf16(d_ada_bf16_, d_ada, size_t(B) * width, stream_);
  WeightGradient(w, d_ada_bf16_, silu_c_, B, D, width);
  BiasGradient(G(b), d_ada, B, width, stream_);
  gemm_.BackwardInput(d_small_, d_ada_bf16_, W(w), B, D, width);
  CastToFloat(d_silu_c_, d_small_, size_t(B) * D, /*accumulate=*/true, stream_);
}

void DiT::NormBackward(int l) {
  const int B = batch_, D = config_.hidden_size, Ts = config_.frames() * config_.tokens();
  const NormSite s = FirstNorm(l);
  GatedBranch branch;
  float* d_gate = nullptr;
  float* d_bias = nullptr;
  if (l > 0) {  // block l − 1's MLP branch: x = mid + gate_mlp · fc2
    const BlockActs& k = acts_[l - 1];
    branch = GatedBranch{k.fc2, k.ada, 6 * D, 5 * D};
    d_gate = DAda(l - 1);
    DT_CUDA_CHECK(cudaMemsetAsync(d_gate, 0, size_t(B) * 6 * D * sizeof(float), stream_));
    d_bias = G(p_.blocks[l - 1].fc2_b);
  }
  GatedResidualNormBackward(d_resid_, DAda(l), d_a_, d_gate, d_bias, d_a_, s.x, s.mean, s.rstd,
                            s.mod, branch, norm_workspace_, B, Ts, D, stream_);
  AdaLNBackward(l);
}

void DiT::Loss() {
  const DiTConfig& c = config_;
  // A video's frames are the loss's samples ([B, F, C, H, W] is [B·F, C, H, W]).
  DiffusionLoss(loss_, d_out_, out_, in_target_, in_x0_, in_x_, in_samples_, batch_ * c.frames(),
                c.out_channels(), c.in_channels, c.input_size * c.input_size, options_.vb_loss,
                grad_scale_, loss_workspace_, stream_);
}

void DiT::Backward() {
  const DiTConfig& c = config_;
  const int B = batch_, BF = B * c.frames(), D = c.hidden_size, N = BF * c.tokens();
  const int p = c.patch_size, Fo = p * p * c.out_channels();
  const size_t BD = size_t(B) * D;

  // Final layer, in reverse.
  DT_CUDA_CHECK(cudaMemsetAsync(d_silu_c_, 0, BD * sizeof(float), stream_));
  UnpatchifyBackward(d_final_, d_out_, BF, c.out_channels(), c.input_size, p, stream_);
  CastToBf16(d_final_bf16_, d_final_, size_t(N) * Fo, stream_);
  WeightGradient(p_.flin_w, d_final_bf16_, modf_, N, D, Fo);
  BiasGradient(G(p_.flin_b), d_final_, N, Fo, stream_);
  gemm_.BackwardInput(d_a_, d_final_bf16_, W(p_.flin_w), N, D, Fo);
  DT_CUDA_CHECK(cudaMemsetAsync(d_resid_, 0, size_t(N) * D * sizeof(float), stream_));
  DT_CUDA_CHECK(cudaMemsetAsync(d_ada_f_, 0, BD * 2 * sizeof(float), stream_));
  NormBackward(c.depth);  // and the last block's MLP gated residual

  // Blocks, last to first; d_resid_ carries the residual stream's gradient throughout.
  for (int l = c.depth - 1; l >= 0; --l)
    BlockBackward(l);

  // Conditioning: c = t_emb + y_emb, t_emb = mlp.2(silu(mlp.0(freq(t)))).
  DT_CUDA_CHECK(cudaMemsetAsync(d_c_, 0, BD * sizeof(float), stream_));
  SiluBackward(d_c_, d_silu_c_, c_, BD, stream_);
  if (c.has_labels()) LabelEmbeddingBackward(G(p_.y_table), d_c_, in_y_, B, D, stream_);
  CastToBf16(d_c_bf16_, d_c_, BD, stream_);
  WeightGradient(p_.t2_w, d_c_bf16_, t_act_, B, D, D);
  BiasGradient(G(p_.t2_b), d_c_, B, D, stream_);
  gemm_.BackwardInput(d_small_, d_c_bf16_, W(p_.t2_w), B, D, D);
  DT_CUDA_CHECK(cudaMemsetAsync(d_t_, 0, BD * sizeof(float), stream_));
  CastToFloat(d_c_, d_small_, BD, /*accumulate=*/false, stream_);  // d_c_ is free: reuse it
  SiluBackward(d_t_, d_c_, t_hidden_, BD, stream_);
  CastToBf16(d_c_bf16_, d_t_, BD, stream_);
  WeightGradient(p_.t1_w, d_c_bf16_, tfreq_, B, kFrequencyDim, D);
  BiasGradient(G(p_.t1_b), d_t_, B, D, stream_);
  // Patch embed: the position embedding is fixed and the input is data.
  CastToBf16(d_a_, d_resid_, size_t(N) * D, stream_);
  WeightGradient(p_.x_w, d_a_, patches_, N, c.patch_features(), D);
  BiasGradient(G(p_.x_b), d_resid_, N, D, stream_);
}

void DiT::BlockBackward(int l) {
  const DiTBlockParams& o = p_.blocks[l];
  BlockActs& k = acts_[l];
  const int B = batch_, Fr = config_.frames(), T = config_.tokens(), D = config_.hidden_size;
  const int Ts = Fr * T, N = B * Ts, M = config_.mlp_hidden(), S = 6 * D;
  float* d_ada = DAda(l);  // zeroed, and holding gate_mlp's gradient, by NormBackward(l + 1)
  // MLP branch: out = mid + gate_mlp · fc2. NormBackward(l + 1) left fc2's output gradient in
  // d_a_ and added its bias gradient; the stream's gradient passes through unchanged.
  // fc2's input gradient times gelu'(fc1's pre-activation), and its column sums (fc1's bias
  // gradient), fused in the epilogue.
  LinearBackward(l, kFc2, o.fc2_w, d_h_, d_a_, k.gelu, N, M, D, k.fc1_pre, G(o.fc1_b));
  LinearBackward(l, kFc1, o.fc1_w, d_a_, d_h_, k.mod2, N, D, M);
  // norm2 and the attention branch's gated residual, mid = x + gate_msa · proj, in one pass:
  // proj's output gradient over norm2's input gradient in d_a_, and proj's bias gradient.
  GatedResidualNormBackward(d_resid_, d_ada, d_a_, d_ada, G(o.proj_b), d_a_, k.mid, k.mean2,
                            k.rstd2, Modulation{k.ada, S, 3 * D, 4 * D},
                            GatedBranch{k.proj, k.ada, S, 2 * D}, norm_workspace_, B, Ts, D,
                            stream_);
  LinearBackward(l, kProj, o.proj_w, d_b_, d_a_, k.attn, N, D, D);
  // qkv's bias gradient from the attention kernels' own column sums, where they make them; in
  // bf16 otherwise from cuBLASLt's epilogue, in FP8 from BiasGradient.
  if (BlockAttentionBackward(l, G(o.qkv_b))) {
    LinearBackward(l, kQkv, o.qkv_w, d_a_, d_qkv_, k.mod1, N, D, 3 * D);
  } else if (fp8_ != nullptr) {
    BiasGradient(G(o.qkv_b), d_qkv_, N, 3 * D, stream_);
    LinearBackward(l, kQkv, o.qkv_w, d_a_, d_qkv_, k.mod1, N, D, 3 * D);
  } else {
    gemm_.BackwardWeightAndBias(G(o.qkv_w), G(o.qkv_b), d_qkv_, k.mod1, N, D, 3 * D, bias_scratch_,
                                /*accumulate=*/!overwrite_);
    gemm_.BackwardInput(d_a_, d_qkv_, W(o.qkv_w), N, D, 3 * D);
  }
  // norm1, fused with the block before's MLP gated residual; then this block's adaLN, whose
  // input SiLU(c) every block shares.
  NormBackward(l);
}

void DiT::ForwardBackward(float grad_scale) {
  DT_CHECK(batch_ > 0, "ForwardBackward before Reserve");
  grad_scale_ = grad_scale;         // Loss reads it; a new value makes graph_ capture again
  overwrite_ = overwrite_pending_;  // Backward reads it (and the graph of each value holds it)
  overwrite_pending_ = false;
  graph_.Run(
      [this] {
        if (overwrite_) {
          ZeroRanges(state_.gradients(), zero_ranges_.data(), zero_range_count_,
                     longest_zero_range_, stream_);
        }
        Forward();
        Loss();
        Backward();
        if (fp8_ != nullptr) fp8_->UpdateScales(stream_);  // delayed scaling's history step
      },
      grad_scale, overwrite_);
}

void DiT::OptimizerStep(double lr, int64_t step, const OptimizerConfig& config) {
  DT_CHECK(step >= 1, "AdamW step {} must be 1-based", step);
  DT_CHECK(batch_ > 0, "OptimizerStep before a successful Reserve");
  MaterializeZeroGradients();  // a step with no micro-batch since ZeroGradients
  state_.OptimizerStep(lr, step, config);
}

float DiT::last_loss() const {
  return ReadLoss(loss_, stream_);
}

}  // namespace difftrain::cuda
