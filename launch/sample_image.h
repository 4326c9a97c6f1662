// The VAE of `difftrain sample` (docs/sampling.md), and for image to image (--image) the
// images sampling starts from, as x0 of every sample, the way diffusers'
// StableDiffusionImg2ImgPipeline prepares its `image`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "launch/sample_options.h"
#include "launch/sample_source.h"
#include "model/family/family.h"
#include "model/vae/vae.h"

namespace difftrain::launch {

// The VAE that decodes the samples and encodes --image's pictures: --vae's; without it, where
// there are pictures to write (a PNG or GIF) or to encode, an original Stable Diffusion
// checkpoint's own (first_stage_model), a --pretrained pipeline's vae/, else
// the one the checkpoint's training data (a latent folder) was encoded with, as its index.json
// names it; none with `--vae none`. Checked against the model's samples (its latents) and, for
// a PNG or GIF, its images' channels; nullopt when there is none.
Result<std::optional<Vae>> LoadSampleVae(const SampleOptions& o, const SampleSource& ckpt,
                                         const SampleSchema& m);

// The model `spec` (samples `m`) resized for sampling, as diffusers' pipelines size their
// samples: to --height × --width pixels (each defaulting to the model's), else, from an --image
// picture, to the first picture's size (diffusers' img2img and inpainting pipelines sample at
// their image's size) where the family can be resized, rounded down to the nearest size it
// samples (a multiple of the VAE's downscale times 2^(levels − 1) for a UNet: of 64 pixels for
// Stable Diffusion, where diffusers rounds to 8); nullopt: the model's own size. The latents
// are the VAE's downscale smaller than the pixels (none for a pixel model). Errors: a size a
// family or VAE cannot take, --height/--width for latents without a VAE.
Result<std::optional<ModelSpec>> ResizedForSampling(const SampleOptions& o, const ModelSpec& spec,
                                                    const SampleSchema& m, const Vae* vae);

// SDXL's time ids (SampleSchema::time_ids: original size, crop top-left, target size, in
// pixels), as StableDiffusionXLPipeline makes them: --original-size, --crop-top-left and
// --target-size, each by default the samples' size (the latents times the downscale of `vae`,
// else of a pipeline's vae/config.json, else 8: Stable Diffusion's) and no crop; the refiner's
// (requires_aesthetics_score) the aesthetic score in place of the target size, as
// StableDiffusionXLImg2ImgPipeline makes them. `negative`: the unconditional text's, the same
// but for the refiner's --negative-aesthetic-score. Errors: those flags for a model without
// micro-conditioning (the aesthetic scores for one other than the refiner, --target-size for
// it), a flag of other than two non-negative numbers.
Status ChooseTimeIds(const SampleOptions& o, const SampleSource& ckpt, const Vae* vae,
                     SampleSchema& m, std::vector<float>& negative);

// Whether `path` names a safetensors file (x0's as they are) rather than a picture.
bool IsSafetensorsPath(const std::string& path);

// x0 of each of `rows` × `per_class` samples of the image model `m` (sample k in row
// k / per_class), [total, C, H, W], from the files `paths` in order:
//   - a picture (PNG or JPEG) is converted to the VAE's input channels (without one, the
//     model's) and stretched to the samples' size (the model's, times the VAE's downscale) as
//     VaeImageProcessor.preprocess(image, height, width) does (model/data/image_folder.h),
//     then, for a latent model, encoded by `vae`: a draw of its posterior, picture i (counted
//     over all the files) from Rng(seed, kVae, i), times its scaling factor, as the pipeline's
//     retrieve_latents;
//   - a safetensors file holds x0's as the model samples them (scaled latents, as the
//     pipeline takes a 4-channel `image` tensor; --raw's `images`): its tensor `images`, else
//     its only one, [K, C, H, W] or [C, H, W], of any float dtype.
// K images in all serve one for every sample (K = 1), one per row (K = rows) or one per sample
// (K = rows × per_class). Errors name the file and what does not fit.
Result<std::vector<float>> ReadStartImages(const std::vector<std::string>& paths,
                                           const SampleSchema& m, const Vae* vae, int rows,
                                           int per_class, uint64_t seed);

// Inpainting (--mask), as diffusers' StableDiffusionInpaintPipeline prepares its mask_image and
// masked image for `rows` × `per_class` samples of `m`:
//   - each mask, a picture, becomes a binary mask of the samples' pixel size
//     (model/data/image_folder.h's PrepareMask: 1 where painted), one for all samples, one per
//     row or one per sample; `mask` is it at the samples' size, [total, h, w], picked by
//     torch's nearest interpolation (pixel ⌊i·f⌋ of row and column i, f the VAE's downscale);
//   - for a model with conditioning channels (an inpainting UNet: 1 + channels of them) the
//     masked image, the picture (--image) with 0 where the mask paints ((x)·(mask < 0.5) in
//     [−1, 1]), encoded as ReadStartImages encodes pictures (sample k's draw from counter
//     2³² + k) into `masked` [total, channels, h, w]; from --image safetensors files, their
//     tensor `masked_image_latents` (diffusers' argument of that name), shaped as `images`.
struct InpaintInputs {
  std::vector<float> mask;
  std::vector<float> masked;
};
Result<InpaintInputs> ReadInpaintInputs(const std::vector<std::string>& masks,
                                        const std::vector<std::string>& images,
                                        const SampleSchema& m, const Vae* vae, int rows,
                                        int per_class, uint64_t seed);

}  // namespace difftrain::launch
