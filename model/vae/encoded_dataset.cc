#include "model/vae/encoded_dataset.h"

#include <vector>

#include <fmt/format.h>

namespace difftrain {

Result<std::unique_ptr<VaeEncodedDataset>> VaeEncodedDataset::Create(
    std::unique_ptr<Dataset> source, std::shared_ptr<const Vae> vae, VaePosterior posterior,
    uint64_t seed) {
  const VaeConfig& c = vae->config();
  if (source->channels() != c.in_channels) {
    return Errorf("the VAE '{}' encodes images of {} channels and the dataset's have {}",
                  vae->source(), c.in_channels, source->channels());
  }
  if (source->height() % c.downscale() != 0 || source->width() % c.downscale() != 0) {
    return Errorf("the VAE '{}' halves images {} times: their {}×{} pixels must be multiples of {}",
                  vae->source(), c.levels() - 1, source->height(), source->width(), c.downscale());
  }
  return std::unique_ptr<VaeEncodedDataset>(
      new VaeEncodedDataset(std::move(source), std::move(vae), posterior, seed));
}

Status VaeEncodedDataset::Get(int64_t index, float* latents, int32_t* label) const {
  std::vector<float> images(source_->sample_floats());
  DT_RETURN_IF_ERROR(source_->Get(index, images.data(), label));
  const int F = frames();
  return vae_->Encode(images.data(), F, source_->height(), source_->width(), posterior_, seed_,
                      static_cast<uint64_t>(index) * F, latents);
}

}  // namespace difftrain
