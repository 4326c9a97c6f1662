#include "model/unet/unet.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/embed.h"
#include "model/cpu/linear.h"
#include "model/tensor/rng.h"
#include "model/unet/layers.h"

namespace difftrain {

// Where a micro-batch's tensors sit: per slot the values and the layers' activations (with
// recomputation only the values); after the slots, the backward area (the values' gradients
// and the layers' shared scratch), then with recomputation the layers' shared workspace.
struct UNet::Layout {
  std::vector<size_t> value_offsets, grad_offsets;  // in a slot; in the backward area
  size_t tfreq = 0, t1 = 0, t1_silu = 0, temb = 0, temb_silu = 0;  // in a slot
  size_t tcond = 0;  // in a slot: cond_proj's output (time_cond_proj_dim > 0)
  size_t dtemb_silu = 0, dtemb = 0, dt1_silu = 0, dt1 = 0;  // in the backward area
  size_t dtfreq = 0;  // in the backward area (time_cond_proj_dim > 0)
  // text_time: add_embedding's input (pooled text, time ids' features), its hidden layer and
  // that layer's SiLU, in a slot; their gradients in the backward area.
  size_t add_in = 0, add1 = 0, add1_silu = 0, dadd1_silu = 0, dadd1 = 0;
  size_t slot = 0, backward = 0, workspace = 0;  // floats
};

namespace {

// Builds the layers for micro-batch B and the layout they share; `layers` may be null to
// count only.
std::unique_ptr<UNet::Layout> PlanLayout(const UNetConfig& c, const UNetPlan& plan, int B,
                                         bool recompute,
                                         std::vector<std::unique_ptr<UNetLayer>>* layers);

}  // namespace

UNet::UNet(const UNetConfig& config, bool gradients)
    : config_(config),
      plan_(config),
      // A model made for inference is filled from a file: its pages are first touched (and
      // zeroed by the kernel) by the threads that copy the weights in, not by one memset.
      params_(plan_.table.total(), gradients ? BufferPages::kTouched : BufferPages::kOnFirstTouch),
      // Touched only where gradients are computed (a LoRA run skips most).
      grads_(gradients ? plan_.table.total() : 0, BufferPages::kOnFirstTouch) {
  sharded_.table = plan_.table;
  sharded_.fragments = {{0, 0, plan_.table.total()}};
  sharded_.split.assign(plan_.table.tensors().size(), false);
}

UNet::~UNet() = default;

void UNet::InitializeReference(uint64_t seed) {
  Rng rng(seed, RngStream::kInit);
  double bound = 0;  // of the layer whose weight came last: its bias shares it
  for (const TensorSpec& t : plan_.table.tensors()) {
    float* w = params_.data() + t.offset;
    const bool norm = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
    if (norm) {
      const bool weight = t.name.ends_with(".weight");
      std::fill(w, w + t.numel, weight ? 1.0f : 0.0f);
      continue;
    }
    if (t.shape.size() > 1) bound = 1 / std::sqrt(static_cast<double>(t.numel / t.shape[0]));
    for (size_t i = 0; i < t.numel; ++i)
      w[i] = static_cast<float>((2 * rng.Uniform() - 1) * bound);
  }
}

void UNet::InitializeRandom(uint64_t seed) {
  InitializeReference(seed);
  Rng rng(seed, RngStream::kInit);
  for (const TensorSpec& t : plan_.table.tensors()) {
    if (t.shape.size() != 1 || t.name.find("norm") == std::string::npos) continue;
    float* w = params_.data() + t.offset;
    for (size_t i = 0; i < t.numel; ++i)
      w[i] += static_cast<float>(0.2 * rng.Normal());
  }
}

size_t UNet::ActivationBytes(const UNetConfig& c, int B, int slots, bool recompute) {
  const UNetPlan plan(c);
  const std::unique_ptr<Layout> l = PlanLayout(c, plan, B, recompute, nullptr);
  return (l->slot * slots + l->backward + l->workspace) * sizeof(float);
}

Status UNet::SetSampleSize(int height, int width) {
  if (height == config_.sample_size && width == config_.width()) return Status::Ok();
  UNetConfig resized = config_;
  resized.sample_size = height;
  resized.sample_width = width == height ? 0 : width;
  DT_RETURN_IF_ERROR(resized.Validate());
  UNetPlan plan(resized);
  DT_CHECK(plan.table.total() == plan_.table.total(), "a resized UNet has other parameters");
  config_ = std::move(resized);
  plan_ = std::move(plan);
  batch_ = 0;  // the next Reserve lays out activations of the new size
  return Status::Ok();
}

void UNet::Reserve(int B, int slots, bool recompute) {
  if (B == batch_ && slots == slots_ && recompute == recompute_) return;
  layers_.clear();
  layout_ = PlanLayout(config_, plan_, B, recompute, &layers_);
  // Aspect-ratio buckets lay the activations out anew at each change of size: an arena that holds
  // the new layout is kept (its pages touched already; layers write their values before they
  // read them), a smaller one freed before the larger is made.
  const size_t needed = layout_->slot * slots + layout_->backward + layout_->workspace;
  if (needed > acts_.size()) {
    acts_ = Buffer<float>();
    acts_ = Buffer<float>(needed);
  }
  contexts_.assign(slots, nullptr);
  dcontexts_.assign(slots, nullptr);
  guidances_.assign(slots, nullptr);
  batch_ = B;
  slots_ = slots;
  recompute_ = recompute;
}

const float* UNet::output(int slot) const {
  return acts_.data() + slot * layout_->slot + layout_->value_offsets.back();
}

Status UNet::SetContextGradient(int slot, float* dcontext) {
  DT_CHECK(slot < slots_, "slot {} of {}", slot, slots_);
  dcontexts_[slot] = dcontext;
  return Status::Ok();
}

UNetRun UNet::Run(int slot) {
  const Layout& l = *layout_;
  UNetRun r;
  r.B = batch_;
  r.P = params_.data();
  r.G = grads_.data();
  r.skipped = skipped_.empty() ? nullptr : &skipped_;
  r.acts = acts_.data() + slot * l.slot;
  r.scratch = acts_.data() + slots_ * l.slot;
  r.work = recompute_ ? r.scratch + l.backward : r.acts;
  r.value_offsets = &l.value_offsets;
  r.grad_offsets = &l.grad_offsets;
  r.context = contexts_[slot];
  r.dcontext = dcontexts_[slot];
  r.temb_silu = r.acts + l.temb_silu;
  return r;
}

Status UNet::Forward(int slot, const ModelInputs& inputs, const float*, float*) {
  DT_CHECK(slot < slots_, "slot {} of {}", slot, slots_);
  DT_CHECK(inputs.context != nullptr, "the UNet needs inputs.context (text embeddings)");
  const Layout& l = *layout_;
  contexts_[slot] = inputs.context;
  DT_CHECK(inputs.guidance == nullptr || config_.time_cond_proj_dim > 0,
           "a guidance embedding for a UNet without time_cond_proj_dim");
  guidances_[slot] = inputs.guidance;
  const UNetRun r = Run(slot);
  float* acts = r.acts;
  const int B = batch_, C0 = config_.block_out_channels[0], E = config_.time_embed_dim();
  const UNetValue& x = plan_.values[0];
  std::memcpy(acts + l.value_offsets[0], inputs.x_t, sizeof(float) * B * x.C * x.H * x.W);
  // The time embedding: [cos, sin] features, Linear, SiLU, Linear; every resnet takes its SiLU.
  const float* P = params_.data();
  const auto offset = [&](const char* name) { return plan_.table.Find(name)->offset; };
  cpu::TimestepFrequencies(acts + l.tfreq, inputs.t, B, C0);
  if (inputs.guidance != nullptr) {
    // A guidance-distilled model's timestep_cond: its projection joins the features.
    cpu::LinearForward(acts + l.tcond, inputs.guidance,
                       P + offset("time_embedding.cond_proj.weight"),
                       static_cast<const float*>(nullptr), B, config_.time_cond_proj_dim, C0);
    for (size_t i = 0; i < size_t(B) * C0; ++i)
      acts[l.tfreq + i] += acts[l.tcond + i];
  }
  cpu::LinearForward(acts + l.t1, acts + l.tfreq, P + offset("time_embedding.linear_1.weight"),
                     P + offset("time_embedding.linear_1.bias"), B, C0, E);
  cpu::SiluForward(acts + l.t1_silu, acts + l.t1, size_t(B) * E);
  cpu::LinearForward(acts + l.temb, acts + l.t1_silu, P + offset("time_embedding.linear_2.weight"),
                     P + offset("time_embedding.linear_2.bias"), B, E, E);
  if (config_.text_time()) {
    // SDXL's micro-conditioning: add_embedding(pooled text, features of the time ids) joins the
    // time embedding.
    DT_CHECK(inputs.pooled_text != nullptr && inputs.time_ids != nullptr,
             "an SDXL UNet (text_time) needs inputs.pooled_text and inputs.time_ids");
    const int P_text = config_.pooled_text_dim(),
              Pin = config_.projection_class_embeddings_input_dim;
    const int ids = config_.time_ids();
    for (int b = 0; b < B; ++b) {
      float* row = acts + l.add_in + size_t(b) * Pin;
      std::memcpy(row, inputs.pooled_text + size_t(b) * P_text, sizeof(float) * P_text);
      cpu::TimestepFrequencies(row + P_text, inputs.time_ids + size_t(b) * ids, ids,
                               config_.addition_time_embed_dim);
    }
    cpu::LinearForward(acts + l.add1, acts + l.add_in, P + offset("add_embedding.linear_1.weight"),
                       P + offset("add_embedding.linear_1.bias"), B, Pin, E);
    cpu::SiluForward(acts + l.add1_silu, acts + l.add1, size_t(B) * E);
    // The second layer adds into the time embedding (its bias too).
    std::vector<float> aug(size_t(B) * E);
    cpu::LinearForward(aug.data(), acts + l.add1_silu, P + offset("add_embedding.linear_2.weight"),
                       P + offset("add_embedding.linear_2.bias"), B, E, E);
    for (size_t i = 0; i < aug.size(); ++i)
      acts[l.temb + i] += aug[i];
  }
  cpu::SiluForward(acts + l.temb_silu, acts + l.temb, size_t(B) * E);
  for (const std::unique_ptr<UNetLayer>& layer : layers_)
    layer->Forward(r);
  return Status::Ok();
}

Status UNet::Backward(int slot, const float* output_grad, float*, const GradientsReady& ready) {
  DT_CHECK(grads_.size() > 0, "a UNet made for inference has no gradients");
  const Layout& l = *layout_;
  UNetRun r = Run(slot);
  const float* acts = r.acts;
  float* back = r.scratch;
  const int B = batch_, C0 = config_.block_out_channels[0], E = config_.time_embed_dim();
  // Every value's gradient and the time embedding's start at zero; the output's is given.
  std::memset(back, 0, l.backward * sizeof(float));
  const UNetValue& y = plan_.values.back();
  std::memcpy(back + l.grad_offsets.back(), output_grad, sizeof(float) * B * y.C * y.H * y.W);
  r.dtemb_silu = back + l.dtemb_silu;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    if (recompute_) {
      r.recomputing = true;
      (*it)->Forward(r);
      r.recomputing = false;
    }
    (*it)->Backward(r);
    if (ready) ready((*it)->first_param);
  }
  const float* P = params_.data();
  const auto offset = [&](const char* name) { return plan_.table.Find(name)->offset; };
  // A tensor's gradient, or null where SkipGradients skips it.
  const auto grad = [&](const char* name) {
    const TensorSpec* t = plan_.table.Find(name);
    return skipped_.Skips(t->offset, t->numel) ? nullptr : grads_.data() + t->offset;
  };
  cpu::SiluBackward(back + l.dtemb, back + l.dtemb_silu, acts + l.temb, size_t(B) * E);
  cpu::LinearBackward(back + l.dt1_silu, grad("time_embedding.linear_2.weight"),
                      grad("time_embedding.linear_2.bias"), back + l.dtemb, acts + l.t1_silu,
                      P + offset("time_embedding.linear_2.weight"), B, E, E);
  if (config_.text_time()) {
    // add_embedding's gradients: the time embedding's flows into its second layer too; its
    // input is data.
    const int Pin = config_.projection_class_embeddings_input_dim;
    cpu::LinearBackward(back + l.dadd1_silu, grad("add_embedding.linear_2.weight"),
                        grad("add_embedding.linear_2.bias"), back + l.dtemb, acts + l.add1_silu,
                        P + offset("add_embedding.linear_2.weight"), B, E, E);
    cpu::SiluBackward(back + l.dadd1, back + l.dadd1_silu, acts + l.add1, size_t(B) * E);
    cpu::LinearBackward<float>(nullptr, grad("add_embedding.linear_1.weight"),
                               grad("add_embedding.linear_1.bias"), back + l.dadd1, acts + l.add_in,
                               P + offset("add_embedding.linear_1.weight"), B, Pin, E);
  }
  cpu::SiluBackward(back + l.dt1, back + l.dt1_silu, acts + l.t1, size_t(B) * E);
  // The features are data, and so their gradient is needed only for cond_proj's weight.
  const float* guidance = guidances_[slot];
  cpu::LinearBackward<float>(guidance != nullptr ? back + l.dtfreq : nullptr,
                             grad("time_embedding.linear_1.weight"),
                             grad("time_embedding.linear_1.bias"), back + l.dt1, acts + l.tfreq,
                             P + offset("time_embedding.linear_1.weight"), B, C0, E);
  if (guidance != nullptr) {
    cpu::LinearBackward<float>(
        nullptr, grad("time_embedding.cond_proj.weight"), nullptr, back + l.dtfreq, guidance,
        P + offset("time_embedding.cond_proj.weight"), B, config_.time_cond_proj_dim, C0);
  }
  if (ready) ready(0);
  return Status::Ok();
}

