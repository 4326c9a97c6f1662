#include "model/vae/encoded_dataset.h"

#include <vector>

#include <fmt/format.h>

namespace difftrain {

Result<std::unique_ptr<VaeEncodedDataset>> VaeEncodedDataset::Create(
    std::unique_ptr<Dataset> source, std::shared_ptr<const Vae> vae, VaePosterior posterior,
    uint64_t seed, bool mirrored) {
  const VaeConfig& c = vae->config();
  if (source->channels() != c.in_channels) {
    return Errorf("the VAE '{}' encodes images of {} channels and the dataset's have {}",
                  vae->source(), c.in_channels, source->channels());
  }
  for (const SampleSize& s : source->buckets()) {  // a bucketed source: each bucket's size
    if (s.height % c.downscale() != 0 || s.width % c.downscale() != 0) {
      return Errorf(
          "the VAE '{}' halves images {} times: their {}×{} pixels must be multiples of {}",
          vae->source(), c.levels() - 1, s.height, s.width, c.downscale());
    }
  }
  return std::unique_ptr<VaeEncodedDataset>(
      new VaeEncodedDataset(std::move(source), std::move(vae), posterior, seed, mirrored));
}

std::vector<SampleSize> VaeEncodedDataset::buckets() const {
  std::vector<SampleSize> sizes = source_->buckets();
  for (SampleSize& s : sizes)
    s = {s.height / vae_->config().downscale(), s.width / vae_->config().downscale()};
  return sizes;
}

Status VaeEncodedDataset::Get(int64_t index, float* latents, int32_t* label) const {
  return Encode(index, /*mirror=*/false, static_cast<uint64_t>(index) * frames(), latents, label);
}

Status VaeEncodedDataset::GetMirrored(int64_t index, float* latents, int32_t* label) const {
  if (!mirrored_) return Dataset::GetMirrored(index, latents, label);
  return Encode(index, /*mirror=*/true, kMirrorDrawBase + static_cast<uint64_t>(index) * frames(),
                latents, label);
}

Status VaeEncodedDataset::Encode(int64_t index, bool mirror, uint64_t first_draw, float* latents,
                                 int32_t* label) const {
  std::vector<float> images(source_->SampleFloats(index));
  DT_RETURN_IF_ERROR(source_->Get(index, images.data(), label));
  const int F = frames();
  const SampleSize size = source_->buckets()[source_->BucketOf(index)];
  if (mirror) MirrorRows(images.data(), int64_t{F} * source_->channels() * size.height, size.width);
  return vae_->Encode(images.data(), F, size.height, size.width, posterior_, seed_, first_draw,
                      latents);
}

}  // namespace difftrain
