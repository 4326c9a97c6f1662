// The GPU side of model/cuda/adaln_kernels.h: the kernels, with the primitives of
// model/cuda/device_primitives.cuh, and their launchers (model/cuda/modulate.h). The layout
// (features a thread, threads a block) is chosen from D at the launch; every kernel instance the
// layouts need is compiled here.
#include "model/cuda/modulate.h"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "model/cuda/activation.h"
#include "model/cuda/adaln_kernels.h"
#include "model/cuda/device_primitives.cuh"

namespace difftrain::cuda {
namespace {

template <int W, int V>
__global__ void __launch_bounds__(adaln::kMaxThreads)
    GatedResidualNormForwardKernel(adaln::ForwardArgs args) {
  adaln::Forward<DevicePrimitives, W, V>(args);
}

template <int W, int V>
__global__ void __launch_bounds__(adaln::kMaxThreads)
    GatedResidualNormBackwardKernel(adaln::BackwardArgs args) {
  adaln::Backward<DevicePrimitives, W, V>(args);
}

__global__ void GatedResidualNormReduceKernel(adaln::ReduceArgs args) {
  adaln::ReduceAdaGrads<DevicePrimitives>(args);
}

// The vector path needs D, the strides and the slice offsets to be multiples of 4 and every
// row 16-byte (fp32) or 8-byte (bf16) aligned; (pointer, alignment) pairs, null ones skipped.
bool Vectorizable(int D, std::initializer_list<int> multiples_of_4,
                  std::initializer_list<std::pair<const void*, unsigned>> pointers) {
  if (D % 4 != 0) return false;
  for (const int n : multiples_of_4) {
    if (n % 4 != 0) return false;
  }
  for (const auto& [p, bytes] : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % bytes != 0) return false;
  }
  return true;
}

adaln::Layout CheckedLayout(int D, bool vector) {
  const adaln::Layout layout = adaln::LayoutFor(D, vector);
  DT_CHECK(layout.V > 0, "the adaLN kernels take rows of at most {} features{}, found {}",
           adaln::MaxFeatures(vector), vector ? "" : " when the row cannot use 16-byte vectors", D);
  return layout;
}

void CheckShape(int B, int T, int D, const Modulation& mod, const GatedBranch& branch) {
  DT_CHECK(B > 0 && T > 0 && D > 0, "bad shape B={} T={} D={}", B, T, D);
  DT_CHECK(mod.shift_offset >= 0 && mod.shift_offset + D <= mod.stride && mod.scale_offset >= 0 &&
               mod.scale_offset + D <= mod.stride,
           "adaLN slices at {} and {} (width {}) do not fit in stride {}", mod.shift_offset,
           mod.scale_offset, D, mod.stride);
  DT_CHECK(
      branch.y == nullptr || (branch.gate_offset >= 0 && branch.gate_offset + D <= branch.stride),
      "the gate's slice at {} (width {}) does not fit in stride {}", branch.gate_offset, D,
      branch.stride);
}

adaln::Branch KernelBranch(const GatedBranch& branch) {
  if (branch.y == nullptr) return {nullptr, nullptr, 0};
  return {Bits(branch.y), branch.ada + branch.gate_offset, branch.stride};
}

}  // namespace

