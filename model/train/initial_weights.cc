#include "model/train/initial_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "model/io/checkpoint.h"
#include "model/io/diffusers_dit.h"
#include "model/io/ldm_checkpoint.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

constexpr char kShardFormat[] = "difftrain-checkpoint-shard";
// How many names an error or warning lists before "and N more".
constexpr size_t kNamesShown = 5;

bool IsCheckpointShard(const io::SafetensorsFile& file) {
  auto it = file.metadata().find("format");
  return it != file.metadata().end() && it->second == kShardFormat;
}

bool IsFloatingPoint(io::DType dtype) {
  return dtype == io::DType::kF16 || dtype == io::DType::kBF16 || dtype == io::DType::kF32 ||
         dtype == io::DType::kF64;
}

std::string Listed(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size() && i < kNamesShown; ++i)
    text += (i == 0 ? "" : "; ") + items[i];
  if (items.size() > kNamesShown) text += fmt::format("; and {} more", items.size() - kNamesShown);
  return text;
}

// Does the tensor `name` of the file fit `spec`? A problem as text, or nullopt.
std::optional<std::string> Mismatch(const io::SafetensorsFile& file, const std::string& name,
                                    const std::vector<int64_t>& shape) {
  const io::TensorView* t = file.Find(name);
  if (t == nullptr)
    return fmt::format("'{}' missing (the model's is {})", name, ShapeString(shape));
  if (t->shape != shape) {
    return fmt::format("'{}' is {}, the model's is {}", name, ShapeString(t->shape),
                       ShapeString(shape));
  }
  if (!IsFloatingPoint(t->dtype)) {
    return fmt::format("'{}' is {}, not F16, BF16, F32 or F64", name, io::DTypeName(t->dtype));
  }
  return std::nullopt;
}

// Where one tensor of the model lies in a file: the file's tensors holding its rows, in order,
// and the file's further copies of all of it, which must hold the same values.
struct InFile {
  struct Part {
    std::string name;
    std::vector<int64_t> shape;
    size_t offset = 0;  // of its first element within the model's tensor
  };
  std::vector<Part> parts;
  std::vector<std::string> copies;
};

// Each tensor of `global` in `file`: under the names SpelledAsTheFile gives, or a DiT's in a
// diffusers Transformer2DModel (model/io/diffusers_dit.h).
Result<std::vector<InFile>> PlaceInFile(const io::SafetensorsFile& file,
                                        const TensorTable& global) {
  std::vector<InFile> placed;
  const std::vector<std::string> names = global.Names();
  const int dit_depth = io::DitDepth(names);
  if (dit_depth > 0 && io::IsDiffusersDit(file.Names())) {
    for (const TensorSpec& t : global.tensors()) {
      std::optional<io::DiffusersDitPlace> place =
          io::DiffusersDitTensor(t.name, t.shape.empty() ? 1 : t.shape[0], dit_depth);
      if (!place) {
        return Errorf("'{}' is a diffusers DiT, whose layout has no place for the model's '{}'",
                      file.path(), t.name);
      }
      InFile& in = placed.emplace_back();
      const size_t row = t.shape.empty() ? 1 : t.numel / size_t(t.shape[0]);
      for (const io::TensorRows& part : place->parts) {
        std::vector<int64_t> shape = t.shape;
        if (part.rows >= 0) shape[0] = part.rows;
        in.parts.push_back({part.name, std::move(shape), size_t(part.first_row) * row});
      }
      in.copies = std::move(place->copies);
    }
    return placed;
  }
  DT_ASSIGN_OR_RETURN(const TensorTable spelled, SpelledAsTheFile(file, global));
  for (const TensorSpec& t : spelled.tensors())
    placed.push_back({{{t.name, t.shape, 0}}, {}});
  return placed;
}

}  // namespace

Result<std::string> InitialWeightsFile(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return Errorf("'{}': no such file or directory", path);
  }
  if (!fs::is_directory(status)) return path;
  const fs::path dir(path);
  for (const char* sub : {"", "unet", "transformer"}) {
    for (const char* name :
         {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"}) {
      const fs::path candidate = dir / sub / name;
      if (fs::is_regular_file(candidate, ec)) return candidate.string();
    }
  }
  if (fs::exists(dir / "manifest.json", ec)) {  // one step of a checkpoint directory
    DT_ASSIGN_OR_RETURN(auto resolved, io::ResolveCheckpointStep(path));
    const auto& [steps, step] = resolved;
    DT_ASSIGN_OR_RETURN(const int world, steps.World(step));
    return steps.ShardPath(step, 0, world);
  }
  io::CheckpointStore store(path, /*keep=*/0);
  Result<std::optional<int64_t>> latest = store.LatestComplete();
  if (!latest.ok()) {
    return latest.status().WithContext(fmt::format("'{}'", path));
  }
  if (*latest) {
    DT_ASSIGN_OR_RETURN(const int world, store.World(**latest));
    return store.ShardPath(**latest, 0, world);
  }
  return Errorf(
      "'{}': a directory with no diffusion_pytorch_model.safetensors (or "
      ".fp16.safetensors; in it, its unet/ or transformer/) and no complete difftrain checkpoint "
      "(step-N/): "
      "name the safetensors file itself",
      path);
}

Result<TensorTable> SpelledAsTheFile(const io::SafetensorsFile& file, const TensorTable& global) {
  if (!io::IsLdmCheckpoint(file) || global.Find("conv_in.weight") == nullptr) return global;
  const std::vector<std::string> names = global.Names();
  Result<std::vector<std::string>> ldm = io::LdmUNetNames(names);
  if (!ldm.ok()) return ldm.status().WithContext(fmt::format("'{}'", file.path()));
  TensorTable spelled;
  for (size_t i = 0; i < names.size(); ++i)
    spelled.Add((*ldm)[i], global.tensors()[i].shape);
  return spelled;
}

