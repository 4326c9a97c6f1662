// cuDNN's fused flash attention (its SDPA graphs, through cuDNN's frontend graph API) for
// self-attention over a packed qkv: the same layout as model/cuda/attention.h's kernels — qkv
// [B, T, 3·D] bf16 (q, k, v side by side, head h at columns h·hd … h·hd+hd−1 of each), out
// [B, T, D] bf16, lse [B, H, T] fp32, the natural log of each query row's exponential sum of
// scaled scores (cuDNN's softmax statistics), dqkv [B, T, 3·D] — so a model can take it in place
// of the flash kernels (cuda::DiT's AttentionKernels::kCudnn; cuda::UNet's self-attention with
// UNet::Options::cudnn_attention, through a CudnnAttentionSet of its levels' shapes). The backward
// is cuDNN's deterministic one (it stores dP and sums dQ in order: the same bits every run), which
// the project's restarts need.
//
// cuDNN is opened at run time (libcudnn.so.9, as cuBLASLt is: the programs run where it is
// not installed and say why when asked for it); the frontend is a header-only library fetched
// at configure time (scripts/cudnn_frontend.sh), and a build without it compiles this file to
// refuse, naming the reason. Written without a GPU: `cuda_cudnn_attention_test` (gpu) holds it
// to the CPU reference, the graph capture and determinism; the CPU test checks that each shape
// DiT and Latte use passes the frontend's own validation for sm_90 and sm_80.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "model/cuda/common.h"

namespace difftrain::cuda {

// Ok where this build has cuDNN's frontend and libcudnn.so.9 (version 9.x) opens; else why not.
Status CudnnAttentionAvailable();

// Whether cuDNN's attention takes this head dim (a multiple of 8 up to 128), whatever the build.
bool CudnnAttentionTakes(int head_dim);

// What cuDNN's frontend says of the forward and backward graphs of a shape without building
// plans (no GPU needed): Ok, or its message. `sm` is the target (90: H100/H200, 80: A100).
Status CudnnAttentionValidate(int B, int T, int D, int H, int sm);

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds the forward and backward plans of B sequences of T tokens, width D, H heads, on the
  // current GPU (a handle, heuristics, the plans), and allocates their workspace: everything
  // a step needs, before any capture. A shape already prepared costs nothing; another one
  // replaces it. Errors name cuDNN and the shape (no plan for it, no cuDNN, out of memory).
  Status Prepare(int B, int T, int D, int H);
  // Device bytes Prepare allocated (the larger plan's workspace).
  size_t workspace_bytes() const;
  // cuDNN's version as it reported it (e.g. 91900), 0 before Prepare.
  int version() const;

  // On `stream`, for the prepared shape (DT_CHECK otherwise).
  void Forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
               cudaStream_t stream);
  void Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                int B, int T, int D, int H, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cuDNN's attention at the several shapes of one model (a UNet's levels): one CudnnAttention a
// shape, made when a layer first asks for it (no GPU needed), prepared together once every layer
// has asked.
class CudnnAttentionSet {
 public:
  // The attention of this shape: the same object every time it is asked for; unprepared until
  // Prepare.
  CudnnAttention* Get(int B, int T, int D, int H);
  // Prepares every shape asked for; the first that fails is the error, naming its shape.
  Status Prepare();
  // Forgets every shape (their objects with them).
  void Clear() { shapes_.clear(); }
  int size() const { return static_cast<int>(shapes_.size()); }
  // Device bytes of every prepared shape's workspace.
  size_t workspace_bytes() const;

 private:
  std::map<std::array<int, 4>, std::unique_ptr<CudnnAttention>> shapes_;
};

}  // namespace difftrain::cuda
