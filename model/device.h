// The compute devices of this machine: CUDA GPUs when the CUDA backend is built and a
// driver answers, otherwise none (ranks then run on CPU slots).
#pragma once

#include <string>
#include <vector>

namespace difftrain {

struct GpuInfo {
  int index = 0;
  std::string name;
  size_t memory_bytes = 0;
  int compute_capability = 0;  // e.g. 90 for sm_90
};

struct DeviceInventory {
  bool cuda_built = false;
  std::vector<GpuInfo> gpus;
  std::string note;  // why there are no GPUs, when there are none
};

DeviceInventory QueryDeviceInventory();

}  // namespace difftrain
