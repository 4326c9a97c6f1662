// `difftrain sample`'s model as the samplers call it (model/diffusion/sampler.h's Denoiser): a
// batch of x_t, timesteps and labels in, the model's output out, with what the family's model
// takes beside them: a guidance-distilled model's guidance embedding, an inpainting UNet's
// conditioning channels, a text model's prompts (and SDXL's pooled embedding and time ids of
// each text).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "launch/sample_prompts.h"
#include "model/diffusion/sampler.h"
#include "model/family/family.h"
#include "model/family/model.h"

namespace difftrain::launch {

class SampleDenoiser {
 public:
  // `m`: the model's samples; `guidance_embedding`: [m.guidance_embedding_dim], the guidance
  // scale's embedding a guidance-distilled model takes with every sample (empty: none).
  SampleDenoiser(Model& model, const SampleSchema& m, std::vector<float> guidance_embedding);
  // The Denoisers it makes call it by reference.
  SampleDenoiser(const SampleDenoiser&) = delete;
  SampleDenoiser& operator=(const SampleDenoiser&) = delete;

  // Floats of one sample's conditioning channels (an inpainting UNet's mask and masked image
  // latents); 0: the model takes none.
  size_t conditioning_floats() const { return conditioning_floats_; }
  // The conditioning of the next calls: row r of a call's B takes the channels of sample
  // r % `samples` from `conditioning` (a guided call's two halves are the same samples).
  void SetConditioning(const float* conditioning, int samples);

  // The model of the labels it is given (the class-conditional and unconditional families').
  Denoiser ForLabels();
  // A text model's: label k < P is the text of `prompts.ids[k]`, P the unconditional text
  // (prompts.null_text, zeros where it has none); SDXL's UNet takes each text's pooled
  // embedding and time ids after it, the unconditional text's `negative_time_ids`. `batch`:
  // the most samples a call samples.
  Denoiser ForPrompts(const Prompts& prompts, const std::vector<float>& negative_time_ids,
                      int batch);

 private:
  void Forward(const float* x_t, const float* t, const int32_t* y, const float* context, int B,
               float* out);

  Model& model_;
  const size_t sampled_floats_, conditioning_floats_, out_floats_;
  const size_t context_floats_, pooled_floats_, id_floats_;  // of a text's row (SDXL: all three)
  const std::vector<float> time_ids_;                        // SDXL's, of every prompt's text
  std::vector<float> guidance_embedding_;
  std::vector<float> guidance_rows_;  // the guidance embedding, once per sample of a call
  const float* conditioning_ = nullptr;
  int conditioned_samples_ = 0;
  std::vector<int32_t> no_labels_;  // a text model's calls' labels
  // Scratch: an inpainting UNet's rows of x_t and conditioning; SDXL's inputs split per row.
  std::vector<float> model_input_, text_rows_, pooled_rows_, time_id_rows_;
};

}  // namespace difftrain::launch
