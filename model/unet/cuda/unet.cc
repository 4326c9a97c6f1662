#include "model/unet/cuda/unet.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "model/cuda/activation.h"
#include "model/cuda/attention.h"
#include "model/cuda/cudnn_attention.h"
#include "model/cuda/embed.h"
#include "model/unet/cuda/layers.h"

namespace difftrain::cuda {

// Where a micro-batch's tensors sit in the activation arena (byte offsets): the inputs, the
// time embedding, the values and their gradients, the layers' activations; then the layers'
// shared scratch and the workspaces.
struct UNet::Layout {
  std::vector<size_t> values, grads;  // grads[0] is unused: x_t is data
  size_t grads_begin = 0, grads_end = 0;
  size_t t = 0, context_f32 = 0, context = 0, target = 0, samples = 0, loss = 0, loss_ws = 0;
  size_t tfreq = 0, t1 = 0, t1_silu = 0, temb = 0, temb_silu = 0;
  size_t dtemb_silu = 0, dtemb = 0, dtemb_bf16 = 0, dt1_silu = 0, dt1 = 0, dt1_bf16 = 0;
  size_t temb_scratch = 0, scratch = 0, conv_ws = 0, norm_ws = 0, attn_ws = 0;
  size_t bytes = 0;
};

namespace {

using unet::Space;

size_t Offset(const UNetPlan& plan, const char* name) {
  const TensorSpec* t = plan.table.Find(name);
  DT_CHECK(t != nullptr, "{} is not a UNet parameter", name);
  return t->offset;
}

}  // namespace

// Builds the layers for micro-batch B (layers may be null: only counts) and the layout.
static std::unique_ptr<UNet::Layout> PlanLayout(const UNetConfig& c, const UNetPlan& plan, int B,
                                                const unet::Kernels& kernels,
                                                std::vector<std::unique_ptr<unet::Layer>>* layers) {
  auto l = std::make_unique<UNet::Layout>();
  Space m;
  const size_t E = size_t(B) * c.time_embed_dim(), C0 = c.block_out_channels[0];
  const size_t text = size_t(B) * c.text_length * c.cross_attention_dim;
  const UNetValue& x = plan.values.front();
  const size_t image = size_t(B) * x.C * x.H * x.W;
  l->t = m.Take<float>(B);
  l->context_f32 = m.Take<float>(text);
  l->context = m.Take<bf16>(text);
  l->target = m.Take<float>(image);
  l->samples = m.Take<SampleLoss>(B);
  l->loss = m.Take<float>(1);
  l->loss_ws = m.Take<double>(DiffusionLossWorkspace(B));
  l->tfreq = m.Take<bf16>(size_t(B) * C0);
  l->t1 = m.Take<float>(E);
  l->t1_silu = m.Take<bf16>(E);
  l->temb = m.Take<float>(E);
  l->temb_silu = m.Take<bf16>(E);
  for (const UNetValue& v : plan.values)
    l->values.push_back(m.Take<float>(size_t(B) * v.C * v.H * v.W));
  // The values' gradients and the time embedding's back to back: one memset zeroes them.
  l->grads_begin = m.Take<unsigned char>(0);
  l->grads.push_back(0);
  for (size_t i = 1; i < plan.values.size(); ++i) {
    const UNetValue& v = plan.values[i];
    l->grads.push_back(m.Take<float>(size_t(B) * v.C * v.H * v.W));
  }
  l->dtemb_silu = m.Take<float>(E);
  l->dtemb = m.Take<float>(E);
  l->dt1 = m.Take<float>(E);
  l->grads_end = m.used;
  l->dtemb_bf16 = m.Take<bf16>(E);
  l->dt1_silu = m.Take<float>(E);
  l->dt1_bf16 = m.Take<bf16>(E);
  l->temb_scratch = m.Take<bf16>(E);
  // Each layer's activations follow; its temporaries share one scratch region.
  unet::Workspaces ws;
  size_t scratch = 0;
  for (const UNetNode& node : plan.nodes) {
    Space layer_scratch;
    std::unique_ptr<unet::Layer> layer =
        unet::MakeLayer(c, plan, node, B, m, layer_scratch, ws, kernels);
    scratch = std::max(scratch, layer_scratch.used);
    if (layers != nullptr) layers->push_back(std::move(layer));
  }
  l->scratch = m.Take<unsigned char>(scratch);
  l->conv_ws = m.Take<unsigned char>(ws.conv_bytes);
  l->norm_ws = m.Take<float>(ws.norm_floats);
  l->attn_ws = m.Take<float>(ws.attention_floats);
  l->bytes = m.used;
  return l;
}

Status UNet::Supports(const UNetConfig& c) {
  DT_RETURN_IF_ERROR(c.Validate());
  auto multiple_of_8 = [](const std::string& what, int v) -> Status {
    if (v % 8 == 0) return Status::Ok();
    return Errorf(
        "the CUDA backend needs model.{} to be a multiple of 8 (16-byte aligned bf16 GEMMs), "
        "found {}",
        what, v);
  };
  for (int level = 0; level < c.levels(); ++level) {
    const int C = c.block_out_channels[level];
    DT_RETURN_IF_ERROR(multiple_of_8(fmt::format("block_out_channels[{}]", level), C));
    const int heads = c.heads(level), hd = C / heads;
    if (C % heads != 0 || hd % 8 != 0 || hd > kMaxAttentionHeadDim) {
      return Errorf(
          "the CUDA backend's attention takes head dimensions that are multiples of 8 up to {}: "
          "block_out_channels[{}] = {} over {} heads (attention_head_dim) is {}",
          kMaxAttentionHeadDim, level, C, heads, C / double(heads));
    }
  }
  DT_RETURN_IF_ERROR(multiple_of_8("cross_attention_dim", c.cross_attention_dim));
  // Written for SD 1.x/2.x: one transformer block per transformer, no micro-conditioning.
  for (int depth : c.transformer_layers_per_block) {
    if (depth != 1) {
      return Errorf(
          "the CUDA backend's transformers have one block: model.transformer_layers_per_block "
          "must be 1 (SDXL's [1, 2, 10] trains on the CPU), found {}",
          depth);
    }
  }
  if (c.text_time()) {
    return Status::Error(
        "the CUDA backend has no SDXL micro-conditioning: model.addition_embed_type text_time "
        "trains on the CPU (train.device: cpu)");
  }
  if (c.time_cond_proj_dim > 0) {
    return Status::Error(
        "the CUDA backend has no guidance embedding: model.time_cond_proj_dim must be null");
  }
  if (c.out_channels != c.in_channels) {
    return Errorf(
        "the CUDA backend's loss compares out_channels with the target's in_channels: "
        "model.out_channels {} must equal model.in_channels {}",
        c.out_channels, c.in_channels);
  }
  const UNetPlan plan(c);
  for (const TensorSpec& t : plan.table.tensors()) {
    if (t.offset % 8 != 0) {
      return Errorf("the CUDA backend needs every weight 16-byte aligned: {} starts at element {}",
                    t.name, t.offset);
    }
  }
  return Status::Ok();
}

UNet::UNet(const UNetConfig& config, cudaStream_t stream, Options options)
    : config_(config),
      plan_(config),
      stream_(stream),
      state_(plan_.table.total(), stream),
      gemm_(stream),
      graph_(stream, options.use_graph),
      flash_attention_(options.flash_attention),
      cudnn_(options.cudnn_attention ? std::make_unique<CudnnAttentionSet>() : nullptr) {
  const Status supported = Supports(config_);
  DT_CHECK(supported.ok(), "{}", supported.message());
}

UNet::~UNet() = default;

size_t UNet::cudnn_workspace_bytes() const {
  return cudnn_ != nullptr ? cudnn_->workspace_bytes() : 0;
}

size_t UNet::ActivationBytes(const UNetConfig& config, int B) {
  return ActivationBytes(config, B, Options());
}

size_t UNet::ActivationBytes(const UNetConfig& config, int B, const Options& options) {
  const UNetPlan plan(config);
  return PlanLayout(config, plan, B, {.flash_attention = options.flash_attention}, nullptr)->bytes;
}

Status UNet::Reserve(int B) {
  DT_CHECK(B > 0, "micro-batch {} must be positive", B);
  if (B == batch_) return Status::Ok();
  if (!state_.allocated()) DT_RETURN_IF_ERROR(state_.Allocate());
  graph_.Reset();  // it holds the old activation pointers
  batch_ = 0;
  layers_.clear();
  acts_buffer_ = DeviceBuffer<unsigned char>();
  std::vector<std::unique_ptr<unet::Layer>> layers;
  if (cudnn_ != nullptr) cudnn_->Clear();  // the old micro-batch's shapes
  std::unique_ptr<Layout> layout = PlanLayout(
      config_, plan_, B, {.flash_attention = flash_attention_, .cudnn = cudnn_.get()}, &layers);
  if (cudnn_ != nullptr) {
    DT_RETURN_IF_ERROR(cudnn_->Prepare().WithContext(fmt::format(
        "the self-attention of a micro-batch of {} (UNet::Options::cudnn_attention)", B)));
  }
  Result<DeviceBuffer<unsigned char>> acts =
      DeviceBuffer<unsigned char>::TryAllocate(layout->bytes);
  if (!acts.ok()) {
    return acts.status().WithContext(fmt::format("the activations of a micro-batch of {}", B));
  }
  acts_buffer_ = std::move(acts).value();
  layout_ = std::move(layout);
  layers_ = std::move(layers);
  unsigned char* base = acts_buffer_.data();
  values_.clear();
  value_grads_.clear();
  for (size_t i = 0; i < layout_->values.size(); ++i) {
    values_.push_back(reinterpret_cast<float*>(base + layout_->values[i]));
    value_grads_.push_back(i == 0 ? nullptr : reinterpret_cast<float*>(base + layout_->grads[i]));
  }
  in_t_ = reinterpret_cast<float*>(base + layout_->t);
  in_context_ = reinterpret_cast<float*>(base + layout_->context_f32);
  in_target_ = reinterpret_cast<float*>(base + layout_->target);
  in_samples_ = reinterpret_cast<SampleLoss*>(base + layout_->samples);
  loss_ = reinterpret_cast<float*>(base + layout_->loss);
  loss_workspace_ = reinterpret_cast<double*>(base + layout_->loss_ws);
  batch_ = B;
  UploadUnweightedSamples(in_samples_, B, stream_);
  return Status::Ok();
}

// As DiT's: the per-sample loss weights in the arena are the state Reserve leaves.
void UNet::PoisonActivations() {
  DT_CUDA_CHECK(cudaMemsetAsync(acts_buffer_.data(), 0xFF, acts_buffer_.bytes(), stream_));
  UploadUnweightedSamples(in_samples_, batch_, stream_);
}

namespace {

// The Run every layer reads, over the model's arenas.
unet::Run MakeRun(int B, const float* P, const bf16* W, float* G, unsigned char* base,
                  const std::vector<float*>& values, const std::vector<float*>& grads, Gemm& gemm,
                  cudaStream_t stream) {
  unet::Run r;
  r.B = B;
  r.P = P;
  r.W = W;
  r.G = G;
  r.acts = base;
  r.values = &values;
  r.grads = &grads;
  r.gemm = &gemm;
  r.stream = stream;
  return r;
}

}  // namespace

void UNet::Forward() {
  DT_CHECK(batch_ > 0, "Forward before Reserve");
  const UNetConfig& c = config_;
  const Layout& l = *layout_;
  const int B = batch_, C0 = c.block_out_channels[0], E = c.time_embed_dim();
  unsigned char* base = acts_buffer_.data();
  auto at = [base](size_t offset) { return base + offset; };
  const size_t text = size_t(B) * c.text_length * c.cross_attention_dim;
  CastToBf16(reinterpret_cast<bf16*>(at(l.context)), in_context_, text, stream_);
  // The time embedding: [cos, sin] features, Linear, SiLU, Linear; every resnet takes its SiLU.
  const bf16* W = state_.weights();
  const size_t l1w = Offset(plan_, "time_embedding.linear_1.weight");
  const size_t l1b = Offset(plan_, "time_embedding.linear_1.bias");
  const size_t l2w = Offset(plan_, "time_embedding.linear_2.weight");
  const size_t l2b = Offset(plan_, "time_embedding.linear_2.bias");
  bf16* tfreq = reinterpret_cast<bf16*>(at(l.tfreq));
  float* t1 = reinterpret_cast<float*>(at(l.t1));
  bf16* t1_silu = reinterpret_cast<bf16*>(at(l.t1_silu));
  float* temb = reinterpret_cast<float*>(at(l.temb));
  TimestepFrequencies(tfreq, in_t_, B, C0, stream_);
  gemm_.Forward(t1, tfreq, W + l1w, W + l1b, B, C0, E, Epilogue::kBias);
  SiluForward(t1_silu, t1, size_t(B) * E, stream_);
  gemm_.Forward(temb, t1_silu, W + l2w, W + l2b, B, E, E, Epilogue::kBias);
  SiluForward(reinterpret_cast<bf16*>(at(l.temb_silu)), temb, size_t(B) * E, stream_);

  unet::Run r = MakeRun(B, state_.master(), W, state_.gradients(), base, values_, value_grads_,
                        gemm_, stream_);
  r.context = reinterpret_cast<const bf16*>(at(l.context));
  r.temb_silu = reinterpret_cast<const bf16*>(at(l.temb_silu));
  r.scratch = at(l.scratch);
  r.conv_workspace = at(l.conv_ws);
  for (const std::unique_ptr<unet::Layer>& layer : layers_)
    layer->Forward(r);
}

void UNet::Loss() {
  const UNetValue& y = plan_.values.back();
  DiffusionLoss(loss_, value_grads_.back(), values_.back(), in_target_, nullptr, nullptr,
                in_samples_, batch_, y.C, config_.in_channels, y.H * y.W, /*vb_term=*/false,
                grad_scale_, loss_workspace_, stream_);
}

void UNet::Backward() {
  const UNetConfig& c = config_;
  const Layout& l = *layout_;
  const int B = batch_, C0 = c.block_out_channels[0], E = c.time_embed_dim();
  const size_t BE = size_t(B) * E;
  unsigned char* base = acts_buffer_.data();
  auto f32 = [base](size_t offset) { return reinterpret_cast<float*>(base + offset); };
  auto b16 = [base](size_t offset) { return reinterpret_cast<bf16*>(base + offset); };
  const bf16* W = state_.weights();
  unet::Run r = MakeRun(B, state_.master(), W, state_.gradients(), base, values_, value_grads_,
                        gemm_, stream_);
  r.context = b16(l.context);
  r.temb_silu = b16(l.temb_silu);
  r.dtemb_silu = f32(l.dtemb_silu);
  r.temb_scratch = b16(l.temb_scratch);
  r.scratch = base + l.scratch;
  r.conv_workspace = base + l.conv_ws;
  r.norm_workspace = f32(l.norm_ws);
  r.attention_workspace = f32(l.attn_ws);
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it)
    (*it)->Backward(r);
  // The time embedding, in reverse: SiLU, linear_2, SiLU, linear_1 (its input is fixed).
  float* G = state_.gradients();
  const size_t l1w = Offset(plan_, "time_embedding.linear_1.weight");
  const size_t l1b = Offset(plan_, "time_embedding.linear_1.bias");
  const size_t l2w = Offset(plan_, "time_embedding.linear_2.weight");
  const size_t l2b = Offset(plan_, "time_embedding.linear_2.bias");
  SiluBackward(f32(l.dtemb), f32(l.dtemb_silu), f32(l.temb), BE, stream_);
  CastToBf16(b16(l.dtemb_bf16), f32(l.dtemb), BE, stream_);
  gemm_.BackwardWeight(G + l2w, b16(l.dtemb_bf16), b16(l.t1_silu), B, E, E);
  BiasGradient(G + l2b, f32(l.dtemb), B, E, stream_);
  gemm_.BackwardInput(b16(l.temb_scratch), b16(l.dtemb_bf16), W + l2w, B, E, E);
  CastToFloat(f32(l.dt1_silu), b16(l.temb_scratch), BE, /*accumulate=*/false, stream_);
  SiluBackward(f32(l.dt1), f32(l.dt1_silu), f32(l.t1), BE, stream_);
  CastToBf16(b16(l.dt1_bf16), f32(l.dt1), BE, stream_);
  gemm_.BackwardWeight(G + l1w, b16(l.dt1_bf16), b16(l.tfreq), B, C0, E);
  BiasGradient(G + l1b, f32(l.dt1), B, E, stream_);
}

void UNet::ForwardBackward(float grad_scale) {
  DT_CHECK(batch_ > 0, "ForwardBackward before Reserve");
  grad_scale_ = grad_scale;
  graph_.Run(
      [this] {
        Forward();
        // Every value's gradient and the time embedding's start at zero (backward adds); the
        // output's is the loss's.
        DT_CUDA_CHECK(cudaMemsetAsync(acts_buffer_.data() + layout_->grads_begin, 0,
                                      layout_->grads_end - layout_->grads_begin, stream_));
        Loss();
        Backward();
      },
      grad_scale);
}

float UNet::last_loss() const {
  return ReadLoss(loss_, stream_);
}

}  // namespace difftrain::cuda
