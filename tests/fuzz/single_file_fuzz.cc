// libFuzzer target: reading an original Stable Diffusion single-file checkpoint
// (model/io/ldm_checkpoint.h) — the UNet's and the VAE's configs from the tensors' names and
// shapes, which kind of checkpoint it is, its text models, and the mapping between diffusers'
// names and the file's. `difftrain sample --pretrained model.safetensors` and
// `checkpoint.init_from` read whatever file a user downloaded this way: each must give a config
// or an error naming what is missing, never crash, hang or run into undefined behaviour.
//
// The input is the file's tensors, one a line, `NAME D0,D1,…` (a shape of no dimensions: the
// name alone); the target writes them as a safetensors file of F16 zeros (the data sparse: a
// reader of the header touches none of it). The names and shapes are what the readers look at;
// the header's own syntax is checkpoint_fuzz's.
//
// What must hold: a UNet config read from the file and valid lays out a UNet whose every tensor
// has a place in the file's layout (LdmUNetNames), under the prefix and each its own; and that
// UNet's tensors written under those names, beside the text tensors the config read, read back
// as the same config. A VAE config read from the file is one VaeConfig reads.
//
// SINGLE_FILE_FUZZ_SEEDS=DIR writes the seeds (tests/fuzz/single_file_fuzz) from small UNets
// of Stable Diffusion 1.x's, 2.x's, SDXL's and its refiner's shapes, and exits.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"
#include "model/vae/config.h"
#include "tests/fuzz/memory_file.h"
#include "tests/fuzz/mutator.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

