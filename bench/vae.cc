// The VAE's encoder and decoder on the CPU (model/vae/vae.h): seconds per image at a size,
// the median of several runs. bench/vae.sh runs it beside diffusers' AutoencoderKL.
//
//   bench_vae --vae DIR [--image-size 256] [--batch 1] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "model/tensor/rng.h"
#include "model/vae/vae.h"

namespace difftrain {
namespace {

using Clock = std::chrono::steady_clock;

using bench::Median;

int Run(const std::string& path, int size, int batch, int repeats) {
  Result<Vae> vae = Vae::Load(path);
  if (!vae.ok()) {
    std::fprintf(stderr, "bench_vae: %s\n", vae.status().message().c_str());
    return 2;
  }
  const VaeConfig& c = vae->config();
  const int h = size / c.downscale();
  std::vector<float> images(size_t(batch) * c.in_channels * size * size);
  Rng rng(1, RngStream::kData);
  for (float& v : images)
    v = static_cast<float>(2 * rng.Uniform() - 1);
  std::vector<float> mean(size_t(batch) * c.latent_channels * h * h), logvar(mean.size());
  std::vector<float> decoded(size_t(batch) * c.out_channels * size * size);
  std::vector<double> encode, decode;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    if (!vae->EncodeMoments(images.data(), batch, size, size, mean.data(), logvar.data()).ok())
      return 1;
    const auto t1 = Clock::now();
    if (!vae->Decode(mean.data(), batch, h, h, decoded.data()).ok()) return 1;
    const auto t2 = Clock::now();
    encode.push_back(std::chrono::duration<double>(t1 - t0).count() / batch);
    decode.push_back(std::chrono::duration<double>(t2 - t1).count() / batch);
    std::printf("run %d: encode %.3f s/image, decode %.3f s/image\n", r, encode.back(),
                decode.back());
  }
  std::printf("difftrain %dpx batch %d: encode %.3f s/image, decode %.3f s/image (median of %d)\n",
              size, batch, Median(encode), Median(decode), repeats);
  return 0;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  CLI::App app{"The VAE's encoder and decoder on the CPU, seconds per image"};
  std::string vae;
  int size = 256, batch = 1, repeats = 3;
  app.add_option("--vae", vae, "a diffusers AutoencoderKL folder")->required();
  app.add_option("--image-size", size, "image height and width")->capture_default_str();
  app.add_option("--batch", batch, "images per call")->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(vae, size, batch, repeats);
}
