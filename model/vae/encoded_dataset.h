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
  // With `mirrored`, each sample also has its mirror image (GetMirrored): the latents of its
  // pictures flipped left-right, drawn from Rng(seed, kVae, kMirrorDrawBase + n·frames + frame).
  // Errors: the source's channels are not the VAE's in_channels, or its height and width (each
  // bucket's) are not multiples of the VAE's downscale.
  static Result<std::unique_ptr<VaeEncodedDataset>> Create(std::unique_ptr<Dataset> source,
                                                           std::shared_ptr<const Vae> vae,
                                                           VaePosterior posterior, uint64_t seed,
                                                           bool mirrored = false);
  // The posterior draws of mirror images start here, far from any sample's.
  static constexpr uint64_t kMirrorDrawBase = uint64_t{1} << 62;

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
  bool has_mirrored() const override { return mirrored_; }
  Status GetMirrored(int64_t index, float* latents, int32_t* label) const override;

 private:
  VaeEncodedDataset(std::unique_ptr<Dataset> source, std::shared_ptr<const Vae> vae,
                    VaePosterior posterior, uint64_t seed, bool mirrored)
      : source_(std::move(source)),
        vae_(std::move(vae)),
        posterior_(posterior),
        seed_(seed),
        mirrored_(mirrored) {}
  // Sample `index`'s pictures (flipped left-right with `mirror`) through the encoder, its draws
  // from `first_draw` on.
  Status Encode(int64_t index, bool mirror, uint64_t first_draw, float* latents,
                int32_t* label) const;

  std::unique_ptr<Dataset> source_;
  std::shared_ptr<const Vae> vae_;
  VaePosterior posterior_;
  uint64_t seed_;
  bool mirrored_;
};

}  // namespace difftrain
