// DiT (Peebles & Xie), exactly as facebookresearch/DiT's models.py, on the CPU in fp32: the
// whole model in one process, or one rank's shard of it under tensor, context and pipeline
// parallelism (model/dit/shard.h). One process is the shard tp = cp = pp = 1 of the same code.
//
// Parameters live in one arena described by a table of the reference state-dict names (local
// shapes); gradients use the same layout in a second arena. Forward stores every activation
// that backward needs in an activation slot; a pipeline stage keeps one slot per micro-batch
// in flight, and one backward scratch area serves them all. Backward mirrors forward in
// reverse and adds into the gradient arena (`+=`), so micro-batches accumulate.
//
// Activation recomputation (Reserve's `recompute`): a slot keeps only each block's input;
// every block's other activations live in one workspace of the scratch area, which forward
// overwrites block after block and backward refills by running the block's forward again
// just before the block's backward. Same code, same order of operations, so the gradients
// are the same bits; each block's forward runs twice (model FLOP/s does not count the
// second: docs/metrics.md).
//
// Communication (model/parallel/mappings.h), each op paired with its backward twin:
//   tensor parallel, per block: mod1 and mod2 enter the column-parallel qkv and fc1 through
//   CopyToTensorParallel (backward: all-reduce of their gradient); proj and fc2 leave
//   through ReduceFromTensorParallel (forward: all-reduce, before their replicated bias).
//   context parallel: keys and values through GatherSequence (backward: reduce-scatter);
//   the final layer's tokens through GatherSequenceSplitGrad, so every rank holds the whole
//   output and computes the loss over the whole sequence, as one process does.
//   pipeline: a stage's boundary is its hidden tokens [B, T/cp, D] followed by the
//   conditioning c [B, D]; the gradient of both comes back (the schedule moves them).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/dit/config.h"
#include "model/dit/params.h"
#include "model/dit/shard.h"
#include "model/family/model.h"
#include "model/parallel/comm.h"
#include "model/tensor/buffer.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

using DiTComms = ModelComms;

class DiT : public Model {
 public:
  // The whole model, one process.
  explicit DiT(const DiTConfig& config);
  // One rank's shard; the comms' sizes must match the shard's tp and cp.
  // Without `gradients` no gradient arena is made (sampling): Backward fails a check.
  DiT(const DiTConfig& config, const DiTShard& shard, const DiTComms& comms, bool gradients = true);

