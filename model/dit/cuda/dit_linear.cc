// A DiT block's four Linear layers, in bf16 (Gemm) or in FP8 (Fp8Linears, DiT::Options::fp8).
#include <algorithm>
#include <utility>

#include "model/dit/cuda/dit.h"

namespace difftrain::cuda {

Status DiT::Fp8TakesMicroBatch(const DiTConfig& config, int B, const Options& options) {
  if (!options.fp8) return Status::Ok();
  const long long rows = static_cast<long long>(B) * config.frames() * config.tokens();
  const std::pair<const char*, long long> sizes[] = {
      {"hidden_size", config.hidden_size},
      {"the MLP width", config.mlp_hidden()},
      {"the tokens of a micro-batch (micro-batch × frames × tokens a frame)", rows}};
  for (const auto& [what, size] : sizes) {
    if (size % 16 != 0) {
      return Errorf("FP8 training needs {} to be a multiple of 16 (16-byte FP8 rows), found {}",
                    what, size);
    }
  }
  return Status::Ok();
}

std::vector<int> DiT::Fp8InFeatures(const DiTConfig& config) {
  const int D = config.hidden_size, M = config.mlp_hidden();
  std::vector<int> in;
  for (int l = 0; l < config.depth; ++l)
    in.insert(in.end(), {D, D, D, M});  // qkv, proj, fc1, fc2 (BlockLinear's order)
  return in;
}

size_t DiT::Fp8WorkspaceBytes(const DiTConfig& config, bool fp8, int B) {
  if (!fp8) return 0;
  const int N = B * config.frames() * config.tokens();
  return Fp8Linears::WorkspaceBytes(Fp8InFeatures(config), N,
                                    std::max(3 * config.hidden_size, config.mlp_hidden()));
}

void DiT::BindFp8() {
  if (fp8_ == nullptr) return;
  const int N = batch_ * config_.frames() * config_.tokens();
  fp8_->Bind(fp8_workspace_, N, std::max(3 * config_.hidden_size, config_.mlp_hidden()));
}

void DiT::LinearForward(int l, BlockLinear which, bf16* out, const bf16* in, size_t w, size_t b,
                        int N, int I, int O, Epilogue epilogue, bf16* aux) {
  if (fp8_ != nullptr) {
    fp8_->Forward(gemm_, kBlockLinears * l + which, out, in, W(w), W(b), N, I, O, epilogue, aux);
  } else {
    gemm_.Forward(out, in, W(w), W(b), N, I, O, epilogue, aux);
  }
}

void DiT::LinearBackward(int l, BlockLinear which, size_t w, bf16* din, const bf16* dout,
                         const bf16* in, int N, int I, int O, const bf16* gelu_pre, float* dbias) {
  if (fp8_ != nullptr) {
    fp8_->Backward(gemm_, kBlockLinears * l + which, G(w), /*accumulate=*/!overwrite_, din, dout,
                   in, W(w), N, I, O, gelu_pre, dbias, dbias != nullptr ? bias_scratch_ : nullptr);
    return;
  }
  WeightGradient(w, dout, in, N, I, O);
  if (dbias != nullptr) {
    gemm_.BackwardInputGeluAndBias(din, dbias, dout, W(w), N, I, O, gelu_pre, bias_scratch_);
  } else {
    gemm_.BackwardInput(din, dout, W(w), N, I, O, gelu_pre);
  }
}

}  // namespace difftrain::cuda
