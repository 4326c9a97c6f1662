// The attention kernels alone, at a DiT's shapes, each timed apart from the step around it: what
// bench_cuda_dit's whole step cannot say when one variant of the flash kernels is faster than
// another by less than the step's spread.
//
//   bench_cuda_attention [--batch 32] [--tokens 256] [--hidden 1152] [--heads 16]
//                        [--kernels flash,flash-pipelined,gemm,fused] [--reps 30]
//
// Kernels: flash and flash-pipelined (one and two stages), flash-wide and flash-pipelined-wide
// (their forward with two m-tiles a warp, the same backward), flash-pipelined-wide-stored (that
// forward, and the two-stage backward with dQ from the score gradients the dK/dV kernel stores:
// FlashAttentionBackwardStored), flash-short (one warp a sequence and head, at most 16 tokens:
// FlashAttentionForwardShort), gemm (cuBLASLt batched GEMMs over materialised scores), fused
// (the wmma kernels) and cudnn (cuDNN's fused flash attention, model/cuda/cudnn_attention.h:
// its plans are built before anything is timed; no cuDNN or no plan is exit 2, with cuDNN's
// message).
//
// For each kernel: the forward (out and lse from a packed qkv [B, T, 3·D]) and the backward
// (dqkv from dout, given the forward's out and lse), each timed with CUDA events around one
// launch sequence, the median of --reps after 3 untimed runs, over two input sets in turn
// (bf16 normal, scale 1.5: rows of the softmax far from uniform) so that no run finds its
// inputs in L2 from the run before. Before timing, every kernel's out and dqkv are compared
// with the first kernel's (relative L2): a kernel that computes something else is reported
// ("matches_first": false in its row), and the program exits 1. One JSON line per kernel on stdout;
// TFLOP/s counts the products FlashAttention counts, 2 in the forward (4·B·H·T²·hd FLOPs) and 5 in
// the backward (the flash kernels compute 7: S and dP twice, for a backward without atomics; 5
// with the stored score gradients, which go through memory instead).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/cuda_bench.h"
#include "model/cuda/attention.h"
#include "model/cuda/cudnn_attention.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/device_query.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemm_attention.h"

