// A diffusers AutoencoderKL folder for tests, as save_pretrained lays it out: config.json and
// diffusion_pytorch_model.safetensors (F32) with weights drawn from N(0, 0.3²).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "model/vae/vae.h"

namespace difftrain::testing {

inline std::vector<float> RandomVaeWeights(const TensorTable& table, uint64_t seed) {
  std::vector<float> weights(table.total());
  Rng rng(seed, RngStream::kInit);
  for (float& w : weights)
    w = static_cast<float>(0.3 * rng.Normal());
  return weights;
}

// Writes the folder `dir` of the model `config` (AutoencoderKL's keys); tensor `leave_out` is
// not written. An error message, or "".
inline std::string WriteVaeFolder(const std::filesystem::path& dir, const nlohmann::json& config,
                                  uint64_t seed, const std::string& leave_out = "") {
  Result<VaeConfig> c = VaeConfig::FromJson(config);
  if (!c.ok()) return c.status().message();
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  const TensorTable table = Vae::Tensors(*c);
  const std::vector<float> weights = RandomVaeWeights(table, seed);
  io::SafetensorsWriter file;
  for (const TensorSpec& t : table.tensors()) {
    if (t.name != leave_out) file.AddF32(t.name, t.shape, weights.data() + t.offset);
  }
  const Status s = file.WriteAtomic((dir / "diffusion_pytorch_model.safetensors").string());
  return s.ok() ? "" : s.message();
}

}  // namespace difftrain::testing
