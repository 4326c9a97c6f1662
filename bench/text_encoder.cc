// A text encoder with its tokenizer on the CPU (model/text/embedder.h): seconds to embed a
// batch of prompts, the median of several runs. bench/text_encoder.sh runs it beside
// transformers.
//
//   bench_text_encoder --encoder DIR [--length 77] [--texts 1] [--repeats 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "model/text/embedder.h"

namespace difftrain {
namespace {

using Clock = std::chrono::steady_clock;

using bench::Median;

int Run(const std::string& path, int length, int count, int repeats) {
  Result<TextEmbedder> embedder = TextEmbedder::Load(path);
  if (!embedder.ok()) {
    std::fprintf(stderr, "bench_text_encoder: %s\n", embedder.status().message().c_str());
    return 2;
  }
  // The prompts bench/text_encoder_torch.py embeds.
  std::vector<std::string> texts;
  for (int k = 0; k < count; ++k)
    texts.push_back(fmt::format("a photograph of an astronaut riding a horse, number {}", k));
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    if (!embedder->Embed(texts, length, 0).ok()) return 1;
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::printf("run %d: %.4f s\n", r, seconds.back());
  }
  std::printf("difftrain %s: %d text(s) of %d tokens in %.4f s (median of %d)\n",
              embedder->encoder().config().Describe().c_str(), count, length, Median(seconds),
              repeats);
  return 0;
}

}  // namespace
}  // namespace difftrain

int main(int argc, char** argv) {
  CLI::App app{"A text encoder and its tokenizer on the CPU, seconds per batch of prompts"};
  std::string encoder;
  int length = 77, texts = 1, repeats = 5;
  app.add_option("--encoder", encoder, "a text encoder folder (docs/text-encoders.md)")->required();
  app.add_option("--length", length, "tokens per text")->capture_default_str();
  app.add_option("--texts", texts, "prompts per call")->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::Run(encoder, length, texts, repeats);
}
