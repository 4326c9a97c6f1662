#include "model/device.h"

#ifdef DIFFTRAIN_HAVE_CUDA
#include "model/cuda/device_query.h"
#endif

namespace difftrain {

DeviceInventory QueryDeviceInventory() {
  DeviceInventory inventory;
#ifdef DIFFTRAIN_HAVE_CUDA
  inventory.cuda_built = true;
  std::string error;
  for (const cuda::DeviceProperties& d : cuda::QueryDevices(&error)) {
    inventory.gpus.push_back(
        {d.index, d.name, d.total_memory_bytes, d.compute_major * 10 + d.compute_minor});
  }
  if (inventory.gpus.empty()) inventory.note = error.empty() ? "no CUDA device" : error;
#else
  inventory.note = "built without CUDA";
#endif
  return inventory;
}

}  // namespace difftrain
