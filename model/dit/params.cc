#include "model/dit/params.h"

#include <string>

#include "common/check.h"

namespace difftrain {

DiTParams DiTParams::Bind(const TensorTable& table, const DiTShard& shard) {
  auto offset = [&table](const std::string& name) {
    const TensorSpec* t = table.Find(name);
    DT_CHECK(t != nullptr, "{} is not in this shard's parameter table", name);
    return t->offset;
  };
  DiTParams p;
  if (shard.first_stage()) {
    p.x_w = offset("x_embedder.proj.weight");
    p.x_b = offset("x_embedder.proj.bias");
    p.t1_w = offset("t_embedder.mlp.0.weight");
    p.t1_b = offset("t_embedder.mlp.0.bias");
    p.t2_w = offset("t_embedder.mlp.2.weight");
    p.t2_b = offset("t_embedder.mlp.2.bias");
    if (table.Find("y_embedder.embedding_table.weight") != nullptr)  // Latte may have none
      p.y_table = offset("y_embedder.embedding_table.weight");
  }
  for (int l = shard.first_block; l < shard.end_block; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    p.blocks.push_back(
        {offset(b + "adaLN_modulation.1.weight"), offset(b + "adaLN_modulation.1.bias"),
         offset(b + "attn.qkv.weight"), offset(b + "attn.qkv.bias"), offset(b + "attn.proj.weight"),
         offset(b + "attn.proj.bias"), offset(b + "mlp.fc1.weight"), offset(b + "mlp.fc1.bias"),
         offset(b + "mlp.fc2.weight"), offset(b + "mlp.fc2.bias")});
  }
  if (shard.last_stage()) {
    p.fada_w = offset("final_layer.adaLN_modulation.1.weight");
    p.fada_b = offset("final_layer.adaLN_modulation.1.bias");
    p.flin_w = offset("final_layer.linear.weight");
    p.flin_b = offset("final_layer.linear.bias");
  }
  return p;
}

}  // namespace difftrain
