#include "model/cuda/device_query.h"

#include <cuda_runtime.h>

namespace difftrain::cuda {

std::vector<DeviceProperties> QueryDevices(std::string* error) {
  std::vector<DeviceProperties> devices;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (error != nullptr) *error = cudaGetErrorString(status);
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    status = cudaGetDeviceProperties(&prop, i);
    if (status != cudaSuccess) {
      if (error != nullptr) *error = cudaGetErrorString(status);
      continue;
    }
    devices.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor,
                       prop.multiProcessorCount, prop.sharedMemPerBlockOptin});
  }
  return devices;
}

}  // namespace difftrain::cuda
