// Training through a CLIP text model: textual inversion (Gal et al. 2022; diffusers'
// textual_inversion.py) learns new token embeddings from the gradient of the diffusion loss at
// the text encoder's input, and a LoRA of the text encoder (train_dreambooth_lora.py's
// --train_text_encoder) learns its Linear layers' adapters from their weights' gradients.
// ClipPass runs the forward pass of TextEncoder::Encode from the input embeddings (each
// position's token embedding plus its position embedding), keeping what the backward pass
// reads, and the backward pass from the encoder's output to those inputs and, where asked, to
// the weights of chosen Linear layers (their biases, LayerNorms and embeddings stay frozen):
//
//   per layer:  x += out(causal attention(LayerNorm1(x)));  x += fc2(act(fc1(LayerNorm2(x))))
//   after num_layers − skip_layers layers, then the final LayerNorm (final_norm).
//
// In float it computes what Encode computes, in the same order; in double it is the reference
// its gradients are checked with (model/text/clip_pass_test.cc).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/tensor/tensor_table.h"
#include "model/text/config.h"

namespace difftrain {

template <typename T>
class ClipPass {
 public:
  // A CLIP text model of `config` (kind CLIP) with its weights at `weights`, laid out as
  // TextEncoder::Tensors(config); they must outlive the pass and may change between passes.
  ClipPass(const TextEncoderConfig& config, const T* weights);

  // x [N, L, D] → out [N, L, D]: the hidden state after num_layers − skip_layers layers
  // (0 <= skip_layers < num_layers), through the final LayerNorm where final_norm. Keeps the
  // activations for Backward, replacing the last Forward's.
  void Forward(const T* x, int N, int L, int skip_layers, bool final_norm, T* out);
  // The gradient of the last Forward's x from its out's: dout [N, L, D] → dx [N, L, D]
  // (written), and the weight gradients SetWeightGradients asks for (added).
  void Backward(const T* dout, T* dx);
  // From the next Forward on, Backward adds the gradient of each Linear weight named in
  // `weights` (tensor names, e.g. text_model.encoder.layers.0.self_attn.q_proj.weight) into
  // `grads`, an arena laid out as the weights; the layers' inputs are kept for it. Only the
  // attention's and the MLP's Linear layers (q, k, v, out, fc1, fc2) have gradients here.
  void SetWeightGradients(T* grads, std::vector<std::string> weights);
  // The bytes the pass keeps between passes: the activations of the last Forward and Backward's
  // scratch (what TextEncoderMemory predicts).
  size_t HeldBytes() const;

 private:
  const T* W(const std::string& name) const;
  // Where module `name`'s weight gradient goes; null when it is not asked for.
  T* WeightGrad(const std::string& name) const;
  // LayerNorm `name` (affine) of rows × D: out, and the row statistics Backward reads.
  void Norm(const std::string& name, const T* in, T* out, T* mean, T* rstd) const;
  // The gradient of LayerNorm `name`'s input, added into din, from its output's.
  void NormBackward(const std::string& name, const T* dout, const T* in, const T* mean,
                    const T* rstd, T* din);

  TextEncoderConfig config_;
  TensorTable table_;
  const T* weights_;
  int N_ = 0, L_ = 0, taken_ = 0;
  bool final_norm_ = true;
  T* grads_ = nullptr;  // SetWeightGradients's
  std::vector<std::string> trained_;
  // Per layer: the stream entering it (x) and after its attention (mid), the LayerNorms'
  // statistics, q, k, v, the attention's probabilities [N, H, L, L], fc1's output before the
  // activation. Then the last stream and the final LayerNorm's statistics. With weight
  // gradients also the Linear layers' inputs: LayerNorm1's output (q, k, v's), the attention's
  // (out's), LayerNorm2's (fc1's); fc2's is act(pre).
  struct Layer {
    std::vector<T> x, mid, mean1, rstd1, mean2, rstd2, q, k, v, probs, pre;
    std::vector<T> normed1, attention, normed2;
  };
  std::vector<Layer> layers_;
  std::vector<T> last_, mean_, rstd_;
  std::vector<T> scratch_;  // Backward's [rows, D] temporary
};

extern template class ClipPass<float>;
extern template class ClipPass<double>;

}  // namespace difftrain
