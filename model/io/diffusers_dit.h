// DiT in diffusers' form: the Transformer2DModel (norm_type "ada_norm_zero") that DiTPipeline
// keeps in a pipeline's transformer/ (facebook/DiT-XL-2-256 and the like), against DiT's own
// names, which difftrain's DiT uses (docs/export.md, docs/formats.md).
//
// Diffusers holds DiT's tensors under other names, splits each block's qkv into to_q, to_k and
// to_v, and keeps a copy of the timestep and class embedders in every block's norm1.emb (its
// final layer takes block 0's); it computes the position embedding and stores none. One table
// serves both ways: `difftrain export` writes every copy, pretrained weights are read from the
// first, and the others must equal it (difftrain's DiT has one embedder).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace difftrain::io {

// Rows [first_row, first_row + rows) of the tensor `name`; rows -1: all of it.
struct TensorRows {
  std::string name;
  int64_t first_row = 0;
  int64_t rows = -1;
};

// Where one of DiT's tensors lies in diffusers' Transformer2DModel.
struct DiffusersDitPlace {
  std::vector<TensorRows> parts;    // its rows, in order: to_q, to_k, to_v of a qkv; else one
  std::vector<std::string> copies;  // further tensors holding all of it again (blocks 1…)
};

// The place of DiT's tensor `name` of `rows` rows in a Transformer2DModel of `depth` blocks;
// nullopt for a name DiT's layout does not have, and for pos_embed, which diffusers computes.
std::optional<DiffusersDitPlace> DiffusersDitTensor(const std::string& name, int64_t rows,
                                                    int depth);

// The blocks of a DiT whose tensors are so named (DiT's names: blocks.N.attn.qkv.weight); 0 for
// another model.
int DitDepth(const std::vector<std::string>& names);

// Whether tensors so named are a diffusers DiT's (its block 0's timestep embedder among them).
bool IsDiffusersDit(const std::vector<std::string>& names);

}  // namespace difftrain::io
