// The job the host-memory tests run under a 512 MiB limit (a cgroup of their own, podman
// --memory, sbatch --mem): a small DiT on synthetic data whose activations are 1.16 GiB at
// micro-batch 128 and 0.15 GiB at 16 (`difftrain plan --config`), so one micro-batch size is
// beyond the limit and another fits.
#pragma once

#include <string>

namespace difftrain::testing {

// The job's YAML; micro 0 leaves batch.micro out (for `parallel: auto`).
inline std::string MemoryJobYaml(int micro, int global, int steps,
                                 const std::string& checkpoint_dir) {
  return "model: {name: custom, input_size: 32, in_channels: 4, patch_size: 2, hidden_size: "
         "128, depth: 2, num_heads: 4, num_classes: 10}\n"
         "data: {kind: synthetic}\n"
         "batch: {" +
         (micro > 0 ? "micro: " + std::to_string(micro) + ", " : std::string()) +
         "global: " + std::to_string(global) + "}\n" + "train: {steps: " + std::to_string(steps) +
         ", seed: 1, log_every: 1}\n" + "checkpoint: {dir: " + checkpoint_dir +
         ", every: 1, keep: 1}\n";
}

}  // namespace difftrain::testing
