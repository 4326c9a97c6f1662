#include "model/train/cuda/model_step.h"

namespace difftrain {

Result<cuda::DeviceProperties> FindGpu(int device) {
  std::string why;
  const std::vector<cuda::DeviceProperties> devices = cuda::QueryDevices(&why);
  if (devices.empty()) return Errorf("train.device cuda: no usable GPU: {}", why);
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return Errorf("train.device cuda: GPU {} asked for, but this machine has {} (0..{})", device,
                  devices.size(), devices.size() - 1);
  }
  return devices[device];
}

Status CheckAttentionFits(const cuda::DeviceProperties& gpu, int device, int head_dim,
                          size_t shared_bytes, const std::string& note) {
  if (const size_t need = shared_bytes; need > gpu.shared_memory_per_block) {
    return Errorf(
        "train.device cuda: GPU {} ({}) lets a kernel use {:.1f} KiB of shared memory, the "
        "attention of head dimension {} needs {:.1f} KiB (A100, H100 and H20 have room{})",
        device, gpu.name, gpu.shared_memory_per_block / 1024.0, head_dim, need / 1024.0, note);
  }
  return Status::Ok();
}

}  // namespace difftrain
