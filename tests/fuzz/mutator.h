// What a target's LLVMFuzzerCustomMutator shares: libFuzzer's own byte-level mutation, and
// handing back the input a structure-aware mutation made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

// libFuzzer's own mutation of the bytes.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace difftrain::fuzz {

// `text` as the mutated input in `data`; where it would pass `max_size`, libFuzzer's own
// mutation of the input instead.
inline size_t Mutated(uint8_t* data, size_t size, size_t max_size, const std::string& text) {
  if (text.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, text.data(), text.size());
  return text.size();
}

}  // namespace difftrain::fuzz
