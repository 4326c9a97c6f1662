// The Stable Diffusion UNet, exactly as diffusers' UNet2DConditionModel computes it, on the CPU
// in fp32, in one process (the UNet trains data-parallel: model/unet/family.cc refuses tensor,
// context and pipeline parallelism).
//
// The architecture is a list of layers in forward order (model/unet/plan.h); each layer reads
// its inputs' values and writes its output value, and keeps in the micro-batch's activation
// slot what its backward needs. Backward runs the layers in reverse: every layer adds into the
// gradients of its inputs (`+=`), so a skip's gradient collects both the up block's
// concatenation and the down path's next layer before the down layer that made it runs.
// Parameter gradients accumulate (`+=`) in the order of the table, time embedding first, so
// the gradients from a layer's first parameter to the end are final once that layer's
// backward is done (the time embedding's, which every resnet feeds, last).
//
// Activation recomputation (`recompute`): a slot keeps only the values that pass between layers
// (every resnet's, transformer's and up-/downsampler's input and output) and the time
// embedding; each layer's own activations go to one workspace that all layers share, and
// backward runs the layer's forward again into it (up to what its backward reads) just before
// the layer's backward. The recomputed activations are the same bits as the stored ones.
//
// Text conditioning: cross-attention keys and values come from inputs.context [B, L, D_text];
// the text is data, so it gets no gradient. The self-attention's to_q, to_k and to_v sit back
// to back in the parameter table and act as one [3C, C] projection; the cross-attention's
// to_k and to_v likewise as one [2C, D_text] projection.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/family/model.h"
#include "model/tensor/buffer.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain {

class UNetLayer;
struct UNetRun;

class UNet : public Model {
 public:
  // Without `gradients` no gradient arena is made (sampling): Backward fails a check.
  explicit UNet(const UNetConfig& config, bool gradients = true);
  ~UNet() override;

  const UNetConfig& config() const { return config_; }
  const ModelShard& placement() const override { return shard_; }
  const ShardedParameters& sharded() const override { return sharded_; }
  const TensorTable& global_parameter_table() const override { return plan_.table; }
  using Model::params;
  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }
  std::vector<FixedTensor> fixed_tensors() const override { return {}; }

  // PyTorch's default initialisation, as UNet2DConditionModel(**config) has it: Conv2d and
  // Linear weights and biases uniform in ±1/√fan_in, norms' weights 1 and biases 0.
  void InitializeReference(uint64_t seed) override;
  // Every parameter random and non-zero (norm weights around 1).
  void InitializeRandom(uint64_t seed) override;

  // The config with the new sample_size, checked as the config is; the next Reserve allocates
  // the activations of that size.
  Status SetSampleSize(int height, int width) override;
  void Reserve(int B, int slots, bool recompute = false) override;
  size_t activation_bytes() const override { return acts_.bytes(); }
  size_t boundary_elements() const override { return 0; }
  // Bytes Reserve(B, slots, recompute) allocates.
  static size_t ActivationBytes(const UNetConfig& config, int B, int slots, bool recompute);

  // Reads x_t [B, in_channels, S, S], t [B], context [B, text_length, cross_attention_dim],
  // for a model with time_cond_proj_dim the optional guidance [B, time_cond_proj_dim], and for
  // SDXL's (text_time) pooled_text [B, pooled_text_dim] and time_ids [B, 6] (the refiner's 5); the
  // output is [B, out_channels, S, S].
  Status Forward(int slot, const ModelInputs& inputs, const float* input, float* output) override;
  const float* output(int slot) const override;
  Status Backward(int slot, const float* output_grad, float* input_grad,
                  const GradientsReady& ready = {}) override;
  // The cross-attentions' key and value projections add their input's gradient into
  // `dcontext` (every transformer block's, each micro-batch's Backward).
  Status SetContextGradient(int slot, float* dcontext) override;
  // Skips the gradients of the convolutions' and Linear layers' weights and biases (the norms'
  // and the time embedding's, small tensors, are computed still).
  void SkipGradients(std::vector<size_t> tensor_offsets) override {
    skipped_.Set(plan_.table, std::move(tensor_offsets));
  }

  // Where a micro-batch's tensors sit in the activation arena (model/unet/unet.cc).
  struct Layout;

 private:
  // Where slot `slot`'s forward and backward read and write.
  UNetRun Run(int slot);

  UNetConfig config_;
  UNetPlan plan_;
  ModelShard shard_;
  ShardedParameters sharded_;
  Buffer<float> params_, grads_;
  int batch_ = 0, slots_ = 0;
  bool recompute_ = false;
  std::unique_ptr<Layout> layout_;
  std::vector<std::unique_ptr<UNetLayer>> layers_;
  // Each slot's text embedding, which backward reads again (the caller keeps its inputs until
  // the micro-batch's backward).
  std::vector<const float*> contexts_;
  std::vector<float*> dcontexts_;        // SetContextGradient's, each slot's
  std::vector<const float*> guidances_;  // each slot's guidance embedding, or null
  GradientSkips skipped_;                // SkipGradients' tensors
  // slots × the slot size, then the backward scratch, then (recomputing) the workspace
  Buffer<float> acts_;
};

}  // namespace difftrain
