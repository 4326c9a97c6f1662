// What the trainer, the checkpoint code and the samplers need of one rank's model, whatever
// its family (DiT, Latte, the Stable Diffusion UNet): parameters in one arena described by a
// table of the reference state-dict names, fragments that map this rank's arena onto the
// whole model's, fixed tensors kept apart, and forward/backward of one micro-batch in an
// activation slot. A family implements it in its folder under model/ (model/family/family.h).
//
// The conventions every family keeps (docs/architecture.md, "Adding a model family"):
// - parameters and gradients share one table; backward adds into the gradients (`+=`), so
//   micro-batches accumulate; activations are written (`=`);
// - one process is the layout tp = cp = pp = 1 of the same code;
// - a pipeline stage exchanges a boundary of boundary_elements() floats per micro-batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/parallel/comm.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

// Where one rank's part of a model sits in a tensor × context × pipeline parallel layout.
struct ModelShard {
  int tp = 1, tp_rank = 0;
  int cp = 1, cp_rank = 0;
  int pp = 1, stage = 0;

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage + 1 == pp; }
};

// The parallel sizes of a layout, as a family validates and shards it.
struct LayoutShape {
  int tp = 1, cp = 1, pp = 1;
  std::vector<int> stage_blocks;  // blocks (or the family's stage units) per stage; empty: balanced
};

// Local elements [local, local + length) hold global elements [global, global + length).
struct Fragment {
  size_t local = 0, global = 0, length = 0;
};

struct ShardedParameters {
  TensorTable table;                // this rank's tensors: reference names, local shapes
  std::vector<Fragment> fragments;  // in local order, covering the local arena
  // Local tensors split across the tensor-parallel group (not replicated there).
  std::vector<bool> split;
};

// A tensor of the state dict that is not trained (DiT's pos_embed, Latte's temp_embed):
// computed from the config, written to checkpoints, never read back.
struct FixedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// The named input tensors of one micro-batch of B samples, as the first stage reads them.
// A family reads those its schema names (model/family/family.h, SampleSchema).
struct ModelInputs {
  const float* x_t = nullptr;      // the noised sample, [B, ...sample shape]
  const float* t = nullptr;        // [B] timesteps, as floats
  const int32_t* y = nullptr;      // [B] labels (num_classes: the null class); class-conditional
  const float* context = nullptr;  // [B, L, D] text embeddings; text-conditional families
  // [B, guidance_embedding_dim] the guidance scale's embedding, for a model distilled with
  // guidance in it (SampleSchema::guidance_embedding_dim); null: none, as in training.
  const float* guidance = nullptr;
  // SDXL's micro-conditioning (SampleSchema::pooled_text_dim > 0): [B, pooled_text_dim] the
  // text's pooled embedding and [B, time_ids] (original height, width, crop top, left, target
  // height, width, in pixels); null for other models.
  const float* pooled_text = nullptr;
  const float* time_ids = nullptr;
};

// The communicators of a shard's tensor- and context-parallel groups; null for a group of one.
struct ModelComms {
  parallel::Comm* tp = nullptr;
  parallel::Comm* cp = nullptr;
};

// The parameters whose gradients a model skips (Model::SkipGradients): whole tensors of its
// arena, as increasing merged ranges.
class GradientSkips {
 public:
  // The tensors of `table` at `tensor_offsets` (each a tensor's first element).
  void Set(const TensorTable& table, std::vector<size_t> tensor_offsets);
  bool empty() const { return ranges_.empty(); }
  // Whether every parameter of [offset, offset + n) is skipped: a tensor, or one matrix fused
  // of several (a UNet's q, k and v).
  bool Skips(size_t offset, size_t n) const;

 private:
  std::vector<std::pair<size_t, size_t>> ranges_;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelShard& placement() const = 0;
  // This rank's trainable parameters (reference names, local shapes) and their fragments.
  virtual const ShardedParameters& sharded() const = 0;
  const TensorTable& parameter_table() const { return sharded().table; }
  // The whole model's table (the arena of one process), which the fragments map into.
  virtual const TensorTable& global_parameter_table() const = 0;
  virtual float* params() = 0;
  const float* params() const { return const_cast<Model*>(this)->params(); }
  virtual float* grads() = 0;
  size_t num_params() const { return sharded().table.total(); }
  // The fixed tensors this rank holds (the first stage's embeddings).
  virtual std::vector<FixedTensor> fixed_tensors() const = 0;
  size_t fixed_bytes() const;

  // Whether this rank's arena is laid out as the whole model's (one process, or data
  // parallelism alone): its local and global tables are the same, and a whole-model arena can be
  // read and written in place.
  bool holds_whole_model() const;
  // Copies this shard's elements out of a whole-model arena, and back into one.
  void ScatterFromGlobal(const float* global, float* local) const;
  void GatherToGlobal(const float* local, float* global) const;

  // The reference initialisation, from `seed`.
  virtual void InitializeReference(uint64_t seed) = 0;
  // Every parameter random and non-zero, so gradient checks see signal on every path.
  virtual void InitializeRandom(uint64_t seed) = 0;

  // Aspect-ratio buckets: the sample size, height × width (of a latent), that the following
  // Reserve and Forward take, the parameters the same (a convolutional model's are of any size).
  // By default an error saying the family trains at its config's size only.
  virtual Status SetSampleSize(int height, int width);

  // Allocates `slots` activation slots for micro-batches of B (if not already so); with
  // `recompute`, backward recomputes what forward did not keep.
  virtual void Reserve(int B, int slots, bool recompute = false) = 0;
  virtual size_t activation_bytes() const = 0;
  // Floats of a pipeline stage boundary for the reserved micro-batch size.
  virtual size_t boundary_elements() const = 0;

  // Forward of one micro-batch into `slot`: the first stage reads `inputs`, later stages
  // `input` (the previous stage's boundary); every stage but the last writes its boundary to
  // `output`; the last stage's result is output(slot). Every stage receives `inputs` (the
  // conditioning a family needs on every stage is its to take).
  virtual Status Forward(int slot, const ModelInputs& inputs, const float* input,
                         float* output) = 0;
  virtual const float* output(int slot) const = 0;

  // The parameters whose gradients the caller does not need (LoRA's frozen weights: their
  // offsets in this rank's arena, each a tensor's first element). A family may skip computing
  // them in Backward, leaving those gradients as they are; the others stay bit for bit what they
  // would be. The default computes everything.
  virtual void SkipGradients(std::vector<size_t> tensor_offsets) {}

  // Textual inversion (model/train/textual_inversion.h): the next Backward of `slot` also adds
  // the loss gradient of that micro-batch's inputs.context into `dcontext` [B, L, D] (`+=`);
  // null: none, as by default. A family that cannot returns an error.
  virtual Status SetContextGradient(int slot, float* dcontext);

  // Called during Backward with an offset o: the gradients of the arena range [o, end) are
  // final; o only decreases and the last call has o = 0.
  using GradientsReady = std::function<void(size_t from)>;
  // Backward of the micro-batch in `slot`: output_grad is the loss gradient of output(slot)
  // on the last stage, the boundary's gradient elsewhere; every stage but the first writes
  // its input boundary's gradient to input_grad. Adds into grads().
  virtual Status Backward(int slot, const float* output_grad, float* input_grad,
                          const GradientsReady& ready = {}) = 0;
};

}  // namespace difftrain
