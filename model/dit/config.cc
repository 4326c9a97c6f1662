#include "model/dit/config.h"

#include <limits>
#include <map>

#include "common/json_read.h"

namespace difftrain {
namespace {

struct SizeSpec {
  int depth, hidden, heads;
};
const std::map<std::string, SizeSpec>& Sizes() {
  static const std::map<std::string, SizeSpec> sizes = {
      {"S", {12, 384, 6}}, {"B", {12, 768, 12}}, {"L", {24, 1024, 16}}, {"XL", {28, 1152, 16}}};
  return sizes;
}

int64_t LinearParams(int64_t in, int64_t out) {
  return in * out + out;
}

}  // namespace

Status DiTConfig::Validate() const {
  auto positive = [](const char* field, int v) -> Status {
    return v > 0 ? Status::Ok() : Errorf("model.{} must be positive, got {}", field, v);
  };
  for (auto [field, v] : {std::pair{"input_size", input_size},
                          {"patch_size", patch_size},
                          {"in_channels", in_channels},
                          {"hidden_size", hidden_size},
                          {"depth", depth},
                          {"num_heads", num_heads}}) {
    DT_RETURN_IF_ERROR(positive(field, v));
  }
  // DiT is class-conditional; Latte may be unconditional.
  if (num_classes < (video ? 0 : 1))
    return Errorf("model.num_classes must be {}, got {}", video ? "0 or more" : "positive",
                  num_classes);
  if (video && num_frames < 1)
    return Errorf("model.num_frames must be positive, got {}", num_frames);
  // Far beyond any trained DiT (28 blocks): per-block loops (the planner's, the parameter
  // table's) stay bounded for whatever a job file says.
  constexpr int kMaxDepth = 4096;
  if (depth > kMaxDepth) return Errorf("model.depth {} exceeds {} blocks", depth, kMaxDepth);
  if (video && depth % 2 != 0)
    return Errorf(
        "model.depth {} must be even: Latte's blocks come in pairs (spatial, then temporal)",
        depth);
  // The sizes derived from the fields are ints: a shape that would overflow one is refused
  // here rather than wrapped (or, for the MLP width, converted out of range) downstream.
  constexpr double kMaxInt = std::numeric_limits<int>::max();
  const double grid = input_size / patch_size;
  for (auto [what, v] : {std::pair{"the tokens (input_size / patch_size)^2", grid * grid},
                         {"a video's tokens (input_size / patch_size)^2 x num_frames",
                          grid * grid * (video ? num_frames : 1)},
                         {"the MLP width hidden_size x mlp_ratio", hidden_size * mlp_ratio},
                         {"the patch features in_channels x patch_size^2",
                          double(in_channels) * patch_size * patch_size},
                         {"the output channels 2 x in_channels", 2.0 * in_channels},
                         {"the label rows num_classes + 1", num_classes + 1.0}}) {
    if (!(v <= kMaxInt)) return Errorf("model: {} = {} exceeds {}", what, v, kMaxInt);
  }
  if (input_size % patch_size != 0)
    return Errorf("model.input_size {} is not divisible by model.patch_size {}", input_size,
                  patch_size);
  if (hidden_size % num_heads != 0)
    return Errorf("model.hidden_size {} is not divisible by model.num_heads {}", hidden_size,
                  num_heads);
  if (hidden_size % 4 != 0)
    return Errorf("model.hidden_size {} must be divisible by 4 (2-D sin-cos position embedding)",
                  hidden_size);
  if (mlp_ratio <= 0 || mlp_hidden() < 1)
    return Errorf("model.mlp_ratio must be positive, got {}", mlp_ratio);
  if (class_dropout_prob < 0 || class_dropout_prob >= 1)
    return Errorf("model.class_dropout_prob must be in [0, 1), got {}", class_dropout_prob);
  return Status::Ok();
}

nlohmann::json DiTConfig::ToJson() const {
  nlohmann::json j = {{"name", name},
                      {"input_size", input_size},
                      {"patch_size", patch_size},
                      {"in_channels", in_channels},
                      {"hidden_size", hidden_size},
                      {"depth", depth},
                      {"num_heads", num_heads},
                      {"mlp_ratio", mlp_ratio},
                      {"num_classes", num_classes},
                      {"class_dropout_prob", class_dropout_prob},
                      {"learn_sigma", learn_sigma}};
  if (video) j["num_frames"] = num_frames;
  return j;
}

Result<DiTConfig> DiTConfig::FromJson(const nlohmann::json& j) {
  DiTConfig c;
  try {
    c.name = j.value("name", std::string("custom"));
    c.input_size = JsonInt(j.at("input_size"), "input_size");
    c.patch_size = JsonInt(j.at("patch_size"), "patch_size");
    c.in_channels = JsonInt(j.at("in_channels"), "in_channels");
    c.hidden_size = JsonInt(j.at("hidden_size"), "hidden_size");
    c.depth = JsonInt(j.at("depth"), "depth");
    c.num_heads = JsonInt(j.at("num_heads"), "num_heads");
    c.mlp_ratio = j.at("mlp_ratio").get<double>();
    c.num_classes = JsonInt(j.at("num_classes"), "num_classes");
    c.class_dropout_prob = j.at("class_dropout_prob").get<double>();
    c.learn_sigma = j.at("learn_sigma").get<bool>();
    if (j.contains("num_frames")) {
      c.video = true;
      c.num_frames = JsonInt(j.at("num_frames"), "num_frames");
    }
  } catch (const nlohmann::json::exception& e) {
    return Errorf("malformed DiT config: {}", e.what());
  }
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<DiTConfig> SizedConfigByName(const std::string& prefix, const std::string& name,
                                    int input_size) {
  // "<prefix>-<size>/<patch>"
  const size_t slash = name.find('/');
  const std::string expected =
      fmt::format("{0}-S/B/L/XL with patch 2, 4 or 8, e.g. {0}-XL/2", prefix);
  if (name.rfind(prefix + "-", 0) != 0 || slash == std::string::npos)
    return Errorf("unknown model '{}' (expected one of {})", name, expected);
  const std::string size = name.substr(prefix.size() + 1, slash - prefix.size() - 1);
  const std::string patch = name.substr(slash + 1);
  auto it = Sizes().find(size);
  if (it == Sizes().end() || (patch != "2" && patch != "4" && patch != "8"))
    return Errorf("unknown model '{}' (expected one of {})", name, expected);
  DiTConfig c;
  c.name = name;
  c.input_size = input_size;
  c.patch_size = std::stoi(patch);
  c.depth = it->second.depth;
  c.hidden_size = it->second.hidden;
  c.num_heads = it->second.heads;
  return c;
}

std::vector<std::string> SizedConfigNames(const std::string& prefix) {
  std::vector<std::string> names;
  for (const char* size : {"S", "B", "L", "XL"}) {
    for (const char* patch : {"2", "4", "8"})
      names.push_back(fmt::format("{}-{}/{}", prefix, size, patch));
  }
  return names;
}

Result<DiTConfig> DiTConfigByName(const std::string& name, int input_size) {
  DT_ASSIGN_OR_RETURN(DiTConfig c, SizedConfigByName("DiT", name, input_size));
  DT_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::vector<std::string> DiTConfigNames() {
  return SizedConfigNames("DiT");
}

int64_t TrainableParameterCount(const DiTConfig& c) {
  const int64_t D = c.hidden_size, M = c.mlp_hidden();
  const int64_t block = LinearParams(D, 6 * D) + LinearParams(D, 3 * D) + LinearParams(D, D) +
                        LinearParams(D, M) + LinearParams(M, D);
  const int64_t embed = LinearParams(c.patch_features(), D) + LinearParams(256, D) +
                        LinearParams(D, D) + int64_t(c.label_rows()) * D;
  const int64_t final = LinearParams(D, 2 * D) +
                        LinearParams(D, int64_t(c.patch_size) * c.patch_size * c.out_channels());
  return embed + c.depth * block + final;
}

int64_t ParameterCount(const DiTConfig& c) {
  const int64_t temp_embed = c.video ? int64_t(c.num_frames) * c.hidden_size : 0;
  return TrainableParameterCount(c) + int64_t(c.tokens()) * c.hidden_size + temp_embed;
}

double ForwardMacsPerSample(const DiTConfig& c) {
  const double D = c.hidden_size, F = c.frames(), T = F * c.tokens(), M = c.mlp_hidden();
  const double linear = 6 * D * D + 3 * D * D * T + D * D * T + 2 * M * D * T;
  double attention = 0;
  for (int i = 0; i < c.depth; ++i)  // a spatial block attends within each frame
    attention += c.temporal_block(i) ? 2 * F * T * D : 2 * T * c.tokens() * D;
  const double embed = T * c.patch_features() * D + 256 * D + D * D;
  const double final = 2 * D * D + T * D * c.patch_size * c.patch_size * c.out_channels();
  return embed + c.depth * linear + attention + final;
}

double TrainingFlopsPerSample(const DiTConfig& c) {
  return 6.0 * ForwardMacsPerSample(c);
}

}  // namespace difftrain
