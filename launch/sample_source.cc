#include "launch/sample_source.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "model/io/checkpoint.h"
#include "model/tensor/buffer.h"
#include "model/train/initial_weights.h"
#include "model/train/trainer.h"

namespace difftrain::launch {

Result<SampleSource> LoadCheckpointSource(const std::string& path) {
  DT_ASSIGN_OR_RETURN(auto resolved, io::ResolveCheckpointStep(path));
  auto& [store, step] = resolved;
  SampleSource c;
  c.step = step;
  c.path = store.StepDir(step);
  DT_ASSIGN_OR_RETURN(int world, store.World(step));
  DT_ASSIGN_OR_RETURN(c.file, store.ReadShard(step, 0, world));

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
  } catch (const nlohmann::json::exception& e) {
    return Errorf("'{}': malformed training config in the metadata: {}", c.file->path(), e.what());
  }
  return c;
}

Result<SampleSource> LoadPretrainedSource(const std::string& path, ModelSpec model,
                                          DiffusionConfig diffusion) {
  DT_RETURN_IF_ERROR(diffusion.Validate());
  SampleSource c;
  c.pretrained = true;
  c.model = std::move(model);
  c.diffusion = std::move(diffusion);
  DT_ASSIGN_OR_RETURN(c.path, InitialWeightsFile(path));
  DT_ASSIGN_OR_RETURN(c.file, io::SafetensorsFile::Read(c.path));
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
  Buffer<float> weights(global.total()), averaged(global.total());
  DT_RETURN_IF_ERROR(ReadInitialWeights(*source.file, global, weights.data(), averaged.data()));
  const float* chosen = ema ? averaged.data() : weights.data();
  std::copy(chosen, chosen + global.total(), model.params());
  return Status::Ok();
}

}  // namespace difftrain::launch
