#include "model/io/diffusers_dit.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace difftrain::io {
namespace {

constexpr std::string_view kEmbedders = "norm1.emb.";

// DiT's block tensor (after "blocks.N.") and diffusers' (after "transformer_blocks.N."); qkv
// apart.
constexpr std::pair<std::string_view, std::string_view> kBlockNames[] = {
    {"adaLN_modulation.1.", "norm1.linear."},
    {"attn.proj.", "attn1.to_out.0."},
    {"mlp.fc1.", "ff.net.0.proj."},
    {"mlp.fc2.", "ff.net.2."},
};

// The model's tensors outside the blocks: DiT's prefix and diffusers'; the embedders are
// under kEmbedders of every block.
constexpr std::pair<std::string_view, std::string_view> kTopNames[] = {
    {"x_embedder.proj.", "pos_embed.proj."},
    {"final_layer.adaLN_modulation.1.", "proj_out_1."},
    {"final_layer.linear.", "proj_out_2."},
};
constexpr std::pair<std::string_view, std::string_view> kEmbedderNames[] = {
    {"t_embedder.mlp.0.", "timestep_embedder.linear_1."},
    {"t_embedder.mlp.2.", "timestep_embedder.linear_2."},
    {"y_embedder.embedding_table.", "class_embedder.embedding_table."},
};

// "weight" or "bias" (what follows a prefix), else nullopt.
bool IsLeaf(std::string_view rest) {
  return rest == "weight" || rest == "bias";
}

std::string Block(int i) {
  return fmt::format("transformer_blocks.{}.", i);
}

}  // namespace

std::optional<DiffusersDitPlace> DiffusersDitTensor(const std::string& name, int64_t rows,
                                                    int depth) {
  const std::string_view n = name;
  for (const auto& [dit, diffusers] : kTopNames) {
    if (n.starts_with(dit) && IsLeaf(n.substr(dit.size())))
      return DiffusersDitPlace{{{std::string(diffusers) + name.substr(dit.size())}}, {}};
  }
  for (const auto& [dit, diffusers] : kEmbedderNames) {
    if (!n.starts_with(dit) || !IsLeaf(n.substr(dit.size()))) continue;
    const std::string leaf = std::string(diffusers) + name.substr(dit.size());
    DiffusersDitPlace place{{{Block(0) + std::string(kEmbedders) + leaf}}, {}};
    for (int i = 1; i < depth; ++i)
      place.copies.push_back(Block(i) + std::string(kEmbedders) + leaf);
    return place;
  }
  constexpr std::string_view kBlocks = "blocks.";
  if (!n.starts_with(kBlocks)) return std::nullopt;
  std::string_view rest = n.substr(kBlocks.size());
  const size_t dot = rest.find('.');
  const std::string_view digits = rest.substr(0, dot);
  if (dot == std::string_view::npos || digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c) != 0; })) {
    return std::nullopt;
  }
  const int block = std::stoi(std::string(digits));
  if (block >= depth) return std::nullopt;
  rest.remove_prefix(dot + 1);
  const std::string prefix = Block(block);
  if (rest.starts_with("attn.qkv.") && IsLeaf(rest.substr(9))) {
    if (rows % 3 != 0) return std::nullopt;
    const std::string leaf(rest.substr(9));
    const int64_t third = rows / 3;
    return DiffusersDitPlace{{{prefix + "attn1.to_q." + leaf, 0, third},
                              {prefix + "attn1.to_k." + leaf, third, third},
                              {prefix + "attn1.to_v." + leaf, 2 * third, third}},
                             {}};
  }
  for (const auto& [dit, diffusers] : kBlockNames) {
    if (rest.starts_with(dit) && IsLeaf(rest.substr(dit.size()))) {
      return DiffusersDitPlace{
          {{prefix + std::string(diffusers) + std::string(rest.substr(dit.size()))}}, {}};
    }
  }
  return std::nullopt;
}

int DitDepth(const std::vector<std::string>& names) {
  int depth = 0;
  while (std::find(names.begin(), names.end(), fmt::format("blocks.{}.attn.qkv.weight", depth)) !=
         names.end()) {
    ++depth;
  }
  return depth;
}

bool IsDiffusersDit(const std::vector<std::string>& names) {
  const std::string probe =
      Block(0) + std::string(kEmbedders) + "timestep_embedder.linear_1.weight";
  return std::find(names.begin(), names.end(), probe) != names.end();
}

}  // namespace difftrain::io
