#include "model/dit/shard.h"

#include <numeric>

#include "common/check.h"

namespace difftrain {
namespace {

// Builds the local table and its fragments, tensor by tensor, in the reference order.
class TableBuilder {
 public:
  TableBuilder(const DiTShard& s, ShardedParameters& out) : s_(s), out_(out) {}

  // Every rank holds the whole tensor.
  void Replicated(const std::string& name, std::vector<int64_t> shape) {
    const size_t numel = Numel(shape);
    const size_t global = global_.Add(name, shape);
    const size_t local = out_.table.Add(name, std::move(shape));
    out_.fragments.push_back({local, global, numel});
    out_.split.push_back(false);
  }

  // Rows split: the rows form `parts` equal blocks (q, k, v for qkv), each split over tp.
  void ColumnParallel(const std::string& name, std::vector<int64_t> shape, int parts) {
    const size_t global = global_.Add(name, shape);
    const int64_t rows = shape[0], cols = Numel(shape) / rows;
    const int64_t part_rows = rows / parts, local_rows = part_rows / s_.tp;
    std::vector<int64_t> local_shape = shape;
    local_shape[0] = rows / s_.tp;
    const size_t local = out_.table.Add(name, std::move(local_shape));
    for (int p = 0; p < parts; ++p) {
      out_.fragments.push_back({local + size_t(p * local_rows * cols),
                                global + size_t((p * part_rows + s_.tp_rank * local_rows) * cols),
                                size_t(local_rows * cols)});
    }
    out_.split.push_back(s_.tp > 1);
  }

  // Input columns split: rank r holds columns [r·I/tp, (r+1)·I/tp) of every row.
  void RowParallel(const std::string& name, std::vector<int64_t> shape) {
    const size_t global = global_.Add(name, shape);
    const int64_t rows = shape[0], cols = shape[1], local_cols = cols / s_.tp;
    const size_t local = out_.table.Add(name, {rows, local_cols});
    for (int64_t o = 0; o < rows; ++o) {
      out_.fragments.push_back({local + size_t(o * local_cols),
                                global + size_t(o * cols + s_.tp_rank * local_cols),
                                size_t(local_cols)});
    }
    out_.split.push_back(s_.tp > 1);
  }

  // A tensor of another stage: only its place in the global arena.
  void Elsewhere(const std::string& name, std::vector<int64_t> shape) {
    global_.Add(name, std::move(shape));
  }

