// Fusing a LoRA into Stable Diffusion 1.5's UNet (model/io/lora.h): seconds for FuseLora of a
// rank-R kohya LoRA (F16, alphas) of every Linear and convolution of the UNet's blocks, the
// modules LCM-LoRA adapts (attention projections, proj_in/out, feed-forwards, resnets' convs,
// shortcuts and time projections, up- and downsamplers): the median of several runs.
// bench/lora_fuse.sh runs it (docs/benchmarks.md).
//
//   bench_lora_fuse [--rank 64] [--repeats 3] [--config SD1.5] [--keep LORA.safetensors]
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench/median.h"
#include "model/io/lora.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain {
namespace {

using Clock = std::chrono::steady_clock;

// A float's F16 bits (round to nearest even; the values here are normal and small).
uint16_t ToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int exponent = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  uint32_t mantissa = x & 0x7fffffu;
  uint32_t half = sign | (uint32_t(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

int Run(const std::string& config_name, int rank, int repeats, const std::string& keep) {
  Result<UNetConfig> config = UNetConfigByName(config_name);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_lora_fuse: %s\n", config.status().message().c_str());
    return 2;
  }
  const UNetPlan plan(*config);
  // Every weight of 2 or 4 dimensions inside the blocks (Linears and convolutions).
  io::SafetensorsWriter writer;
  std::vector<std::vector<uint16_t>> data;
  Rng rng(1, RngStream::kInit);
  const auto random = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (uint16_t& h : v)
      h = ToHalf(static_cast<float>(0.02 * rng.Normal()));
    return v;
  };
  int modules = 0;
  double macs = 0, lora_params = 0;
  const uint16_t alpha = ToHalf(static_cast<float>(rank) / 2);
  for (const TensorSpec& t : plan.table.tensors()) {
    const bool in_blocks = t.name.starts_with("down_blocks.") ||
                           t.name.starts_with("mid_block.") || t.name.starts_with("up_blocks.");
    if (!in_blocks || !t.name.ends_with(".weight") || (t.shape.size() != 2 && t.shape.size() != 4))
      continue;
    std::string base = "lora_unet_" + t.name.substr(0, t.name.size() - 7);
    std::replace(base.begin(), base.end(), '.', '_');
    std::vector<int64_t> down = t.shape, up = {t.shape[0], rank};
    down[0] = rank;
    if (t.shape.size() == 4) up.insert(up.end(), {1, 1});
    const size_t in = t.numel / t.shape[0];
    data.push_back(random(rank * in));
    writer.Add(base + ".lora_down.weight", io::DType::kF16, down, data.back().data());
    data.push_back(random(t.shape[0] * rank));
    writer.Add(base + ".lora_up.weight", io::DType::kF16, up, data.back().data());
    writer.Add(base + ".alpha", io::DType::kF16, {}, &alpha);
    ++modules;
    macs += double(t.numel) * rank;
    lora_params += double(rank) * (in + t.shape[0]);
  }
  const std::string path =
      !keep.empty() ? keep
                    : (std::filesystem::temp_directory_path() /
                       fmt::format("bench_lora_{}.safetensors", getpid()))
                          .string();
  if (Status s = writer.WriteAtomic(path); !s.ok()) {
    std::fprintf(stderr, "bench_lora_fuse: %s\n", s.message().c_str());
    return 1;
  }
  std::vector<float> params(plan.table.total(), 0.01f);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    Result<io::LoraFused> fused =
        io::FuseLora(path, 1.0, {{io::kLoraUNet, &plan.table, params.data()}});
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!fused.ok()) {
      std::fprintf(stderr, "bench_lora_fuse: %s\n", fused.status().message().c_str());
      return 1;
    }
    std::printf("run %d: %d modules in %.3f s\n", r, fused->modules, seconds.back());
  }
  if (keep.empty()) std::filesystem::remove(path);
  const double median = bench::Median(seconds);
  std::printf(
      "difftrain FuseLora: %s, rank %d, %d modules (%.1f M LoRA parameters), %.2f GMAC: %.3f s "
      "(median of %d), %.1f GMAC/s\n",
      config_name.c_str(), rank, modules, lora_params / 1e6, macs / 1e9, median, repeats,
      macs / 1e9 / median);
  return 0;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  CLI::App app{"Fusing a kohya LoRA into a Stable Diffusion UNet, seconds"};
  std::string config = "SD1.5";
  int rank = 64, repeats = 3;
  std::string keep;
  app.add_option("--config", config, "the UNet (SD1.5, SD2-base, SD2-v)")->capture_default_str();
  app.add_option("--rank", rank, "the LoRA's rank")->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs")->capture_default_str();
  app.add_option("--keep", keep, "write the LoRA here and keep it (for bench/lora_fuse_torch.py)");
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(config, rank, repeats, keep);
}
