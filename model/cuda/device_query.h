// CUDA device discovery, compiled only when the CUDA backend is built.
#pragma once

#include <string>
#include <vector>

namespace difftrain::cuda {

struct DeviceProperties {
  int index = 0;
  std::string name;
  size_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  size_t shared_memory_per_block = 0;  // what a kernel may opt in to
};

// The visible CUDA devices. A machine without a driver or GPU has none: that is an empty
// list with `error` set to the runtime's reason, never an abort.
std::vector<DeviceProperties> QueryDevices(std::string* error);

}  // namespace difftrain::cuda
