// The fused gated residual + LayerNorm-modulate (model/cuda/modulate.h) alone, at a DiT block's
// shapes, against the memory's rate measured in the same run: whether the kernels move their
// bytes near that rate, and which rows a block does it best. The whole step (bench_cuda_dit)
// cannot say: the norms are a tenth of it.
//
//   bench_cuda_norms [--batch 32] [--tokens 256] [--hidden 1152] [--rows 8,16,32] [--reps 30]
//
// For each rows-a-block: the forward (x' = x + gate·y and h = LN(x')·(1 + scale) + shift, as
// between a block's attention and MLP branches) and the backward (dx, dy = gate·dx, the adaLN and
// bias gradients), each the median of --reps CUDA-event timings after 3 untimed runs, over two
// input sets in turn so that no run finds its inputs in L2 from the run before. The bytes each
// must move at least (every input read once, every output written once): forward x, x' (fp32) and
// y, h (bf16), 12 a feature; backward x, dx read and written (fp32) and dh, y, dy (bf16), 18 a
// feature; the backward's partial sums besides. They are divided by the time and by the rate of
// a device-to-device copy of 1 GiB (bytes read plus written) timed the same way. One JSON line
// per rows-a-block, one for the copy.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/cuda_bench.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/device_query.h"
#include "model/cuda/modulate.h"

namespace difftrain {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

struct Options {
  int batch = 32, tokens = 256, hidden = 1152;
  std::string rows = "8,16,32";
  int reps = 30;
};

// One input set: the stream, the branch, the adaLN output, and the gradients from above.
struct Inputs {
  Inputs(size_t n, size_t ada, uint64_t seed)
      : x(bench::RandomDevice<float>(n, seed, 1.0)),
        dx(bench::RandomDevice<float>(n, seed + 1, 1.0)),
        ada(bench::RandomDevice<float>(ada, seed + 2, 0.5)),
        y(bench::RandomDevice<bf16>(n, seed + 3, 1.0)),
        dh(bench::RandomDevice<bf16>(n, seed + 4, 1.0)) {}
  DeviceBuffer<float> x, dx, ada;
  DeviceBuffer<bf16> y, dh;
};

int Run(const Options& o) {
  const std::vector<cuda::DeviceProperties> devices = bench::GpusOrSayWhy("bench_cuda_norms");
  if (devices.empty()) return 1;
  std::vector<int> rows;
  std::stringstream list(o.rows);
  for (std::string r; std::getline(list, r, ',');) {
    rows.push_back(std::stoi(r));
    if (rows.back() <= 0) {
      std::fprintf(stderr, "bench_cuda_norms: rows a block must be positive, found %d\n",
                   rows.back());
      return 2;
    }
  }
  if (rows.empty()) {
    std::fprintf(stderr, "bench_cuda_norms: --rows names no rows a block\n");
    return 2;
  }
  const int B = o.batch, T = o.tokens, D = o.hidden, S = 6 * D;
  const size_t n = size_t(B) * T * D;
  cudaStream_t stream;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bench::EventTimer timer(stream);

  // The memory's rate: a device-to-device copy of 1 GiB, bytes read plus written.
  constexpr size_t kCopyBytes = size_t(1) << 30;
  {
    DeviceBuffer<unsigned char> from(kCopyBytes), to(kCopyBytes);
    std::vector<double> ms;
    for (int i = 0; i < 3 + 10; ++i) {
      const double t = timer.Time([&] {
        DT_CUDA_CHECK(
            cudaMemcpyAsync(to.data(), from.data(), kCopyBytes, cudaMemcpyDeviceToDevice, stream));
      });
      if (i >= 3) ms.push_back(t);
    }
    const double copy_gbs = 2.0 * kCopyBytes / (bench::Median(ms) / 1e3) / 1e9;
    std::printf("%s\n", nlohmann::json{{"kernel", "copy"},
                                       {"bytes", 2 * kCopyBytes},
                                       {"ms", bench::Median(ms)},
                                       {"gb_per_s", copy_gbs},
                                       {"gpu_name", devices.front().name}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }

  Inputs sets[2] = {{n, size_t(B) * S, 1}, {n, size_t(B) * S, 11}};
  DeviceBuffer<float> x_out(n), mean(size_t(B) * T), rstd(size_t(B) * T), d_ada(size_t(B) * S);
  DeviceBuffer<float> d_bias(D);
  DeviceBuffer<bf16> h(n), dy(n);
  // Sized for the fewest rows a block: the most partial sums.
  const int fewest = *std::min_element(rows.begin(), rows.end());
  DeviceBuffer<float> workspace(cuda::GatedResidualNormWorkspace(B, T, D, fewest));
  // A block's second norm: norm2 after the attention branch (adaLN chunks shift 3, scale 4,
  // gate 2), in place as in the DiT step.
  for (const int r : rows) {
    std::vector<double> forward_ms, backward_ms;
    for (int i = 0; i < 3 + o.reps; ++i) {
      Inputs& in = sets[i % 2];
      const cuda::GatedBranch branch{in.y.data(), in.ada.data(), S, 2 * D};
      const cuda::Modulation mod{in.ada.data(), S, 3 * D, 4 * D};
      const double f = timer.Time([&] {
        cuda::GatedResidualNormForward(x_out.data(), h.data(), mean.data(), rstd.data(),
                                       in.x.data(), branch, nullptr, mod, B, T, D, stream, r);
      });
      const double b = timer.Time([&] {
        cuda::GatedResidualNormBackward(in.dx.data(), d_ada.data(), dy.data(), d_ada.data(),
                                        d_bias.data(), in.dh.data(), x_out.data(), mean.data(),
                                        rstd.data(), mod, branch, workspace.data(), B, T, D, stream,
                                        r);
      });
      if (i >= 3) {
        forward_ms.push_back(f);
        backward_ms.push_back(b);
      }
    }
    const double f = bench::Median(forward_ms), b = bench::Median(backward_ms);
    const double forward_bytes = 12.0 * n, backward_bytes = 18.0 * n;
    // The partial sums: written by the backward's blocks and read by its reduction.
    const double partial_bytes = 2.0 * 4 * (cuda::GatedResidualNormWorkspace(B, T, D, r) - B * D);
    std::printf("%s\n", nlohmann::json{{"kernel", "gated-residual-norm"},
                                       {"rows_per_block", r},
                                       {"batch", B},
                                       {"tokens", T},
                                       {"hidden", D},
                                       {"reps", o.reps},
                                       {"forward_ms", f},
                                       {"backward_ms", b},
                                       {"forward_gb_per_s", forward_bytes / (f / 1e3) / 1e9},
                                       {"backward_gb_per_s", backward_bytes / (b / 1e3) / 1e9},
                                       {"backward_partial_bytes", partial_bytes},
                                       {"gpu_name", devices.front().name}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  difftrain::Options o;
  CLI::App app{"Times the fused gated residual + LayerNorm-modulate alone on one GPU"};
  app.add_option("--batch", o.batch, "samples (a DiT's micro-batch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens a sample (DiT-XL/2 at 256 px: 256)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden size D")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rows", o.rows, "comma-separated rows a block to time")->capture_default_str();
  app.add_option("--reps", o.reps, "timed runs of each")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(o);
}