  const DiTConfig& config() const { return config_; }
  const DiTShard& shard() const { return shard_; }
  const ModelShard& placement() const override { return shard_; }
  // This rank's trainable parameters (reference names, local shapes); pos_embed is fixed and
  // kept apart.
  const ShardedParameters& sharded() const override { return sharded_; }
  // The whole model's table (the arena of one process), which fragments() map into.
  const TensorTable& global_parameter_table() const override { return global_table_; }
  using Model::params;
  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }
  // The fixed 2-D sin-cos position embedding [T, D] (state-dict name `pos_embed`, [1, T, D]);
  // held by the first stage only.
  const float* pos_embed() const { return pos_embed_.data(); }
  std::vector<FixedTensor> fixed_tensors() const override;

  // The reference initialisation: Xavier-uniform Linears with zero bias, N(0, 0.02) label
  // table and timestep-MLP weights, zero adaLN and final linear.
  void InitializeReference(uint64_t seed) override;
  // Every parameter random and non-zero (Xavier-uniform weights, N(0, 0.1) biases), so
  // gradient checks see signal on every path, including the zero-initialised ones.
  void InitializeRandom(uint64_t seed) override;

  // Allocates `slots` activation slots for micro-batches of B (if not already so); with
  // `recompute`, a slot keeps only the blocks' inputs and backward recomputes the rest.
  void Reserve(int B, int slots, bool recompute = false) override;
  // Floats of a stage boundary: hidden tokens [B, T/cp, D], then c [B, D].
  size_t boundary_elements() const override;

  // Forward of one micro-batch into `slot`. The first stage reads x [B, C, H, W], t [B]
  // (timesteps as floats) and y [B] (labels; num_classes = null class); later stages read
  // `input`, the previous stage's boundary. Every stage but the last writes its boundary
  // to `output`; the last stage's result is output(slot) [B, out_channels, H, W].
  Status Forward(int slot, const float* x, const float* t, const int32_t* y, const float* input,
                 float* output);
  // The same, reading x_t, t and y of `inputs`.
  Status Forward(int slot, const ModelInputs& inputs, const float* input, float* output) override {
    return Forward(slot, inputs.x_t, inputs.t, inputs.y, input, output);
  }
  const float* output(int slot) const override { return acts_[slot].out; }

  // `ready` is called during Backward with an offset o: the gradients of the arena range
  // [o, end) are final. Backward finishes the final layer first and the embeddings last, so o only
  // decreases, and the last call has o = 0. Data parallelism starts reducing a gradient
  // bucket as soon as it is final, while backward goes on.
  // Backward of the micro-batch in `slot`. output_grad: on the last stage the loss gradient
  // of output(slot); elsewhere the gradient of this stage's boundary. Every stage but the
  // first writes the gradient of its input boundary to input_grad.
  Status Backward(int slot, const float* output_grad, float* input_grad,
                  const GradientsReady& ready = {}) override;
  // Skips the gradients of every Linear layer's weight and bias and of the label embedding.
  void SkipGradients(std::vector<size_t> tensor_offsets) override {
    skipped_.Set(sharded_.table, std::move(tensor_offsets));
  }

  // One process, one micro-batch: Forward into slot 0, returning the output.
  const float* Forward(const float* x, const float* t, const int32_t* y, int B);
  void Backward(const float* dout, const GradientsReady& ready = {});

  // Bytes of the activation arena: `slots` slots for micro-batch B plus the backward scratch
  // (and, with `recompute`, the block workspace).
  static size_t ActivationBytes(const DiTConfig& config, const DiTShard& shard, int B, int slots,
                                bool recompute = false);
  size_t activation_bytes() const override { return act_buffer_.bytes(); }
  size_t pos_embed_bytes() const { return pos_embed_.bytes(); }

 private:
  // Which activations a block keeps: a spatial or a temporal block's (model/dit/config.h),
  // or room for either (the recomputation workspace of a video model).
  enum class BlockKind { kSpatial, kTemporal, kWorkspace };
  // Pointers into one activation slot for one block.
  struct BlockActs {
    float *resid_in, *ada, *ln1, *mean1, *rstd1, *mod1, *qkv, *kv, *probs, *attn, *proj, *mid;
    float *ln2, *mean2, *rstd2, *mod2, *fc1, *gelu, *fc2;
  };
  // What forward keeps for backward, per micro-batch in flight.
  struct Acts {
    float *patches, *tfreq, *t_hidden, *t_act, *t_emb, *y_emb, *c, *silu_c;
    std::vector<BlockActs> blocks;  // this stage's blocks
    float *resid_out, *ada_f, *lnf, *meanf, *rstdf, *modf, *final_out, *final_full, *out;
  };
  // Forward and backward scratch, shared by the slots. With recomputation, `block` holds
  // every activation of the block being computed except its input (resid_in is unused).
  struct Scratch {
    float *patches_full, *d_resid, *d_a, *d_b, *d_qkv, *d_kv, *d_h1, *d_h2, *d_ada, *d_silu_c, *d_c,
        *d_t1, *d_t2, *d_final_out, *d_final_full, *sequence;
    float *t_attn, *t_dqkv;  // a temporal block's attention (output and qkv gradient)
    BlockActs block;
  };
  // Calls f for every activation of one block but its input, names prefixed by `prefix`.
  template <typename F>
  static void VisitBlock(const DiTConfig& c, const DiTShard& s, int B, const std::string& prefix,
                         BlockKind kind, BlockActs& k, F&& f);
  template <typename F>
  static void VisitActivations(const DiTConfig& c, const DiTShard& s, int B, bool recompute,
                               Acts& a, F&& f);
  template <typename F>
  static void VisitScratch(const DiTConfig& c, const DiTShard& s, int B, bool recompute, Scratch& a,
                           F&& f);
  // Fills a whole-model arena by `fill` and keeps this shard's part.
  template <typename Fill>
  void InitializeGlobal(Fill&& fill);

  // Block i's forward, writing its output to the next block's input (or resid_out).
  Status BlockForward(int i, Acts& a);
  Status BlockBackward(int l, Acts& a);

  float* P(size_t offset) { return params_.data() + offset; }
  // Null for a tensor whose gradient is skipped (SkipGradients).
  float* G(size_t offset) { return skipped_.Skips(offset, 1) ? nullptr : grads_.data() + offset; }

  DiTConfig config_;
  DiTShard shard_;
  DiTComms comms_;
  ShardedParameters sharded_;
  TensorTable global_table_;
  Buffer<float> params_, grads_, pos_embed_;
  GradientSkips skipped_;     // SkipGradients' tensors
  Buffer<float> temp_embed_;  // Latte's [num_frames, D]; first stage
  DiTParams p_;               // offsets of this shard's parameters (the same in params_ and grads_)

  int batch_ = 0;
  bool recompute_ = false;
  Buffer<float> act_buffer_;
  std::vector<Acts> acts_;
  Scratch scratch_{};
  // Labels of each slot's micro-batch (the label table gradient needs them).
  std::vector<std::vector<int32_t>> y_;
};

}  // namespace difftrain