Result<std::vector<std::string>> CheckInitialWeights(const io::SafetensorsFile& file,
                                                     const TensorTable& model,
                                                     const std::vector<std::string>& ignored) {
  DT_ASSIGN_OR_RETURN(const std::vector<InFile> placed, PlaceInFile(file, model));
  const bool shard = IsCheckpointShard(file);
  std::vector<std::string> problems;
  std::unordered_set<std::string> used;
  size_t wanted = 0;
  for (size_t i = 0; i < placed.size(); ++i) {
    auto check = [&](const std::string& name, const std::vector<int64_t>& shape) {
      used.insert(name);
      wanted += shard ? 2 : 1;
      if (auto problem = Mismatch(file, name, shape)) problems.push_back(*problem);
      if (!shard) return;
      if (auto problem = Mismatch(file, "ema." + name, shape)) problems.push_back(*problem);
    };
    for (const InFile::Part& part : placed[i].parts)
      check(part.name, part.shape);
    for (const std::string& copy : placed[i].copies)
      check(copy, model.tensors()[i].shape);
  }
  if (!problems.empty()) {
    return Errorf(
        "'{}': {} of the model's {} tensors do not match ({} found in the "
        "file): {}",
        file.path(), problems.size(), wanted, file.Names().size(), Listed(problems));
  }
  const std::unordered_set<std::string> skip(ignored.begin(), ignored.end());
  std::vector<std::string> unused;
  for (const std::string& name : file.Names()) {
    if (used.contains(name) || skip.contains(name)) continue;
    // A shard's EMA, moments and a LoRA run's adapters and frozen weights (its model tensors
    // hold them fused).
    if (shard &&
        (name.starts_with("ema.") || name.starts_with("optim.") || name.starts_with("lora.")))
      continue;
    unused.push_back(name);
  }
  return unused;
}

Status ReadPretrainedWeights(const io::SafetensorsFile& file, const TensorTable& model, bool ema,
                             float* params) {
  DT_ASSIGN_OR_RETURN(const std::vector<InFile> placed, PlaceInFile(file, model));
  const std::string prefix = ema && IsCheckpointShard(file) ? "ema." : "";
  std::vector<float> copy;
  for (size_t i = 0; i < placed.size(); ++i) {
    const TensorSpec& t = model.tensors()[i];
    for (const InFile::Part& part : placed[i].parts) {
      DT_RETURN_IF_ERROR(
          file.CopyAsF32(prefix + part.name, part.shape, params + t.offset + part.offset));
    }
    // A copy of the whole tensor (a diffusers DiT's embedders in every block) must be the same.
    for (const std::string& name : placed[i].copies) {
      copy.resize(t.numel);
      DT_RETURN_IF_ERROR(file.CopyAsF32(prefix + name, t.shape, copy.data()));
      if (!std::equal(copy.begin(), copy.end(), params + t.offset)) {
        return Errorf(
            "'{}': '{}' differs from '{}': the model has one '{}' where the file keeps a copy "
            "in every block, and they have been trained apart",
            file.path(), prefix + name, prefix + placed[i].parts[0].name, t.name);
      }
    }
  }
  return Status::Ok();
}

Status ReadInitialWeights(const io::SafetensorsFile& file, const TensorTable& model, float* params,
                          float* ema) {
  DT_RETURN_IF_ERROR(ReadPretrainedWeights(file, model, /*ema=*/false, params));
  if (IsCheckpointShard(file)) return ReadPretrainedWeights(file, model, /*ema=*/true, ema);
  std::copy(params, params + model.total(), ema);
  return Status::Ok();
}

Result<nlohmann::json> ReadModelConfigJson(const std::string& kind, const std::string& path,
                                           const std::string& config, const char* writer) {
  std::ifstream file(config);
  if (!file) {
    return Errorf("{} '{}': cannot read its config '{}' ({} writes config.json beside the weights)",
                  kind, path, config, writer);
  }
  nlohmann::json json = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Errorf("{} config '{}' is not JSON", kind, config);
  return json;
}

Result<std::vector<float>> ReadInferenceWeights(const io::SafetensorsFile& file,
                                                const TensorTable& spelled,
                                                const std::string& what) {
  DT_ASSIGN_OR_RETURN(const std::vector<std::string> unused, CheckInitialWeights(file, spelled));
  if (!unused.empty()) {
    spdlog::info("{}: {} tensor(s) of '{}' it does not use were not read, e.g. {}", what,
                 unused.size(), file.path(), unused[0]);
  }
  std::vector<float> weights(spelled.total());
  for (const TensorSpec& t : spelled.tensors())
    DT_RETURN_IF_ERROR(file.CopyAsF32(t.name, t.shape, weights.data() + t.offset));
  return weights;
}

Status CheckInitialWeightsForModel(const ModelSpec& model, const std::string& path) {
  DT_ASSIGN_OR_RETURN(const std::string file_path, InitialWeightsFile(path));
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile header, io::SafetensorsFile::ReadHeader(file_path));
  DT_ASSIGN_OR_RETURN(const ModelPartition whole,
                      FamilyOf(model).Partition(model, LayoutShape{}, 0, 0, 0));
  return CheckInitialWeights(header, whole.parameters.table).status();
}

}  // namespace difftrain
