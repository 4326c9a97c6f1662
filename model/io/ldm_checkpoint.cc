#include "model/io/ldm_checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace difftrain::io {
namespace {

// The index after `prefix` in `name` ("down_blocks.3.x" after "down_blocks." is 3), and the
// rest after its dot; nullopt where `name` does not start with `prefix` and a number.
struct Indexed {
  int index;
  std::string rest;
};
// The layouts number their blocks and layers from 0 up to a few dozen; a number of more than
// four digits is none of theirs (and would overflow the block arithmetic below).
constexpr size_t kMaxIndexDigits = 4;

std::optional<Indexed> After(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  const std::string_view digits = name.substr(0, dot);
  if (digits.empty() || digits.size() > kMaxIndexDigits ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return std::nullopt;
  return Indexed{std::atoi(std::string(digits).c_str()),
                 dot == std::string_view::npos ? "" : std::string(name.substr(dot + 1))};
}

// `rest` with its leading component `from` replaced by `to`; nullopt where it has none of them.
std::optional<std::string> Renamed(
    const std::string& rest,
    std::initializer_list<std::pair<std::string_view, std::string_view>> map) {
  for (const auto& [from, to] : map) {
    if (rest.starts_with(std::string(from) + "."))
      return std::string(to) + rest.substr(from.size());
  }
  return std::nullopt;
}

// A UNet resnet's layers, diffusers' names to the original ResBlock's.
std::optional<std::string> UNetResnet(const std::string& rest) {
  return Renamed(rest, {{"norm1", "in_layers.0"},
                        {"conv1", "in_layers.2"},
                        {"time_emb_proj", "emb_layers.1"},
                        {"norm2", "out_layers.0"},
                        {"conv2", "out_layers.3"},
                        {"conv_shortcut", "skip_connection"}});
}

// A VAE resnet's: its shortcut alone is named otherwise.
std::string VaeResnet(const std::string& rest) {
  return Renamed(rest, {{"conv_shortcut", "nin_shortcut"}}).value_or(rest);
}

// The distinct indices after `prefix` among `names`.
std::set<int> Indices(const std::vector<std::string>& names, std::string_view prefix) {
  std::set<int> indices;
  for (const std::string& name : names) {
    if (std::optional<Indexed> i = After(name, prefix)) indices.insert(i->index);
  }
  return indices;
}

// The diffusers UNet name `name` in the original layout, for L resnets a down level and the up
// blocks `up_attends`; nullopt where it has no place there.
std::optional<std::string> LdmUNetName(const std::string& name, int L,
                                       const std::set<int>& up_attends) {
  if (std::optional<std::string> top = Renamed(name, {{"conv_in", "input_blocks.0.0"},
                                                      {"time_embedding.linear_1", "time_embed.0"},
                                                      {"time_embedding.linear_2", "time_embed.2"},
                                                      {"conv_norm_out", "out.0"},
                                                      {"conv_out", "out.2"}})) {
    return top;
  }
  const auto part = [](const std::string& rest, std::string_view kind) -> std::optional<Indexed> {
    return After(rest, std::string(kind) + ".");
  };
  if (std::optional<Indexed> b = After(name, "down_blocks.")) {
    if (std::optional<Indexed> l = part(b->rest, "resnets")) {
      std::optional<std::string> resnet = UNetResnet(l->rest);
      if (!resnet) return std::nullopt;
      return fmt::format("input_blocks.{}.0.{}", 1 + b->index * (L + 1) + l->index, *resnet);
    }
    if (std::optional<Indexed> l = part(b->rest, "attentions"))
      return fmt::format("input_blocks.{}.1.{}", 1 + b->index * (L + 1) + l->index, l->rest);
    if (std::optional<Indexed> d = part(b->rest, "downsamplers"); d && d->rest.starts_with("conv."))
      return fmt::format("input_blocks.{}.0.op.{}", (b->index + 1) * (L + 1), d->rest.substr(5));
    return std::nullopt;
  }
  if (std::optional<Indexed> r = After(name, "mid_block.resnets."); r && r->index < 2) {
    std::optional<std::string> resnet = UNetResnet(r->rest);
    if (!resnet) return std::nullopt;
    return fmt::format("middle_block.{}.{}", 2 * r->index, *resnet);
  }
  if (std::optional<Indexed> a = After(name, "mid_block.attentions."); a && a->index == 0)
    return "middle_block.1." + a->rest;
  if (std::optional<Indexed> b = After(name, "up_blocks.")) {
    if (std::optional<Indexed> l = part(b->rest, "resnets")) {
      std::optional<std::string> resnet = UNetResnet(l->rest);
      if (!resnet) return std::nullopt;
      return fmt::format("output_blocks.{}.0.{}", b->index * (L + 1) + l->index, *resnet);
    }
    if (std::optional<Indexed> l = part(b->rest, "attentions"))
      return fmt::format("output_blocks.{}.1.{}", b->index * (L + 1) + l->index, l->rest);
    if (std::optional<Indexed> u = part(b->rest, "upsamplers"); u && u->rest.starts_with("conv.")) {
      return fmt::format("output_blocks.{}.{}.conv.{}", b->index * (L + 1) + L,
                         up_attends.count(b->index) ? 2 : 1, u->rest.substr(5));
    }
  }
  return std::nullopt;
}

// The shape of the file's tensor `name`, or an error naming it.
// The shape of tensor `name`, which must have one of `ranks` dimensions, each of a size a
// config's int holds (the configs are read from them).
Result<std::vector<int64_t>> ShapeOf(const SafetensorsFile& file, const std::string& name,
                                     std::initializer_list<size_t> ranks) {
  const TensorView* t = file.Find(name);
  if (t == nullptr) {
    return Errorf("'{}' holds no tensor '{}' (an original Stable Diffusion checkpoint has it)",
                  file.path(), name);
  }
  const bool ranked = std::find(ranks.begin(), ranks.end(), t->shape.size()) != ranks.end();
  const bool sized = std::all_of(t->shape.begin(), t->shape.end(),
                                 [](int64_t d) { return d <= std::numeric_limits<int>::max(); });
  if (!ranked || !sized) {
    return Errorf("'{}': tensor '{}' has shape [{}], not one of {} dimensions{}", file.path(), name,
                  fmt::join(t->shape, ", "), fmt::join(ranks, " or "),
                  sized ? "" : " of an int's size");
  }
  return t->shape;
}

}  // namespace

bool IsLdmCheckpoint(const SafetensorsFile& file) {
  return file.Find(std::string(kLdmUNetPrefix) + "input_blocks.0.0.weight") != nullptr;
}

bool HasLdmVae(const SafetensorsFile& file) {
  return file.Find(std::string(kLdmVaePrefix) + "decoder.conv_in.weight") != nullptr;
}

bool IsSdxlCheckpoint(const SafetensorsFile& file) {
  return file.Find(std::string(kLdmUNetPrefix) + "label_emb.0.0.weight") != nullptr ||
         file.Find(std::string(kSgmOpenClipPrefix) + "text_projection") != nullptr;
}

namespace {

bool HasOpenClip(const SafetensorsFile& file, const std::string& prefix) {
  return file.Find(prefix + "transformer.resblocks.0.attn.in_proj_weight") != nullptr;
}

}  // namespace

bool IsSdxlRefinerCheckpoint(const SafetensorsFile& file) {
  return HasOpenClip(file, kSgmRefinerOpenClipPrefix);
}

std::vector<LdmTextModel> LdmTextModels(const SafetensorsFile& file) {
  const auto clip = [&](const std::string& prefix) {
    return file.Find(prefix + "text_model.embeddings.token_embedding.weight") != nullptr;
  };
  const auto open_clip = [&](const std::string& prefix) { return HasOpenClip(file, prefix); };
  std::vector<LdmTextModel> models;
  if (clip(kLdmClipPrefix)) models.push_back({kLdmClipPrefix, false});
  if (open_clip(kLdmOpenClipPrefix)) models.push_back({kLdmOpenClipPrefix, true});
  if (clip(kSgmClipPrefix)) models.push_back({kSgmClipPrefix, false});
  if (open_clip(kSgmOpenClipPrefix)) models.push_back({kSgmOpenClipPrefix, true});
  if (open_clip(kSgmRefinerOpenClipPrefix)) models.push_back({kSgmRefinerOpenClipPrefix, true});
  return models;
}

std::optional<LdmTensorPart> LdmOpenClipTensor(const std::string& name, int64_t hidden) {
  if (std::optional<std::string> top =
          Renamed(name, {{"text_model.embeddings.token_embedding", "token_embedding"},
                         {"text_model.final_layer_norm", "ln_final"}})) {
    return LdmTensorPart{*top};
  }
  if (name == "text_model.embeddings.position_embedding.weight")
    return LdmTensorPart{"positional_embedding"};
  if (name == "text_projection.weight")
    return LdmTensorPart{.name = "text_projection", .transposed = true};
  std::optional<Indexed> layer = After(name, "text_model.encoder.layers.");
  if (!layer) return std::nullopt;
  const std::string block = fmt::format("transformer.resblocks.{}.", layer->index);
  const std::string& rest = layer->rest;
  const std::string_view projections[] = {"self_attn.q_proj.", "self_attn.k_proj.",
                                          "self_attn.v_proj."};
  for (int j = 0; j < 3; ++j) {
    if (rest.starts_with(projections[j])) {
      const std::string kind = rest.substr(projections[j].size());  // weight or bias
      return LdmTensorPart{block + "attn.in_proj_" + kind, j * hidden, hidden};
    }
  }
  std::optional<std::string> renamed = Renamed(rest, {{"self_attn.out_proj", "attn.out_proj"},
                                                      {"layer_norm1", "ln_1"},
                                                      {"layer_norm2", "ln_2"},
                                                      {"mlp.fc1", "mlp.c_fc"},
                                                      {"mlp.fc2", "mlp.c_proj"}});
  if (!renamed) return std::nullopt;
  return LdmTensorPart{block + *renamed};
}

std::vector<std::optional<std::string>> SgmUNetNames(const std::vector<std::string>& names) {
  const int L = static_cast<int>(Indices(names, "down_blocks.0.resnets.").size());
  std::set<int> up_attends;
  for (const std::string& name : names) {
    if (std::optional<Indexed> b = After(name, "up_blocks.");
        b && b->rest.starts_with("attentions."))
      up_attends.insert(b->index);
  }
  std::vector<std::optional<std::string>> sgm;
  for (const std::string& name : names) {
    std::optional<std::string> renamed = Renamed(
        name,
        {{"add_embedding.linear_1", "label_emb.0.0"}, {"add_embedding.linear_2", "label_emb.0.2"}});
    sgm.push_back(renamed ? renamed : LdmUNetName(name, L, up_attends));
  }
  return sgm;
}

Result<std::vector<std::string>> LdmUNetNames(const std::vector<std::string>& names) {
  const std::vector<std::optional<std::string>> sgm = SgmUNetNames(names);
  std::vector<std::string> ldm;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!sgm[i]) {
      return Errorf(
          "the UNet's '{}' has no place in an original Stable Diffusion checkpoint (its layout "
          "holds SD 1.x/2.x and SDXL UNets: no guidance or class embeddings)",
          names[i]);
    }
    ldm.push_back(kLdmUNetPrefix + *sgm[i]);
  }
  return ldm;
}