void GatedResidualNormForward(float* x_out, bf16* h, float* mean, float* rstd, const float* x,
                              const GatedBranch& branch, const float* add, const Modulation& mod,
                              int B, int T, int D, cudaStream_t stream, int rows_per_block) {
  CheckShape(B, T, D, mod, branch);
  DT_CHECK(rows_per_block > 0, "rows per block {} must be positive", rows_per_block);
  DT_CHECK(x_out != nullptr || (branch.y == nullptr && add == nullptr),
           "a gated residual or an added embedding needs somewhere to write the stream");
  const bool vector = Vectorizable(
      D, {mod.stride, mod.shift_offset, mod.scale_offset, branch.stride, branch.gate_offset},
      {{x_out, 16}, {h, 8}, {x, 16}, {branch.y, 8}, {branch.ada, 16}, {add, 16}, {mod.ada, 16}});
  const adaln::Layout layout = CheckedLayout(D, vector);
  const adaln::ForwardArgs args{
      x_out,
      Bits(h),
      mean,
      rstd,
      x,
      KernelBranch(branch),
      add,
      {mod.ada + mod.shift_offset, mod.ada + mod.scale_offset, mod.stride},
      B,
      T,
      D,
      layout.threads,
      rows_per_block};
  const dim3 grid(adaln::Chunks(T, rows_per_block), B);
  adaln::WithLayout(layout, [&](auto w, auto v) {
    GatedResidualNormForwardKernel<decltype(w)::value, decltype(v)::value>
        <<<grid, layout.threads, adaln::kSmemBytes, stream>>>(args);
  });
  DT_CUDA_CHECK_LAUNCH();
}

int GatedResidualNormMaxWidth() {
  return adaln::MaxFeatures(true);
}

size_t GatedResidualNormWorkspace(int B, int T, int D, int rows_per_block) {
  return adaln::PartialFloats(B, T, D, rows_per_block) + size_t(B) * D;
}

void GatedResidualNormBackward(float* dx, float* d_mod_ada, bf16* dy, float* d_gate_ada,
                               float* d_bias, const bf16* dh, const float* x, const float* mean,
                               const float* rstd, const Modulation& mod, const GatedBranch& branch,
                               float* workspace, int B, int T, int D, cudaStream_t stream,
                               int rows_per_block) {
  CheckShape(B, T, D, mod, branch);
  DT_CHECK(rows_per_block > 0, "rows per block {} must be positive", rows_per_block);
  const bool gated = branch.y != nullptr;
  DT_CHECK(!gated || (dy != nullptr && d_gate_ada != nullptr),
           "a gated residual's backward needs dy and the gate's gradient");
  float* partials = workspace;
  float* bias_rows = workspace + adaln::PartialFloats(B, T, D, rows_per_block);
  const bool vector =
      Vectorizable(D, {mod.stride, mod.scale_offset, branch.stride, branch.gate_offset},
                   {{dx, 16},
                    {dy, 8},
                    {partials, 16},
                    {dh, 8},
                    {x, 16},
                    {mod.ada, 16},
                    {branch.y, 8},
                    {branch.ada, 16}});
  const adaln::Layout layout = CheckedLayout(D, vector);
  const adaln::BackwardArgs args{
      dx,
      gated ? Bits(dy) : nullptr,
      partials,
      Bits(dh),
      x,
      mean,
      rstd,
      {mod.ada + mod.shift_offset, mod.ada + mod.scale_offset, mod.stride},
      KernelBranch(branch),
      B,
      T,
      D,
      layout.threads,
      rows_per_block};
  adaln::WithLayout(layout, [&](auto w, auto v) {
    GatedResidualNormBackwardKernel<decltype(w)::value, decltype(v)::value>
        <<<dim3(adaln::Chunks(T, rows_per_block), B), layout.threads, adaln::kSmemBytes, stream>>>(
            args);
  });
  DT_CUDA_CHECK_LAUNCH();
  const adaln::ReduceArgs reduce{partials,
                                 d_mod_ada + mod.shift_offset,
                                 d_mod_ada + mod.scale_offset,
                                 mod.stride,
                                 gated ? d_gate_ada + branch.gate_offset : nullptr,
                                 branch.stride,
                                 gated ? bias_rows : nullptr,
                                 B,
                                 T,
                                 D,
                                 rows_per_block};
  const dim3 grid((D + adaln::kReduceThreads - 1) / adaln::kReduceThreads, B);
  GatedResidualNormReduceKernel<<<grid, adaln::kReduceThreads, 0, stream>>>(reduce);
  DT_CUDA_CHECK_LAUNCH();
  if (gated && d_bias != nullptr) BiasGradient(d_bias, bias_rows, B, D, stream);
}

}  // namespace difftrain::cuda