namespace difftrain {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

struct Options {
  int batch = 32, tokens = 256, hidden = 1152, heads = 16;
  std::string kernels = "flash,flash-pipelined,gemm,fused";
  int reps = 30;
};

// One input set: qkv and dout drawn from `seed`.
struct Inputs {
  DeviceBuffer<bf16> qkv, dout;
};

double RelativeL2(const std::vector<bf16>& got, const std::vector<bf16>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = __bfloat162float(got[i]), w = __bfloat162float(want[i]);
    if (!std::isfinite(g)) return INFINITY;
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return std::sqrt(diff / norm);
}

// A kernel's forward and backward over the shapes of `o`, on `stream`.
struct Kernel {
  std::string name;
  std::function<void(bf16* out, float* lse, const bf16* qkv)> forward;
  std::function<void(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                     const float* lse)>
      backward;
};

int Run(const Options& o) {
  const int B = o.batch, T = o.tokens, D = o.hidden, H = o.heads, hd = D / H;
  if (D % H != 0 || !cuda::FlashAttentionTakes(hd)) {
    std::fprintf(stderr, "bench_cuda_attention: head dim %d/%d is not one the kernels take\n", D,
                 H);
    return 2;
  }
  const std::vector<cuda::DeviceProperties> devices = bench::GpusOrSayWhy("bench_cuda_attention");
  if (devices.empty()) return 1;
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::Gemm gemm(stream);

  const size_t n_qkv = size_t(B) * T * 3 * D, n_out = size_t(B) * T * D;
  const size_t n_lse = size_t(B) * H * T;
  const size_t workspace_floats = std::max(
      {cuda::AttentionBackwardWorkspace(B, T, D, H), cuda::FlashAttentionBackwardWorkspace(B, T, H),
       cuda::FlashAttentionBackwardStoredWorkspace(B, T, D, H),
       cuda::GemmAttentionTakes(T, D, H) ? (cuda::GemmAttentionWorkspaceBytes(B, T, D, H) + 3) / 4
                                         : size_t{0}});
  DeviceBuffer<float> workspace(workspace_floats), lse(n_lse);
  DeviceBuffer<bf16> out(n_out), dqkv(n_qkv);
  Inputs sets[2] = {
      {bench::RandomDevice<bf16>(n_qkv, 1, 1.5), bench::RandomDevice<bf16>(n_out, 2, 1.0)},
      {bench::RandomDevice<bf16>(n_qkv, 3, 1.5), bench::RandomDevice<bf16>(n_out, 4, 1.0)}};

  using Backward = decltype(Kernel::backward);
  const Backward flash_backward = [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y,
                                      const float* l) {
    cuda::FlashAttentionBackward(dx, dy, x, y, l, workspace.data(), B, T, D, H, stream);
  };
  const Backward pipelined_backward = [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y,
                                          const float* l) {
    cuda::FlashAttentionBackwardPipelined(dx, dy, x, y, l, workspace.data(), B, T, D, H, stream);
  };
  cuda::CudnnAttention cudnn;  // prepared only where chosen
  std::vector<Kernel> all = {
      {"flash",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForward(y, l, x, B, T, D, H, stream);
       },
       flash_backward},
      {"flash-pipelined",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForwardPipelined(y, l, x, B, T, D, H, stream);
       },
       pipelined_backward},
      // The forward with two m-tiles a warp; the backward of its stage count.
      {"flash-wide",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForwardWide(y, l, x, B, T, D, H, cuda::FlashStages::kOne, stream);
       },
       flash_backward},
      {"flash-pipelined-wide",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForwardWide(y, l, x, B, T, D, H, cuda::FlashStages::kTwo, stream);
       },
       pipelined_backward},
      {"flash-pipelined-wide-stored",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForwardWide(y, l, x, B, T, D, H, cuda::FlashStages::kTwo, stream);
       },
       [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y, const float* l) {
         cuda::FlashAttentionBackwardStored(dx, dy, x, y, l, workspace.data(), B, T, D, H,
                                            cuda::FlashStages::kTwo, stream);
       }},
      // At most 16 tokens (Latte's temporal attention over 16 frames): one warp a sequence.
      {"flash-short",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::FlashAttentionForwardShort(y, l, x, B, T, D, H, stream);
       },
       [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y, const float* l) {
         cuda::FlashAttentionBackwardShort(dx, dy, x, y, l, B, T, D, H, stream);
       }},
      {"fused",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::AttentionForward(y, l, x, B, T, D, H, stream);
       },
       [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y, const float* l) {
         cuda::AttentionBackward(dx, dy, x, y, l, workspace.data(), B, T, D, H, stream);
       }},
      // cuDNN's fused flash attention (its SDPA graphs; the deterministic backward).
      {"cudnn",
       [&](bf16* y, float* l, const bf16* x) { cudnn.Forward(y, l, x, B, T, D, H, stream); },
       [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y, const float* l) {
         cudnn.Backward(dx, dy, x, y, l, B, T, D, H, stream);
       }},
      {"gemm",
       [&](bf16* y, float* l, const bf16* x) {
         cuda::GemmAttentionForward(gemm, y, l, x, workspace.data(), B, T, D, H);
       },
       [&](bf16* dx, const bf16* dy, const bf16* x, const bf16* y, const float* l) {
         cuda::GemmAttentionBackward(gemm, dx, dy, x, y, l, workspace.data(), B, T, D, H);
       }},
  };
  std::vector<Kernel> chosen;
  std::stringstream names(o.kernels);
  for (std::string name; std::getline(names, name, ',');) {
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const Kernel& k) { return k.name == name; });
    if (it == all.end()) {
      std::fprintf(stderr, "bench_cuda_attention: unknown kernel '%s'\n", name.c_str());
      return 2;
    }
    if (name == "gemm" && !cuda::GemmAttentionTakes(T, D, H)) {
      std::fprintf(stderr, "bench_cuda_attention: the GEMM attention does not take T=%d\n", T);
      return 2;
    }
    if (name == "flash-short" && !cuda::FlashShortFits(T, T)) {
      std::fprintf(stderr, "bench_cuda_attention: flash-short takes up to %d tokens, not %d\n",
                   cuda::kFlashShortRows, T);
      return 2;
    }
    if (name == "cudnn") {
      if (const Status s = cudnn.Prepare(B, T, D, H); !s.ok()) {
        std::fprintf(stderr, "bench_cuda_attention: %s\n", s.message().c_str());
        return 2;
      }
    }
    chosen.push_back(*it);
  }

  // Same results first: every kernel's out and dqkv against the first kernel's, on set 0.
  std::vector<bf16> want_out, want_dqkv;
  std::vector<bool> matches;  // each chosen kernel's results within 2e-2 of the first's
  int status = 0;
  for (const Kernel& k : chosen) {
    DT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.bytes(), stream));  // NaN
    DT_CUDA_CHECK(cudaMemsetAsync(dqkv.data(), 0xff, dqkv.bytes(), stream));
    k.forward(out.data(), lse.data(), sets[0].qkv.data());
    k.backward(dqkv.data(), sets[0].dout.data(), sets[0].qkv.data(), out.data(), lse.data());
    DT_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<bf16> got_out = out.Download(), got_dqkv = dqkv.Download();
    if (want_out.empty()) {
      want_out = std::move(got_out);
      want_dqkv = std::move(got_dqkv);
      matches.push_back(true);
      continue;
    }
    const double e_out = RelativeL2(got_out, want_out), e_dqkv = RelativeL2(got_dqkv, want_dqkv);
    matches.push_back(e_out < 2e-2 && e_dqkv < 2e-2);
    if (!matches.back()) {
      std::fprintf(stderr,
                   "bench_cuda_attention: %s differs from %s: out %.3g, dqkv %.3g relative L2\n",
                   k.name.c_str(), chosen.front().name.c_str(), e_out, e_dqkv);
      status = 1;
    }
  }

  bench::EventTimer timer(stream);
  const auto time = [&](const std::function<void()>& launch) { return timer.Time(launch); };
  const double forward_flop = 4.0 * B * H * double(T) * T * hd, backward_flop = 2.5 * forward_flop;
  for (size_t i_kernel = 0; i_kernel < chosen.size(); ++i_kernel) {
    const Kernel& k = chosen[i_kernel];
    std::vector<double> forward_ms, backward_ms;
    for (int i = 0; i < 3 + o.reps; ++i) {
      const Inputs& in = sets[i % 2];
      const double f = time([&] { k.forward(out.data(), lse.data(), in.qkv.data()); });
      const double b = time(
          [&] { k.backward(dqkv.data(), in.dout.data(), in.qkv.data(), out.data(), lse.data()); });
      if (i >= 3) {
        forward_ms.push_back(f);
        backward_ms.push_back(b);
      }
    }
    const double f = bench::Median(forward_ms), b = bench::Median(backward_ms);
    const nlohmann::json row = {
        {"kernel", k.name},
        {"matches_first", bool(matches[i_kernel])},
        {"batch", B},
        {"tokens", T},
        {"hidden", D},
        {"heads", H},
        {"reps", o.reps},
        {"forward_ms", f},
        {"backward_ms", b},
        {"forward_ms_min", *std::min_element(forward_ms.begin(), forward_ms.end())},
        {"backward_ms_min", *std::min_element(backward_ms.begin(), backward_ms.end())},
        {"forward_tflops", forward_flop / (f / 1e3) / 1e12},
        {"backward_tflops", backward_flop / (b / 1e3) / 1e12},
        {"gpu_name", devices.front().name}};
    std::printf("%s\n", row.dump().c_str());
  }
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
  return status;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  difftrain::Options o;
  CLI::App app{"Times the attention kernels alone at a DiT's shapes on one GPU"};
  app.add_option("--batch", o.batch, "sequences (a DiT's micro-batch; Latte: videos x frames)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens a sequence (DiT-XL/2 at 256 px: 256)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden size D")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heads", o.heads, "heads H")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kernels", o.kernels,
                 "comma-separated, the first the reference for the others' results: flash, "
                 "flash-pipelined, flash-wide, flash-pipelined-wide, flash-pipelined-wide-stored, "
                 "flash-short (at most 16 tokens), "
                 "gemm, fused, cudnn")
      ->capture_default_str();
  app.add_option("--reps", o.reps, "timed runs of each")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(o);
}
