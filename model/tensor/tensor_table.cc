#include "model/tensor/tensor_table.h"

#include "common/check.h"

namespace difftrain {

size_t TensorTable::Add(const std::string& name, std::vector<int64_t> shape) {
  DT_CHECK(!index_.contains(name), "tensor '{}' added twice", name);
  size_t numel = 1;
  for (int64_t d : shape) {
    DT_CHECK(d > 0, "tensor '{}' has a non-positive dimension", name);
    numel *= static_cast<size_t>(d);
  }
  index_[name] = tensors_.size();
  tensors_.push_back({name, std::move(shape), total_, numel});
  total_ += numel;
  return total_ - numel;
}

const TensorSpec* TensorTable::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> TensorTable::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorSpec& t : tensors_)
    names.push_back(t.name);
  return names;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace difftrain
