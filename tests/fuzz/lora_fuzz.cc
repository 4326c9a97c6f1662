// libFuzzer target: fusing a LoRA file (model/io/lora.h: peft's, diffusers' older, the
// attention processors' and kohya's key forms; F16, BF16, F32, F64) on arbitrary bytes.
// LoRAs are downloaded from wherever a user found them and handed to `difftrain sample --lora`
// and `checkpoint.init_from`; a file must fuse or be an error, never crash, hang or write
// outside the weights it adapts. The targets are a small UNet's and text encoder's tables
// under diffusers' names (a Linear with its bias, the attention's output, a 3×3 and a 1×1
// convolution, the text encoder's q_proj and fc1); text_encoder_2 is skipped. Each weight
// sits between guard values that must come out unchanged, and a file that fuses must leave
// every weight it does not adapt as it was: the untouched ones are checked against their
// starting values.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/io/lora.h"
#include "tests/fuzz/memory_file.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

namespace {

using difftrain::TensorTable;

TensorTable UNetTable() {
  TensorTable t;
  t.Add("conv_in.weight", {8, 4, 3, 3});
  t.Add("conv_in.bias", {8});
  t.Add("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight", {8, 8});
  t.Add("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0.weight", {8, 8});
  t.Add("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0.bias", {8});
  t.Add("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", {8, 12});
  t.Add("down_blocks.0.resnets.0.conv_shortcut.weight", {8, 4, 1, 1});
  t.Add("time_embedding.linear_1.weight", {16, 8});
  return t;
}

TensorTable TextTable() {
  TensorTable t;
  t.Add("text_model.encoder.layers.0.self_attn.q_proj.weight", {12, 12});
  t.Add("text_model.encoder.layers.0.mlp.fc1.weight", {24, 12});
  return t;
}

constexpr int kGuard = 64;           // guard floats on each side of a component's weights
constexpr float kGuardValue = 7.0f;  // what they hold

// A component's weights between two guards, each weight starting at a value of its own.
struct Weights {
  explicit Weights(const TensorTable& table) : values(table.total() + 2 * kGuard, kGuardValue) {
    for (size_t i = 0; i < table.total(); ++i)
      values[kGuard + i] = Start(i);
  }
  static float Start(size_t i) { return 0.01f * float(i % 97) - 0.3f; }
  float* params() { return values.data() + kGuard; }
  bool GuardsIntact(const TensorTable& table) const {
    for (int g = 0; g < kGuard; ++g) {
      if (values[g] != kGuardValue || values[kGuard + table.total() + g] != kGuardValue)
        return false;
    }
    return true;
  }
  std::vector<float> values;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain;
  static const TensorTable unet = UNetTable(), text = TextTable();
  const fuzz::MemoryFile file(data, size);
  const std::string path = file.path();
  Weights unet_weights(unet), text_weights(text);
  const std::vector<io::LoraTarget> targets = {
      {io::kLoraUNet, &unet, unet_weights.params()},
      {io::kLoraTextEncoder, &text, text_weights.params()}};
  Result<io::LoraFused> fused =
      io::FuseLora(path, 0.75, targets, {io::kLoraTextEncoder2}, "the fuzz target skips it");
  if (std::getenv("LORA_FUZZ_VERBOSE") != nullptr) {  // for reading what an input does
    std::fprintf(stderr, "%s\n",
                 fused.ok()
                     ? fmt::format("fused {} modules, rank {}", fused->modules, fused->rank).c_str()
                     : fused.status().message().c_str());
  }
  if (!unet_weights.GuardsIntact(unet) || !text_weights.GuardsIntact(text)) std::abort();
  if (!fused.ok()) return 0;
  if (fused->modules < 0 || fused->rank < 0 || (fused->modules > 0) != (fused->rank > 0))
    std::abort();
  // Biases are never adapted: a fused file leaves them as they were.
  for (const auto* table : {&unet, &text}) {
    Weights& w = table == &unet ? unet_weights : text_weights;
    for (const TensorSpec& t : table->tensors()) {
      if (!t.name.ends_with(".bias")) continue;
      for (size_t i = 0; i < t.numel; ++i) {
        if (w.params()[t.offset + i] != Weights::Start(t.offset + i)) std::abort();
      }
    }
  }
  return 0;
}
