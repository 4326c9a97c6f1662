#include "launch/sample_source.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "model/io/checkpoint.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/posix_file.h"
#include "model/train/initial_weights.h"
#include "model/train/trainer.h"

namespace difftrain::launch {

namespace fs = std::filesystem;

Result<SampleSource> LoadCheckpointSource(const std::string& path) {
  DT_ASSIGN_OR_RETURN(auto resolved, io::ResolveCheckpointStep(path));
  auto& [store, step] = resolved;
  SampleSource c;
  c.step = step;
  c.path = store.StepDir(step);
  DT_ASSIGN_OR_RETURN(int world, store.World(step));
  // Mapped: sampling and export read the model or its EMA, not the optimizer's moments.
  DT_ASSIGN_OR_RETURN(c.file, store.MapShard(step, 0, world));

  const auto& meta = c.file->metadata();
  auto json_field = [&](const std::string& key) -> Result<nlohmann::json> {
    auto it = meta.find(key);
    if (it == meta.end()) return Errorf("'{}': metadata has no '{}'", c.file->path(), key);
    nlohmann::json value = nlohmann::json::parse(it->second, nullptr, false);
    if (!value.is_object())
      return Errorf("'{}': metadata '{}' is not a JSON object", c.file->path(), key);
    return value;
  };
  DT_ASSIGN_OR_RETURN(c.model, CheckpointModel(*c.file));

  DT_ASSIGN_OR_RETURN(nlohmann::json train, json_field("train"));
  try {
    Result<DiffusionConfig> diffusion = DiffusionConfig::FromJson(train.at("diffusion"));
    if (!diffusion.ok()) return diffusion.status().WithContext(fmt::format("'{}'", c.file->path()));
    c.diffusion = *diffusion;
    c.data_kind = train.contains("data") ? train["data"].value("kind", std::string()) : "";
    c.data_path = train.contains("data") ? train["data"].value("path", std::string()) : "";
    if (meta.contains(std::string(kInversionMetadata))) {
      DT_ASSIGN_OR_RETURN(const nlohmann::json inversion,
                          json_field(std::string(kInversionMetadata)));
      c.inversion_token = inversion.at("token").get<std::string>();
      c.trained_text_encoder = inversion.at("text_encoder").get<std::string>();
    }
    if (meta.contains("lora")) {
      DT_ASSIGN_OR_RETURN(const nlohmann::json lora, json_field("lora"));
      Result<LoraConfig> config = LoraConfig::FromJson(lora);
      if (!config.ok()) return config.status().WithContext(fmt::format("'{}'", c.file->path()));
      if (config->train_text_encoder) {
        c.text_lora = *config;
        c.trained_text_encoder = config->text_encoder;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Errorf("'{}': malformed training config in the metadata: {}", c.file->path(), e.what());
  }
  return c;
}

namespace {

// `path` as JSON; nullopt when there is no such file.
Result<std::optional<nlohmann::json>> ReadJsonIfThere(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::optional<nlohmann::json>();
  DT_ASSIGN_OR_RETURN(const std::string text, io::ReadWholeFile(path.string()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Errorf("'{}' is not JSON", path.string());
  return std::optional<nlohmann::json>(std::move(j));
}

// The diffusion, spacing and sampler of a scheduler config `schedule` (read from `where`).
Status ReadScheduler(const nlohmann::json& schedule, const std::string& where,
                     DiffusersFolder& folder) {
  Result<DiffusionConfig> diffusion = DiffusionConfig::FromDiffusersScheduler(schedule);
  if (!diffusion.ok()) return diffusion.status().WithContext(where);
  folder.diffusion = *diffusion;
  Result<TimestepSpacing> spacing = TimestepSpacing::FromDiffusersScheduler(schedule);
  if (!spacing.ok()) return spacing.status().WithContext(where);
  folder.spacing = *spacing;
  if (schedule.contains("_class_name") && schedule["_class_name"].is_string())
    folder.scheduler_class = schedule["_class_name"].get<std::string>();
  folder.scheduler_config = schedule;
  return Status::Ok();
}

// The scheduler diffusers' from_single_file gives an original Stable Diffusion checkpoint: its
// SCHEDULER_DEFAULT_CONFIG, as create_scheduler_from_ldm sets it for SD 1.x/2.x (DDIM) and
// SDXL (Euler).
nlohmann::json SingleFileScheduler(bool sdxl) {
  nlohmann::json scheduler = {{"_class_name", "DDIMScheduler"},
                              {"num_train_timesteps", 1000},
                              {"beta_schedule", "scaled_linear"},
                              {"beta_start", 0.00085},
                              {"beta_end", 0.012},
                              {"prediction_type", "epsilon"},
                              {"clip_sample", false},
                              {"set_alpha_to_one", false},
                              {"steps_offset", 1},
                              {"timestep_spacing", "leading"}};
  if (sdxl) {
    scheduler["_class_name"] = "EulerDiscreteScheduler";
    scheduler["interpolation_type"] = "linear";
  }
  return scheduler;
}

// The class names of a pipeline's model_index.json (`index`, read from `path`): its id2label, each
// comma-separated synonym naming its class, as DiTPipeline.get_label_ids reads them; none
// without one.
Result<std::map<std::string, int>> ClassNames(const nlohmann::json& index, const fs::path& path) {
  std::map<std::string, int> names;
  if (!index.contains("id2label") || !index["id2label"].is_object()) return names;
  for (const auto& [id, synonyms] : index["id2label"].items()) {
    char* end = nullptr;
    const long number = std::strtol(id.c_str(), &end, 10);
    if (!synonyms.is_string() || id.empty() || *end != '\0' || number < 0) {
      return Errorf("'{}': id2label's '{}' is not a class number and its name", path.string(), id);
    }
    std::stringstream each(synonyms.get<std::string>());
    for (std::string name; std::getline(each, name, ',');) {
      const size_t first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
      if (first != std::string::npos)
        names[name.substr(first, last - first + 1)] = static_cast<int>(number);
    }
  }
  return names;
}

// What an original Stable Diffusion checkpoint (`file`) says of itself: its UNet, from its
// tensors, and diffusers' single-file scheduler.
Result<DiffusersFolder> ReadSingleFile(const io::SafetensorsFile& file) {
  DiffusersFolder folder;
  DT_ASSIGN_OR_RETURN(nlohmann::json unet, io::LdmUNetConfig(file));
  unet["name"] = "unet";
  Result<ModelSpec> spec = ModelSpecFromJson("unet", unet);
  if (!spec.ok()) return spec.status().WithContext(fmt::format("'{}'", file.path()));
  folder.model = std::move(spec).value();
  DT_RETURN_IF_ERROR(ReadScheduler(SingleFileScheduler(io::IsSdxlCheckpoint(file)),
                                   "the single-file scheduler", folder));
  // As from_single_file gives SDXL's refiner: its unconditional text the empty prompt's.
  folder.zeros_for_empty_prompt = !io::IsSdxlRefinerCheckpoint(file);
  return folder;
}

}  // namespace

Result<DiffusersFolder> ReadDiffusersFolder(const std::string& weights) {
  DiffusersFolder folder;
  const fs::path dir = fs::path(weights).parent_path();
  DT_ASSIGN_OR_RETURN(std::optional<nlohmann::json> config, ReadJsonIfThere(dir / "config.json"));
  std::error_code ec;
  const fs::path pipeline = dir.parent_path();
  const bool in_pipeline = fs::is_regular_file(pipeline / "model_index.json", ec);
  if (config && in_pipeline) {
    // SDXL's refiner says in its pipeline's config that its UNet's time ids hold an aesthetic
    // score.
    const fs::path index_path = pipeline / "model_index.json";
    DT_ASSIGN_OR_RETURN(std::optional<nlohmann::json> index, ReadJsonIfThere(index_path));
    if (index && index->is_object()) {
      auto says = [&](const char* key, bool value) {
        return index->contains(key) && (*index)[key] == value;
      };
      if (says("requires_aesthetics_score", true)) (*config)["requires_aesthetics_score"] = true;
      // Its unconditional text is the empty prompt's, not zeros.
      if (says("force_zeros_for_empty_prompt", false)) folder.zeros_for_empty_prompt = false;
      // DiTPipeline's ImageNet names.
      DT_ASSIGN_OR_RETURN(folder.class_names, ClassNames(*index, index_path));
    }
  }
  bool component = false;  // the folder is a pipeline's model folder (unet/, transformer/)
  for (const ModelFamily* family : ModelFamilies()) {
    component = component || dir.filename() == family->diffusers_component();
    if (!config || folder.model) continue;
    Result<std::optional<ModelSpec>> spec = family->FromDiffusersConfig(*config);
    if (!spec.ok())
      return spec.status().WithContext(fmt::format("'{}'", (dir / "config.json").string()));
    folder.model = std::move(spec).value();
  }
  // A pipeline's unet/ or transformer/ (model_index.json above it), or a model with its
  // scheduler beside it (`difftrain export` without --pipeline): the scheduler describes the
  // diffusion.
  const fs::path scheduler = pipeline / "scheduler" / "scheduler_config.json";
  if (component && (in_pipeline || fs::is_regular_file(scheduler, ec))) {
    if (in_pipeline) folder.pipeline = pipeline.string();
    DT_ASSIGN_OR_RETURN(std::optional<nlohmann::json> schedule, ReadJsonIfThere(scheduler));
    if (schedule) {
      DT_RETURN_IF_ERROR(ReadScheduler(*schedule, fmt::format("'{}'", scheduler.string()), folder));
    }
  }
  return folder;
}

Result<SampleSource> LoadPretrainedSource(const std::string& path, std::optional<ModelSpec> model,
                                          std::optional<DiffusionConfig> diffusion,
                                          std::optional<int> latent_size) {
  SampleSource c;
  c.pretrained = true;
  DT_ASSIGN_OR_RETURN(c.path, InitialWeightsFile(path));
  DT_ASSIGN_OR_RETURN(c.file, io::SafetensorsFile::Map(c.path));
  c.single_file = io::IsLdmCheckpoint(*c.file);
  c.single_file_vae = c.single_file && io::HasLdmVae(*c.file);
  DT_ASSIGN_OR_RETURN(const DiffusersFolder folder,
                      c.single_file ? ReadSingleFile(*c.file) : ReadDiffusersFolder(c.path));
  c.pipeline = folder.pipeline;
  c.zeros_for_empty_prompt = folder.zeros_for_empty_prompt;
  c.class_names = folder.class_names;
  c.spacing = folder.spacing;
  c.scheduler_class = folder.scheduler_class;
  c.scheduler_config = folder.scheduler_config;
  if (latent_size && folder.model) model.reset();
  if (!model && !folder.model) {
    return Errorf(
        "needs the model: '{}' has no diffusers config.json beside it (a UNet2DConditionModel, "
        "DiT's Transformer2DModel) and is no original Stable Diffusion checkpoint; give --model "
        "NAME (with --image-size or "
        "--input-size) or --config JOB.yaml",
        c.path);
  }
  c.model = model ? std::move(*model) : *folder.model;
  if (!model && latent_size) {
    nlohmann::json config = c.model.config;
    config["sample_size"] = *latent_size;
    DT_ASSIGN_OR_RETURN(c.model, ModelSpecFromJson(c.model.family, config));
  }
  if (!model) {
    spdlog::info(
        "the model: {} ({} {})", c.model.name(),
        c.single_file ? "read from the tensors of the original checkpoint" : "config.json beside",
        c.path);
  }
  if (c.single_file && !model) {
    spdlog::info("its UNet config: {} (heads as Stable Diffusion's; --config to say otherwise)",
                 c.model.config.dump());
  }
  c.diffusion = diffusion.value_or(folder.diffusion.value_or(DiffusionConfig{}));
  if (!diffusion && folder.diffusion) {
    spdlog::info("the diffusion: {}",
                 c.single_file ? "Stable Diffusion's, as diffusers' from_single_file (epsilon: "
                                 "give --prediction v for a v model)"
                               : (fs::path(c.path).parent_path().parent_path() / "scheduler" /
                                  "scheduler_config.json")
                                     .string());
  }
  DT_RETURN_IF_ERROR(c.diffusion.Validate());
  return c;
}

Status FillModelWeights(const SampleSource& source, bool ema, Model& model) {
  const TensorTable& global = model.global_parameter_table();
  if (!source.pretrained) return ReadModelArena(*source.file, global, ema, model.params());
  std::vector<std::string> fixed;
  for (const FixedTensor& f : model.fixed_tensors())
    fixed.push_back(f.name);
  DT_ASSIGN_OR_RETURN(const std::vector<std::string> unused,
                      CheckInitialWeights(*source.file, global, fixed));
  if (!unused.empty()) {
    spdlog::info("{}: {} tensor(s) the model does not have were not read, e.g. {}",
                 source.file->path(), unused.size(), unused[0]);
  }
  return ReadPretrainedWeights(*source.file, global, ema, model.params());
}

Result<std::vector<int>> ClassNumbers(const std::vector<std::string>& classes,
                                      const SampleSource& source) {
  std::vector<int> numbers;
  for (const std::string& given : classes) {
    char* end = nullptr;
    const long number = std::strtol(given.c_str(), &end, 10);
    if (!given.empty() && *end == '\0') {
      numbers.push_back(static_cast<int>(number));
      continue;
    }
    const auto named = source.class_names.find(given);
    if (named != source.class_names.end()) {
      numbers.push_back(named->second);
      continue;
    }
    if (source.class_names.empty()) {
      return Errorf(
          "--classes: '{}' is no class number, and the model's classes have no names (a "
          "DiTPipeline folder's model_index.json gives them in id2label)",
          given);
    }
    std::vector<std::string> some;
    for (const auto& [name, id] : source.class_names) {
      if (some.size() == 5) break;
      some.push_back(name);
    }
    return Errorf("--classes: '{}' is no class number and none of the {} names of id2label ({}, …)",
                  given, source.class_names.size(), fmt::join(some, ", "));
  }
  return numbers;
}

}  // namespace difftrain::launch
