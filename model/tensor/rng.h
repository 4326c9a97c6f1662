// Counter-based random numbers.
//
// Every random draw of training is addressed by (seed, stream, counter): the noise and
// timestep of the n-th training sample come from Rng(seed, kNoise, n) wherever that sample
// is processed. So the "RNG state" a checkpoint must carry is just the seed and the number
// of samples consumed, resume is exact, and a data-parallel run draws exactly what one
// process would.
#pragma once

#include <cmath>
#include <cstdint>

namespace difftrain {

enum class RngStream : uint64_t {
  kInit = 1,    // parameter initialisation
  kData = 2,    // synthetic data, shuffling
  kNoise = 3,   // diffusion noise, timesteps and label dropout per training sample
  kSample = 4,  // sampling (generation)
  kText = 5,    // synthetic text embeddings (text-conditional families)
  kVae = 6,     // drawing from a VAE posterior (encoding images into latents)
  kLora = 7,    // LoRA adapters' initialisation (model/train/lora_adapters.h)
  kPrompt = 8,  // textual inversion: each training sample's prompt template
};

// xoshiro256** seeded through splitmix64 from (seed, stream, counter).
class Rng {
 public:
  Rng(uint64_t seed, RngStream stream, uint64_t counter = 0) {
    uint64_t x = seed ^ (static_cast<uint64_t>(stream) * 0x9E3779B97F4A7C15ull) ^
                 (counter * 0xD1B54A32D192ED03ull);
    for (uint64_t& w : s_)
      w = SplitMix(x);
  }

  uint64_t NextU64() {
    uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>(Uniform() * static_cast<double>(n)); }
  // Standard normal (Box-Muller; one value per call keeps the sequence simple to address).
  double Normal() {
    double u1 = 1.0 - Uniform();  // (0, 1]
    double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace difftrain