 private:
  static size_t Numel(const std::vector<int64_t>& shape) {
    return size_t(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
  }

  const DiTShard& s_;
  ShardedParameters& out_;
  TensorTable global_;
};

std::vector<int> BalancedStages(int depth, int pp) {
  std::vector<int> blocks(pp, depth / pp);
  for (int s = pp - depth % pp; s < pp; ++s)
    ++blocks[s];
  return blocks;
}

}  // namespace

Status ValidateParallelLayout(const DiTConfig& c, int tp, int cp, int pp,
                              const std::vector<int>& stage_blocks) {
  if (tp < 1 || cp < 1 || pp < 1) {
    return Errorf("parallel: tp, cp and pp must be positive, got tp {}, cp {}, pp {}", tp, cp, pp);
  }
  if (c.num_heads % tp != 0) {
    return Errorf(
        "tensor parallelism: model.num_heads {} is not divisible by tp {} (each rank takes "
        "whole attention heads)",
        c.num_heads, tp);
  }
  if (c.hidden_size % tp != 0 || c.mlp_hidden() % tp != 0) {
    return Errorf(
        "tensor parallelism: model.hidden_size {} and the MLP width {} must be divisible by tp "
        "{}",
        c.hidden_size, c.mlp_hidden(), tp);
  }
  if (c.tokens() % cp != 0) {
    return Errorf(
        "context parallelism: the sequence of {} tokens ({}x{} patches{}) is not divisible by cp "
        "{}",
        c.tokens(), c.grid(), c.grid(), c.video ? " per frame" : "", cp);
  }
  if (stage_blocks.empty()) {
    if (c.depth < pp) {
      return Errorf(
          "pipeline parallelism: model.depth {} is smaller than pp {} (every stage "
          "needs a block)",
          c.depth, pp);
    }
    return Status::Ok();
  }
  if (static_cast<int>(stage_blocks.size()) != pp) {
    return Errorf("parallel.stage_blocks lists {} stages but pp is {}", stage_blocks.size(), pp);
  }
  int total = 0;
  for (int b : stage_blocks) {
    if (b < 1) return Errorf("parallel.stage_blocks: every stage needs at least one block");
    total += b;
  }
  if (total != c.depth) {
    return Errorf("parallel.stage_blocks add up to {} blocks but model.depth is {}", total,
                  c.depth);
  }
  return Status::Ok();
}

DiTShard DiTShard::Whole(const DiTConfig& c) {
  DiTShard s;
  s.end_block = c.depth;
  return s;
}

Result<DiTShard> DiTShard::Create(const DiTConfig& c, int tp, int tp_rank, int cp, int cp_rank,
                                  int pp, int stage, const std::vector<int>& stage_blocks) {
  DT_RETURN_IF_ERROR(ValidateParallelLayout(c, tp, cp, pp, stage_blocks));
  DT_CHECK(tp_rank >= 0 && tp_rank < tp && cp_rank >= 0 && cp_rank < cp && stage >= 0 && stage < pp,
           "rank outside the layout");
  const std::vector<int> blocks = stage_blocks.empty() ? BalancedStages(c.depth, pp) : stage_blocks;
  DiTShard s;
  s.tp = tp;
  s.tp_rank = tp_rank;
  s.cp = cp;
  s.cp_rank = cp_rank;
  s.pp = pp;
  s.stage = stage;
  s.first_block = std::accumulate(blocks.begin(), blocks.begin() + stage, 0);
  s.end_block = s.first_block + blocks[stage];
  return s;
}

ShardedParameters ShardParameters(const DiTConfig& c, const DiTShard& s) {
  ShardedParameters out;
  TableBuilder b(s, out);
  const int64_t D = c.hidden_size, M = c.mlp_hidden(), p = c.patch_size;
  auto replicated = [&](bool here, const std::string& name, std::vector<int64_t> shape) {
    if (here) {
      b.Replicated(name, std::move(shape));
    } else {
      b.Elsewhere(name, std::move(shape));
    }
  };
  const bool first = s.first_stage(), last = s.last_stage();
  replicated(first, "x_embedder.proj.weight", {D, c.in_channels, p, p});
  replicated(first, "x_embedder.proj.bias", {D});
  replicated(first, "t_embedder.mlp.0.weight", {D, kFrequencyDim});
  replicated(first, "t_embedder.mlp.0.bias", {D});
  replicated(first, "t_embedder.mlp.2.weight", {D, D});
  replicated(first, "t_embedder.mlp.2.bias", {D});
  if (c.has_labels()) replicated(first, "y_embedder.embedding_table.weight", {c.label_rows(), D});
  for (int l = 0; l < c.depth; ++l) {
    const std::string n = "blocks." + std::to_string(l) + ".";
    const bool here = l >= s.first_block && l < s.end_block;
    if (!here) {
      for (auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"attn.qkv.weight", {3 * D, D}},
               {"attn.qkv.bias", {3 * D}},
               {"attn.proj.weight", {D, D}},
               {"attn.proj.bias", {D}},
               {"mlp.fc1.weight", {M, D}},
               {"mlp.fc1.bias", {M}},
               {"mlp.fc2.weight", {D, M}},
               {"mlp.fc2.bias", {D}},
               {"adaLN_modulation.1.weight", {6 * D, D}},
               {"adaLN_modulation.1.bias", {6 * D}}}) {
        b.Elsewhere(n + name, shape);
      }
      continue;
    }
    b.ColumnParallel(n + "attn.qkv.weight", {3 * D, D}, 3);
    b.ColumnParallel(n + "attn.qkv.bias", {3 * D}, 3);
    b.RowParallel(n + "attn.proj.weight", {D, D});
    b.Replicated(n + "attn.proj.bias", {D});
    b.ColumnParallel(n + "mlp.fc1.weight", {M, D}, 1);
    b.ColumnParallel(n + "mlp.fc1.bias", {M}, 1);
    b.RowParallel(n + "mlp.fc2.weight", {D, M});
    b.Replicated(n + "mlp.fc2.bias", {D});
    b.Replicated(n + "adaLN_modulation.1.weight", {6 * D, D});
    b.Replicated(n + "adaLN_modulation.1.bias", {6 * D});
  }
  replicated(last, "final_layer.adaLN_modulation.1.weight", {2 * D, D});
  replicated(last, "final_layer.adaLN_modulation.1.bias", {2 * D});
  replicated(last, "final_layer.linear.weight", {p * p * c.out_channels(), D});
  replicated(last, "final_layer.linear.bias", {p * p * c.out_channels()});
  return out;
}

}  // namespace difftrain
