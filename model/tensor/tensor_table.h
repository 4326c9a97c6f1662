// A table of named tensors laid out back to back in one flat arena.
//
// The parameter table of a model is built once; the gradient, optimizer-moment and EMA
// arenas reuse the same table, so zeroing, clipping, the optimizer, sharding and
// checkpointing are each one loop over one allocation.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace difftrain {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in elements from the start of the arena
  size_t numel = 0;
};

class TensorTable {
 public:
  // Appends a tensor after the last one and returns its offset in elements.
  size_t Add(const std::string& name, std::vector<int64_t> shape);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const TensorSpec* Find(const std::string& name) const;
  // The tensors' names, in order.
  std::vector<std::string> Names() const;
  size_t total() const { return total_; }

 private:
  std::vector<TensorSpec> tensors_;
  std::unordered_map<std::string, size_t> index_;
  size_t total_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace difftrain
