// A dataset's images, or each frame of its videos, through a VAE's encoder: the latents
// latent diffusion trains on (latent_channels × H/f × W/f, × scaling_factor), what
// `difftrain data pack --vae` writes into a latent folder (docs/data.md). Labels and texts are
// the source's.
#pragma once

#include <cstdint>
#include <memory>

#include "model/data/dataset.h"
#include "model/vae/vae.h"

namespace difftrain {

class VaeEncodedDataset : public Dataset {
 public:
  // Sample n's draws (VaePosterior::kSample) come from Rng(seed, kVae, n·frames + frame).
  // Errors: the source's channels are not the VAE's in_channels, or its height and width (each
  // bucket's) are not multiples of the VAE's downscale.
  static Result<std::unique_ptr<VaeEncodedDataset>> Create(std::unique_ptr<Dataset> source,
                                                           std::shared_ptr<const Vae> vae,
                                                           VaePosterior posterior, uint64_t seed);

  int64_t size() const override { return source_->size(); }
  int channels() const override { return vae_->config().latent_channels; }
  int height() const override { return source_->height() / vae_->config().downscale(); }
  int width() const override { return source_->width() / vae_->config().downscale(); }
  int num_classes() const override { return source_->num_classes(); }
  int frames() const override { return source_->frames(); }
  Status Get(int64_t index, float* latents, int32_t* label) const override;
  const TextTable* texts() const override { return source_->texts(); }
  int64_t TextId(int64_t index) const override { return source_->TextId(index); }
  bool has_geometry() const override { return source_->has_geometry(); }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override {
    return source_->GetGeometry(index, geometry);
  }
  // A bucketed source's buckets, each as its latents' size.
  std::vector<SampleSize> buckets() const override;
  int BucketOf(int64_t index) const override { return source_->BucketOf(index); }

 private:
  VaeEncodedDataset(std::unique_ptr<Dataset> source, std::shared_ptr<const Vae> vae,
                    VaePosterior posterior, uint64_t seed)
      : source_(std::move(source)), vae_(std::move(vae)), posterior_(posterior), seed_(seed) {}

  std::unique_ptr<Dataset> source_;
  std::shared_ptr<const Vae> vae_;
  VaePosterior posterior_;
  uint64_t seed_;
};

}  // namespace difftrain