Result<nlohmann::json> LdmUNetConfig(const SafetensorsFile& file) {
  const std::string p = kLdmUNetPrefix;
  const auto shape = [&](const std::string& name, std::initializer_list<size_t> ranks) {
    return ShapeOf(file, p + name, ranks);
  };
  if (file.Find(p + "label_emb.weight")) {
    return Errorf(
        "'{}': a UNet with class embeddings (label_emb: the x4 upscaler's) is not supported; SD "
        "1.x, 2.x and SDXL are",
        file.path());
  }
  std::vector<std::string> unet;
  for (const std::string& name : file.Names()) {
    if (name.starts_with(p)) unet.push_back(name.substr(p.size()));
  }
  const std::set<int> inputs = Indices(unet, "input_blocks.");
  const int N = inputs.empty() ? 0 : *inputs.rbegin() + 1;
  int first_op = 0;
  for (int i = 1; i < N && first_op == 0; ++i) {
    if (file.Find(fmt::format("{}input_blocks.{}.0.op.weight", p, i))) first_op = i;
  }
  const int L = first_op > 0 ? first_op - 1 : N - 1;
  if (L < 1 || N % (L + 1) != 0) {
    return Errorf("'{}': {} input blocks do not make levels of {} resnets and a downsampler",
                  file.path(), N, L);
  }
  const int levels = N / (L + 1);
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> conv_in, shape("input_blocks.0.0.weight", {4}));
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> conv_out, shape("out.2.weight", {4}));
  std::vector<int> channels;
  std::vector<std::string> down, up;
  std::optional<std::string> attention;  // the first attention's name
  std::vector<int> depths;               // transformer blocks a level (1 where it attends not)
  for (int b = 0; b < levels; ++b) {
    const std::string block = fmt::format("input_blocks.{}.", 1 + b * (L + 1));
    DT_ASSIGN_OR_RETURN(const std::vector<int64_t> out,
                        shape(block + "0.out_layers.3.weight", {4}));
    channels.push_back(static_cast<int>(out[0]));
    const bool attends = file.Find(p + block + "1.proj_in.weight") != nullptr;
    if (attends && !attention) attention = block + "1.";
    down.push_back(attends ? "CrossAttnDownBlock2D" : "DownBlock2D");
    depths.push_back(
        attends ? static_cast<int>(Indices(unet, block + "1.transformer_blocks.").size()) : 1);
  }
  for (int b = levels - 1; b >= 0; --b)
    up.push_back(down[b] == "DownBlock2D" ? "UpBlock2D" : "CrossAttnUpBlock2D");
  if (!attention) return Errorf("'{}': its UNet has no cross-attention", file.path());
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> proj_in,
                      shape(*attention + "proj_in.weight", {2, 4}));
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> to_k,
                      shape(*attention + "transformer_blocks.0.attn2.to_k.weight", {2}));
  const bool linear = proj_in.size() == 2;
  // SD 1.x: 8 heads; SD 2.x: heads of 64 channels (diffusers' attention_head_dim counts heads).
  nlohmann::json heads = 8;
  if (linear) {
    heads = nlohmann::json::array();
    for (int b = 0; b < levels; ++b) {
      if (down[b] != "DownBlock2D" && channels[b] % 64 != 0) {
        return Errorf(
            "'{}': level {} has {} channels, which SD 2.x's heads of 64 channels do not divide",
            file.path(), b, channels[b]);
      }
      heads.push_back(std::max(1, channels[b] / 64));
    }
  }
  // diffusers' mid block takes the last level's depth: a last level that attends not (the
  // refiner's) is given the mid block's.
  const int mid_depth =
      static_cast<int>(Indices(unet, "middle_block.1.transformer_blocks.").size());
  if (mid_depth > 0 && mid_depth != depths.back()) {
    if (down.back() != "DownBlock2D") {
      return Errorf(
          "'{}': the mid block's {} transformer blocks are not its last level's {}, which "
          "diffusers' UNet2DConditionModel cannot hold",
          file.path(), mid_depth, depths.back());
    }
    depths.back() = mid_depth;
  }
  nlohmann::json depth = depths;
  if (std::all_of(depths.begin(), depths.end(), [&](int d) { return d == depths[0]; }))
    depth = depths[0];
  nlohmann::json config{{"_class_name", "UNet2DConditionModel"},
                        {"sample_size", 64},
                        {"in_channels", conv_in[1]},
                        {"out_channels", conv_out[0]},
                        {"block_out_channels", channels},
                        {"layers_per_block", L},
                        {"down_block_types", down},
                        {"up_block_types", up},
                        {"cross_attention_dim", to_k[1]},
                        {"attention_head_dim", heads},
                        {"use_linear_projection", linear},
                        {"transformer_layers_per_block", depth},
                        {"norm_num_groups", 32}};
  if (file.Find(p + "label_emb.0.0.weight") == nullptr) return config;
  // SDXL: pooled text ‖ sinusoids of 6 time ids (the refiner's 5), each of
  // addition_time_embed_dim features.
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> label, shape("label_emb.0.0.weight", {2}));
  const bool refiner = IsSdxlRefinerCheckpoint(file);
  const int64_t kTimeIds = refiner ? 5 : 6;
  int64_t time_features = 256;  // SDXL's, which diffusers assumes too
  const std::string projection =
      std::string(refiner ? kSgmRefinerOpenClipPrefix : kSgmOpenClipPrefix) + "text_projection";
  if (const TensorView* t = file.Find(projection); t != nullptr && t->shape.size() == 2) {
    const int64_t rest = label[1] - t->shape[1];
    if (rest <= 0 || rest % kTimeIds != 0) {
      return Errorf(
          "'{}': label_emb.0.0 takes {} features, which are not the pooled text's {} ({}) and "
          "{} time ids' sinusoids",
          file.path(), label[1], t->shape[1], projection, kTimeIds);
    }
    time_features = rest / kTimeIds;
  }
  config["sample_size"] = 128;
  config["addition_embed_type"] = "text_time";
  config["addition_time_embed_dim"] = time_features;
  config["projection_class_embeddings_input_dim"] = label[1];
  if (refiner) config["requires_aesthetics_score"] = true;
  return config;
}

