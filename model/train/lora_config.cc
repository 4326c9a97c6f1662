#include "model/train/lora_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_read.h"

namespace difftrain {

Status LoraConfig::Validate() const {
  if (rank < 0) return Errorf("lora.rank must be positive (or 0: no LoRA), got {}", rank);
  if (!enabled()) {
    if (use_dora) return Status::Error("lora.use_dora: DoRA needs lora.rank (e.g. 4)");
    if (use_rslora) return Status::Error("lora.use_rslora: rsLoRA needs lora.rank (e.g. 4)");
    if (train_text_encoder) {
      return Status::Error("lora.train_text_encoder: the text encoder's adapters need lora.rank");
    }
    return Status::Ok();
  }
  if (!std::isfinite(alpha) || alpha < 0) {
    return Errorf("lora.alpha must be positive (or 0: the rank), got {}", alpha);
  }
  if (targets.empty()) return Status::Error("lora.targets: name at least one module");
  for (const std::string& t : targets) {
    if (t.empty() || t.front() == '.' || t.back() == '.') {
      return Errorf("lora.targets: '{}' is no module name (to_q, attn1.to_q, to_out.0, …)", t);
    }
  }
  if (!train_text_encoder) {
    if (!text_encoder.empty()) {
      return Errorf(
          "lora.text_encoder: '{}' is given but lora.train_text_encoder is not set (true adapts "
          "the text encoder too)",
          text_encoder);
    }
    return Status::Ok();
  }
  if (text_encoder_targets.empty()) {
    return Status::Error("lora.text_encoder_targets: name at least one module (q_proj, …)");
  }
  for (const std::string& t : text_encoder_targets) {
    if (t.empty() || t.front() == '.' || t.back() == '.') {
      return Errorf(
          "lora.text_encoder_targets: '{}' is no module name (q_proj, k_proj, v_proj, out_proj, "
          "fc1, fc2)",
          t);
    }
  }
  return Status::Ok();
}

nlohmann::json LoraConfig::ToJson() const {
  nlohmann::json json = {{"rank", rank}, {"alpha", alpha}, {"targets", targets}};
  // Only when set: a plain LoRA's JSON (a checkpoint's "lora" metadata) stays as it was.
  if (use_dora) json["use_dora"] = true;
  if (use_rslora) json["use_rslora"] = true;
  if (train_text_encoder) {
    json["train_text_encoder"] = true;
    json["text_encoder_targets"] = text_encoder_targets;
    json["text_encoder"] = text_encoder;
  }
  return json;
}

Result<LoraConfig> LoraConfig::FromJson(const nlohmann::json& json) {
  LoraConfig c;
  try {
    c.rank = JsonInt(json.at("rank"), "rank");
    c.alpha = json.at("alpha").get<double>();
    c.targets = json.at("targets").get<std::vector<std::string>>();
    c.use_dora = json.value("use_dora", false);
    c.use_rslora = json.value("use_rslora", false);
    c.train_text_encoder = json.value("train_text_encoder", false);
    if (c.train_text_encoder) {
      c.text_encoder_targets = json.at("text_encoder_targets").get<std::vector<std::string>>();
      c.text_encoder = json.value("text_encoder", std::string());
    }
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed LoRA config {}: {}", json.dump(), e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// The modules of `table` that `targets` adapt (of part `part`, named prefix + M); `what` and
// `model` name the targets' setting and the model in the error.
Result<std::vector<LoraModule>> MatchModules(const std::vector<std::string>& targets,
                                             const TensorTable& table, int part,
                                             const std::string& prefix, const char* what,
                                             const char* model) {
  std::vector<LoraModule> modules;
  std::vector<std::string> seen;  // a few of the model's modules, for the error
  for (const TensorSpec& t : table.tensors()) {
    if (!t.name.ends_with(".weight") || t.shape.size() < 2) continue;
    const std::string name = t.name.substr(0, t.name.size() - 7);
    if (seen.size() < 8) seen.push_back(name);
    const bool targeted = std::any_of(
        targets.begin(), targets.end(),
        [&](const std::string& target) { return name == target || name.ends_with("." + target); });
    if (!targeted) continue;
    LoraModule m;
    m.name = prefix + name;
    m.part = part;
    m.shape = t.shape;
    m.weight = t.offset;
    m.out = t.shape[0];
    m.in = static_cast<int64_t>(t.numel) / m.out;
    modules.push_back(std::move(m));
  }
  if (modules.empty()) {
    return Errorf(
        "{} [{}] match no module of {} (a target names a module or the end of its dotted name; "
        "its weights of two or more dimensions are of modules such as {})",
        what, fmt::join(targets, ", "), model, fmt::join(seen, ", "));
  }
  return modules;
}

}  // namespace

Result<std::vector<LoraModule>> LoraModulesOf(const LoraConfig& config, const TensorTable& table) {
  return MatchModules(config.targets, table, 0, "", "lora.targets", "the model");
}

Result<std::vector<LoraModule>> TextLoraModulesOf(const LoraConfig& config,
                                                  const TensorTable& table) {
  return MatchModules(config.text_encoder_targets, table, 1, kLoraTextPrefix,
                      "lora.text_encoder_targets", "the text encoder");
}

namespace {

LoraElements CountElements(const LoraConfig& config, const std::vector<LoraModule>& modules,
                           const TensorTable& table) {
  LoraElements n;
  for (const LoraModule& m : modules) {
    n.adapters += static_cast<size_t>(config.rank * (m.in + m.out) + (config.use_dora ? m.out : 0));
    n.frozen += static_cast<size_t>(m.in * m.out);
  }
  for (const TensorSpec& t : table.tensors())
    if (t.shape.size() < 2) n.vectors += t.numel;
  return n;
}

}  // namespace

Result<LoraElements> CountLoraElements(const LoraConfig& config, const TensorTable& table) {
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, LoraModulesOf(config, table));
  return CountElements(config, modules, table);
}

Result<LoraElements> CountTextLoraElements(const LoraConfig& config,
                                           const TensorTable& text_table) {
  DT_ASSIGN_OR_RETURN(const std::vector<LoraModule> modules, TextLoraModulesOf(config, text_table));
  return CountElements(config, modules, text_table);
}

}  // namespace difftrain
