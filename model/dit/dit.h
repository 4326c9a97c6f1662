// DiT (Peebles & Xie), exactly as facebookresearch/DiT's models.py, on the CPU in fp32.
//
// Parameters live in one arena described by a table of the reference state-dict names;
// gradients use the same layout in a second arena. Forward stores every activation that
// backward needs in a third arena sized for the micro-batch; backward mirrors forward in
// reverse and adds into the gradient arena (`+=`), so micro-batches accumulate.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/dit/config.h"
#include "model/tensor/buffer.h"
#include "model/tensor/tensor_table.h"

namespace difftrain {

class DiT {
 public:
  explicit DiT(const DiTConfig& config);

  const DiTConfig& config() const { return config_; }
  // Trainable parameters (reference names and shapes); pos_embed is fixed and kept apart.
  const TensorTable& parameter_table() const { return table_; }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  size_t num_params() const { return table_.total(); }
  // The fixed 2-D sin-cos position embedding [T, D] (state-dict name `pos_embed`, [1, T, D]).
  const float* pos_embed() const { return pos_embed_.data(); }

  // The reference initialisation: Xavier-uniform Linears with zero bias, N(0, 0.02) label
  // table and timestep-MLP weights, zero adaLN and final linear.
  void InitializeReference(uint64_t seed);
  // Every parameter random and non-zero (Xavier-uniform weights, N(0, 0.1) biases), so
  // gradient checks see signal on every path, including the zero-initialised ones.
  void InitializeRandom(uint64_t seed);

  // x [B, C, H, W], t [B] (timesteps as floats), y [B] (labels; num_classes = null class).
  // Returns the output [B, out_channels, H, W], valid until the next Forward.
  const float* Forward(const float* x, const float* t, const int32_t* y, int B);
  // Called during Backward with an offset o: the gradients of the arena range [o, end) are
  // final. Backward finishes the final layer first and the embeddings last, so o only
  // decreases, and the last call has o = 0. Data parallelism starts reducing a gradient
  // bucket as soon as it is final, while backward goes on.
  using GradientsReady = std::function<void(size_t from)>;

  // dout [B, out_channels, H, W]: the loss gradient of the last Forward's output.
  void Backward(const float* dout, const GradientsReady& ready = {});

  // Bytes of the activation (and activation-gradient) arena for micro-batch B.
  static size_t ActivationBytes(const DiTConfig& config, int B);

 private:
  // Offsets of one block's parameters in the arena (the same in params_ and grads_).
  struct BlockOffsets {
    size_t ada_w, ada_b, qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  // Pointers into the activation arena for one block.
  struct BlockActs {
    float *resid_in, *ada, *ln1, *mean1, *rstd1, *mod1, *qkv, *probs, *attn, *proj, *mid;
    float *ln2, *mean2, *rstd2, *mod2, *fc1, *gelu, *fc2;
  };
  struct Acts {
    float *patches, *tfreq, *t_hidden, *t_act, *t_emb, *y_emb, *c, *silu_c;
    std::vector<BlockActs> blocks;
    float *resid_out, *ada_f, *lnf, *meanf, *rstdf, *modf, *final_out, *out;
    // Backward scratch.
    float *d_resid, *d_a, *d_b, *d_qkv, *d_h1, *d_h2, *d_ada, *d_silu_c, *d_c, *d_t1, *d_t2;
    float* d_final_out;
  };
  static TensorTable ActivationLayout(const DiTConfig& c, int B);
  void EnsureActivations(int B);

  float* P(size_t offset) { return params_.data() + offset; }
  float* G(size_t offset) { return grads_.data() + offset; }

  DiTConfig config_;
  TensorTable table_;
  Buffer<float> params_, grads_, pos_embed_;
  size_t x_w_, x_b_, t1_w_, t1_b_, t2_w_, t2_b_, y_table_, fada_w_, fada_b_, flin_w_, flin_b_;
  std::vector<BlockOffsets> blocks_;

  int batch_ = 0;
  Buffer<float> act_buffer_;
  Acts acts_{};
  std::vector<int32_t> y_;  // labels of the last forward (the label table gradient needs them)
};

}  // namespace difftrain