std::vector<std::string> LdmVaeNames(const std::vector<std::string>& names) {
  const int n = static_cast<int>(Indices(names, "encoder.down_blocks.").size());
  std::vector<std::string> ldm;
  for (const std::string& name : names) {
    std::string renamed = name;
    const std::string coder = name.substr(0, name.find('.') + 1);  // "encoder." or "decoder."
    const std::string rest = name.substr(coder.size());
    if (rest.starts_with("conv_norm_out.")) {
      renamed = coder + "norm_out" + rest.substr(13);
    } else if (std::optional<Indexed> i = After(rest, "down_blocks.")) {
      if (std::optional<Indexed> j = After(i->rest, "resnets.")) {
        renamed =
            fmt::format("{}down.{}.block.{}.{}", coder, i->index, j->index, VaeResnet(j->rest));
      } else if (i->rest.starts_with("downsamplers.0.")) {
        renamed = fmt::format("{}down.{}.downsample.{}", coder, i->index, i->rest.substr(15));
      }
    } else if (std::optional<Indexed> i = After(rest, "up_blocks.")) {
      if (std::optional<Indexed> j = After(i->rest, "resnets.")) {
        renamed = fmt::format("{}up.{}.block.{}.{}", coder, n - 1 - i->index, j->index,
                              VaeResnet(j->rest));
      } else if (i->rest.starts_with("upsamplers.0.")) {
        renamed = fmt::format("{}up.{}.upsample.{}", coder, n - 1 - i->index, i->rest.substr(13));
      }
    } else if (std::optional<Indexed> r = After(rest, "mid_block.resnets.")) {
      renamed = fmt::format("{}mid.block_{}.{}", coder, r->index + 1, VaeResnet(r->rest));
    } else if (rest.starts_with("mid_block.attentions.0.")) {
      const std::string layer = rest.substr(23);
      renamed = coder + "mid.attn_1." +
                Renamed(layer, {{"group_norm", "norm"},
                                {"to_q", "q"},
                                {"to_k", "k"},
                                {"to_v", "v"},
                                {"to_out.0", "proj_out"}})
                    .value_or(layer);
    }
    ldm.push_back(kLdmVaePrefix + renamed);
  }
  return ldm;
}