namespace {

using namespace difftrain;

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Whether the file's data would fit in 2^40 bytes (a hole in the file: nothing is written).
bool Fits(const std::vector<Tensor>& tensors) {
  constexpr uint64_t kMax = uint64_t{1} << 40;
  uint64_t total = 0;
  for (const Tensor& t : tensors) {
    uint64_t bytes = 2;
    for (int64_t d : t.shape) {
      if (d > 0 && bytes > kMax / static_cast<uint64_t>(d)) return false;
      bytes *= static_cast<uint64_t>(d);
    }
    total += bytes;
    if (total > kMax) return false;
  }
  return true;
}

// A safetensors file of `tensors` in an anonymous memory file: the header written, the data a
// hole.
fuzz::MemoryFile HeaderFile(const std::vector<Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t at = 0;
  for (const Tensor& t : tensors) {
    uint64_t bytes = 2;
    for (int64_t d : t.shape)
      bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", "F16"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  const uint64_t length = text.size();
  text.insert(0, reinterpret_cast<const char*>(&length), 8);
  return fuzz::MemoryFile(reinterpret_cast<const uint8_t*>(text.data()), text.size(), at);
}

// The input's tensors; nullopt for lines that are not `NAME D0,D1,…` or repeat a name.
std::optional<std::vector<Tensor>> ParseTensors(std::string_view text) {
  std::vector<Tensor> tensors;
  std::set<std::string> seen;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    Tensor t{std::string(line.substr(0, space)), {}};
    // Printable ASCII, as the checkpoints' names are (the header is JSON, its strings UTF-8).
    if (t.name.empty() || !seen.insert(t.name).second ||
        !std::all_of(t.name.begin(), t.name.end(), [](char c) { return c > ' ' && c < 127; }))
      return std::nullopt;
    std::string_view dims = space == std::string_view::npos ? "" : line.substr(space + 1);
    while (!dims.empty()) {
      const size_t comma = dims.find(',');
      const std::string digits(dims.substr(0, comma));
      dims = comma == std::string_view::npos ? std::string_view() : dims.substr(comma + 1);
      if (digits.empty() || digits.size() > 12 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
      t.shape.push_back(std::stoll(digits));
    }
    if (t.shape.size() > 8) return std::nullopt;
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// The input form of `tensors`, which ParseTensors reads.
std::string Lines(const std::vector<Tensor>& tensors) {
  std::string text;
  for (const Tensor& t : tensors)
    text += fmt::format("{} {}\n", t.name, fmt::join(t.shape, ","));
  return text;
}

bool Verbose() {
  return std::getenv("SINGLE_FILE_FUZZ_VERBOSE") != nullptr;
}

// A config read, or why not.
std::string Said(const Result<nlohmann::json>& json) {
  return json.ok() ? json->dump() : json.status().message();
}

// The UNet's tensors `unet` under the file's names, with the text tensors `file` holds that a
// UNet's config is read from (SDXL's pooled text width, the refiner's one text model).
std::vector<Tensor> LdmUNetTensors(const TensorTable& unet,
                                   const std::vector<std::string>& ldm_names,
                                   const io::SafetensorsFile* file) {
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < ldm_names.size(); ++i)
    tensors.push_back({ldm_names[i], unet.tensors()[i].shape});
  if (file == nullptr) return tensors;
  for (const std::string& name : file->Names()) {
    if (name.starts_with(io::kLdmUNetPrefix) || name.starts_with(io::kLdmVaePrefix)) continue;
    tensors.push_back({name, file->Find(name)->shape});
  }
  return tensors;
}

void CheckUNet(const io::SafetensorsFile& file) {
  Result<nlohmann::json> json = io::LdmUNetConfig(file);
  if (Verbose()) std::fprintf(stderr, "unet: %s\n", Said(json).c_str());
  if (!json.ok()) return;
  Result<UNetConfig> config = UNetConfig::FromJson(*json);
  if (!config.ok() || !config->Validate().ok()) {
    if (Verbose())
      std::fprintf(stderr, "its config: %s\n",
                   (config.ok() ? config->Validate() : config.status()).message().c_str());
    return;
  }
  const UNetPlan plan(*config);
  const std::vector<std::string> names = plan.table.Names();
  Result<std::vector<std::string>> ldm = io::LdmUNetNames(names);
  if (!ldm.ok()) {
    std::fprintf(stderr, "a UNet read from the file has a tensor without a place: %s\n",
                 ldm.status().message().c_str());
    std::abort();
  }
  std::set<std::string> distinct;
  for (const std::string& name : *ldm) {
    if (!name.starts_with(io::kLdmUNetPrefix) || !distinct.insert(name).second) {
      std::fprintf(stderr, "'%s' placed outside the UNet or twice\n", name.c_str());
      std::abort();
    }
  }
  if (io::SgmUNetNames(names).size() != names.size()) std::abort();

  const fuzz::MemoryFile again = HeaderFile(LdmUNetTensors(plan.table, *ldm, &file));
  Result<io::SafetensorsFile> reread = io::SafetensorsFile::ReadHeader(again.path());
  if (!reread.ok()) {
    std::fprintf(stderr, "the UNet's own file: %s\n", reread.status().message().c_str());
    std::abort();
  }
  Result<nlohmann::json> json_again = io::LdmUNetConfig(*reread);
  if (!json_again.ok() || *json_again != *json) {
    std::fprintf(stderr, "read %s\nwritten back, read %s\n", Said(json).c_str(),
                 Said(json_again).c_str());
    std::abort();
  }
}

void CheckVae(const io::SafetensorsFile& file) {
  Result<nlohmann::json> json = io::LdmVaeConfig(file);
  if (Verbose()) std::fprintf(stderr, "vae: %s\n", Said(json).c_str());
  if (!json.ok()) return;
  Result<VaeConfig> config = VaeConfig::FromJson(*json);
  if (config.ok()) (void)config->Validate();
}

// Small UNets as Stable Diffusion's releases shape them (the seeds).
void WriteSeeds(const std::string& dir) {
  const auto seed = [&](const std::string& name, nlohmann::json config, std::vector<Tensor> text) {
    config["_class_name"] = "UNet2DConditionModel";
    Result<UNetConfig> c = UNetConfig::FromJson(config);
    if (!c.ok() || !c->Validate().ok()) {
      std::fprintf(stderr, "seed %s: %s\n", name.c_str(),
                   (c.ok() ? c->Validate() : c.status()).message().c_str());
      std::exit(1);
    }
    const UNetPlan plan(*c);
    Result<std::vector<std::string>> ldm = io::LdmUNetNames(plan.table.Names());
    if (!ldm.ok()) std::exit(1);
    std::vector<Tensor> tensors = LdmUNetTensors(plan.table, *ldm, nullptr);
    tensors.insert(tensors.end(), text.begin(), text.end());
    std::ofstream(dir + "/" + name) << Lines(tensors);
  };
  const nlohmann::json sd1 = {{"block_out_channels", {32, 64}},
                              {"layers_per_block", 1},
                              {"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
                              {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
                              {"cross_attention_dim", 24},
                              {"attention_head_dim", 8},
                              {"norm_num_groups", 8},
                              {"sample_size", 64}};
  const std::string clip = io::kLdmClipPrefix;
  seed("sd1", sd1, {{clip + "text_model.embeddings.token_embedding.weight", {50, 24}}});
  nlohmann::json sd2 = sd1;
  sd2["use_linear_projection"] = true;  // and heads of 64 channels
  sd2["block_out_channels"] = {64, 128};
  sd2["attention_head_dim"] = {1, 2};
  const std::string open_clip = io::kLdmOpenClipPrefix;
  seed("sd2", sd2,
       {{open_clip + "transformer.resblocks.0.attn.in_proj_weight", {72, 24}},
        {"first_stage_model.decoder.conv_in.weight", {32, 4, 3, 3}}});
  nlohmann::json inpaint = sd1;
  inpaint["in_channels"] = 9;
  seed("inpaint", inpaint, {});
  nlohmann::json xl = sd2;
  xl["down_block_types"] = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
  xl["up_block_types"] = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
  xl["block_out_channels"] = {64, 128, 192};
  xl["transformer_layers_per_block"] = {1, 2, 3};
  xl["attention_head_dim"] = {1, 2, 3};
  xl["addition_embed_type"] = "text_time";
  xl["addition_time_embed_dim"] = 8;
  xl["projection_class_embeddings_input_dim"] = 16 + 6 * 8;
  xl["sample_size"] = 128;
  seed("sdxl", xl, {{std::string(io::kSgmOpenClipPrefix) + "text_projection", {24, 16}}});
  nlohmann::json refiner = xl;
  refiner["down_block_types"] = {"DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
  refiner["up_block_types"] = {"UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
  refiner["transformer_layers_per_block"] = {1, 2, 2};
  refiner["projection_class_embeddings_input_dim"] = 16 + 5 * 8;
  refiner["requires_aesthetics_score"] = true;
  const std::string refiner_clip = io::kSgmRefinerOpenClipPrefix;
  seed("refiner", refiner,
       {{refiner_clip + "text_projection", {24, 16}},
        {refiner_clip + "transformer.resblocks.0.attn.in_proj_weight", {72, 24}}});
  // A VAE of two levels, a resnet each, as first_stage_model holds it.
  std::ofstream vae(dir + "/vae");
  const std::string p = io::kLdmVaePrefix;
  vae << p << "encoder.conv_in.weight 32,3,3,3\n"
      << p << "encoder.down.0.block.0.conv1.weight 32,32,3,3\n"
      << p << "encoder.down.0.downsample.conv.weight 32,32,3,3\n"
      << p << "encoder.down.1.block.0.conv1.weight 64,32,3,3\n"
      << p << "encoder.down.1.block.0.nin_shortcut.weight 64,32,1,1\n"
      << p << "encoder.mid.attn_1.q.weight 64,64,1,1\n"
      << p << "decoder.conv_in.weight 64,4,3,3\n"
      << p << "decoder.up.1.block.0.conv1.weight 64,64,3,3\n"
      << p << "decoder.conv_out.weight 3,32,3,3\n";
}

}  // namespace

// Half the mutations know the input's form (libFuzzer's byte-level ones did not find, in
// 300 s, a block numbered 2147483647 or a convolution without dimensions): a tensor's
// dimension set to an extreme, dropped or added; a number in a name set to an extreme; a
// tensor dropped, or copied under another number.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  std::optional<std::vector<Tensor>> tensors =
      ParseTensors(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tensors || tensors->empty() || rng() % 2 == 0) return LLVMFuzzerMutate(data, size, max_size);
  constexpr int64_t kDims[] = {0, 1, 2, 3, 64, 2147483647, 2147483648, 4294967296};
  constexpr const char* kNumbers[] = {"0", "1", "2", "9999", "10000", "2147483647", "99999999999"};
  const auto pick = [&](const auto& options) { return options[rng() % std::size(options)]; };
  // Another number in place of one of the name's (where it has one).
  const auto renumbered = [&](std::string name) {
    std::vector<std::pair<size_t, size_t>> runs;  // start, length
    for (size_t i = 0; i < name.size(); ++i) {
      if (name[i] < '0' || name[i] > '9') continue;
      const size_t start = i;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9')
        ++i;
      runs.push_back({start, i - start});
    }
    if (runs.empty()) return name;
    const auto [at, length] = runs[rng() % runs.size()];
    return name.replace(at, length, pick(kNumbers));
  };
  const size_t k = rng() % tensors->size();
  Tensor& t = (*tensors)[k];
  switch (rng() % 6) {
    case 0:
      if (t.shape.empty())
        t.shape.push_back(pick(kDims));
      else
        t.shape[rng() % t.shape.size()] = pick(kDims);
      break;
    case 1:
      if (!t.shape.empty()) t.shape.erase(t.shape.begin() + rng() % t.shape.size());
      break;
    case 2:
      t.shape.insert(t.shape.begin() + rng() % (t.shape.size() + 1), pick(kDims));
      break;
    case 3:
      t.name = renumbered(t.name);
      break;
    case 4:
      tensors->erase(tensors->begin() + k);
      break;
    default:
      tensors->push_back({renumbered(t.name), t.shape});
      break;
  }
  return fuzz::Mutated(data, size, max_size, Lines(*tensors));
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("SINGLE_FILE_FUZZ_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<std::vector<Tensor>> tensors =
      ParseTensors(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tensors || tensors->size() > 4096 || !Fits(*tensors)) return 0;
  const fuzz::MemoryFile file = HeaderFile(*tensors);
  Result<io::SafetensorsFile> read = io::SafetensorsFile::ReadHeader(file.path());
  if (!read.ok()) {
    if (Verbose()) std::fprintf(stderr, "header: %s\n", read.status().message().c_str());
    return 0;
  }
  (void)io::IsSdxlCheckpoint(*read);
  (void)io::IsSdxlRefinerCheckpoint(*read);
  for (const io::LdmTextModel& model : io::LdmTextModels(*read)) {
    if (!model.open_clip) continue;
    const io::TensorView* embedding = read->Find(model.prefix + "token_embedding.weight");
    const int64_t hidden = embedding && embedding->shape.size() == 2 ? embedding->shape[1] : 64;
    for (const std::string& name : read->Names())
      (void)io::LdmOpenClipTensor(name, hidden);
  }
  (void)io::SgmUNetNames(read->Names());
  (void)io::LdmVaeNames(read->Names());
  if (io::IsLdmCheckpoint(*read)) CheckUNet(*read);
  if (io::HasLdmVae(*read)) CheckVae(*read);
  return 0;
}
