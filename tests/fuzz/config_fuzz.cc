// libFuzzer target: the config.json readers of a pretrained folder's models — diffusers'
// UNet2DConditionModel, DiTTransformer2DModel and AutoencoderKL, transformers' CLIP and BERT
// text models — and of difftrain's own model configs (a checkpoint's metadata) on
// arbitrary JSON. `checkpoint.init_from`, `difftrain sample --pretrained` and the text encoders
// read these files from whatever folder a user names, so each must give a config or an error,
// never crash, hang or run into undefined behaviour (a float where an int belongs, sizes whose
// products overflow); and a UNet config that is read must lay out its tensors (the parameter
// table the weights are read into) and read back from its own JSON the same (a checkpoint's
// metadata holds it, which resuming reads). The input is the JSON; each reader takes it in turn.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/dit/config.h"
#include "model/dit/diffusers.h"
#include "model/text/config.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"
#include "model/vae/config.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain;
  const nlohmann::json json =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;

  Result<UNetConfig> unet = UNetConfig::FromJson(json);
  if (unet.ok() && unet->Validate().ok()) {
    const UNetPlan plan(*unet);
    if (ParameterCount(*unet) <= 0 || plan.table.total() == 0) std::abort();
    Result<UNetConfig> again = UNetConfig::FromJson(unet->ToJson());
    if (!again.ok() || again->ToJson() != unet->ToJson()) std::abort();
  }

  Result<DiTConfig> dit = DiTConfig::FromJson(json);
  if (dit.ok() && dit->Validate().ok()) {
    Result<DiTConfig> again = DiTConfig::FromJson(dit->ToJson());
    if (!again.ok() || again->ToJson() != dit->ToJson()) std::abort();
  }
  (void)DiTConfigFromDiffusers(json);

  Result<TextEncoderConfig> text = TextEncoderConfig::FromJson(json);
  if (text.ok()) (void)text->Validate();

  Result<VaeConfig> vae = VaeConfig::FromJson(json);
  if (vae.ok()) (void)vae->Validate();
  if (std::getenv("CONFIG_FUZZ_VERBOSE") != nullptr) {  // for reading what an input does
    const auto said = [](const auto& r) {
      return r.ok() ? (r->Validate().ok() ? std::string("valid") : r->Validate().message())
                    : r.status().message();
    };
    Result<std::optional<DiTConfig>> diffusers_dit = DiTConfigFromDiffusers(json);
    std::fprintf(stderr, "unet: %s\ndit: %s\ndiffusers dit: %s\ntext: %s\nvae: %s\n",
                 said(unet).c_str(), said(dit).c_str(),
                 !diffusers_dit.ok() ? diffusers_dit.status().message().c_str()
                 : *diffusers_dit    ? "valid"
                                     : "not one",
                 said(text).c_str(), said(vae).c_str());
  }
  return 0;
}