Result<nlohmann::json> LdmVaeConfig(const SafetensorsFile& file) {
  const std::string p = kLdmVaePrefix;
  const auto shape = [&](const std::string& name) { return ShapeOf(file, p + name, {4}); };
  std::vector<std::string> vae;
  for (const std::string& name : file.Names()) {
    if (name.starts_with(p)) vae.push_back(name.substr(p.size()));
  }
  const int levels = static_cast<int>(Indices(vae, "encoder.down.").size());
  const int layers = static_cast<int>(Indices(vae, "encoder.down.0.block.").size());
  if (levels < 1 || layers < 1) return Errorf("'{}': its VAE has no encoder levels", file.path());
  std::vector<int> channels;
  for (int i = 0; i < levels; ++i) {
    DT_ASSIGN_OR_RETURN(const std::vector<int64_t> conv,
                        shape(fmt::format("encoder.down.{}.block.0.conv1.weight", i)));
    channels.push_back(static_cast<int>(conv[0]));
  }
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> conv_in, shape("encoder.conv_in.weight"));
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> decoder_in, shape("decoder.conv_in.weight"));
  DT_ASSIGN_OR_RETURN(const std::vector<int64_t> decoder_out, shape("decoder.conv_out.weight"));
  return nlohmann::json{
      {"_class_name", "AutoencoderKL"},
      {"in_channels", conv_in[1]},
      {"out_channels", decoder_out[0]},
      {"latent_channels", decoder_in[1]},
      {"block_out_channels", channels},
      {"layers_per_block", layers},
      {"down_block_types", std::vector<std::string>(levels, "DownEncoderBlock2D")},
      {"up_block_types", std::vector<std::string>(levels, "UpDecoderBlock2D")},
      {"norm_num_groups", 32},
      {"scaling_factor", IsSdxlCheckpoint(file) ? 0.13025 : 0.18215}};
}

}  // namespace difftrain::io