namespace {

std::unique_ptr<UNet::Layout> PlanLayout(const UNetConfig& c, const UNetPlan& plan, int B,
                                         bool recompute,
                                         std::vector<std::unique_ptr<UNetLayer>>* layers) {
  auto l = std::make_unique<UNet::Layout>();
  Space slot, back;
  const size_t E = size_t(B) * c.time_embed_dim();
  for (const UNetValue& v : plan.values) {
    const size_t n = size_t(B) * v.C * v.H * v.W;
    l->value_offsets.push_back(slot.Take(n));
    l->grad_offsets.push_back(l->value_offsets.size() == 1 ? 0 : back.Take(n));
  }
  l->tfreq = slot.Take(size_t(B) * c.block_out_channels[0]);
  l->t1 = slot.Take(E);
  l->t1_silu = slot.Take(E);
  l->temb = slot.Take(E);
  l->temb_silu = slot.Take(E);
  l->dtemb_silu = back.Take(E);
  l->dtemb = back.Take(E);
  l->dt1_silu = back.Take(E);
  l->dt1 = back.Take(E);
  if (c.time_cond_proj_dim > 0) {
    l->tcond = slot.Take(size_t(B) * c.block_out_channels[0]);
    l->dtfreq = back.Take(size_t(B) * c.block_out_channels[0]);
  }
  if (c.text_time()) {
    l->add_in = slot.Take(size_t(B) * c.projection_class_embeddings_input_dim);
    l->add1 = slot.Take(E);
    l->add1_silu = slot.Take(E);
    l->dadd1_silu = back.Take(E);
    l->dadd1 = back.Take(E);
  }
  // Every layer's temporaries start where the gradients end: they share the rest. With
  // recomputation its activations likewise share the workspace.
  size_t scratch = 0;
  for (const UNetNode& node : plan.nodes) {
    Space layer_scratch{back.used}, layer_work;
    std::unique_ptr<UNetLayer> layer =
        MakeUNetLayer(c, plan, node, B, recompute ? layer_work : slot, layer_scratch);
    scratch = std::max(scratch, layer_scratch.used - back.used);
    l->workspace = std::max(l->workspace, layer_work.used);
    if (layers != nullptr) layers->push_back(std::move(layer));
  }
  l->slot = slot.used;
  l->backward = back.used + scratch;
  return l;
}

}  // namespace

}  // namespace difftrain
