#include "launch/sample_denoiser.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"

namespace difftrain::launch {

SampleDenoiser::SampleDenoiser(Model& model, const SampleSchema& m,
                               std::vector<float> guidance_embedding)
    : model_(model),
      sampled_floats_(m.elements()),
      conditioning_floats_(m.input_elements() - m.elements()),
      out_floats_(m.output_elements()),
      context_floats_(size_t(m.context_length) * m.context_dim),
      pooled_floats_(m.pooled_text_dim),
      id_floats_(m.pooled_text_dim > 0 ? m.time_ids.size() : 0),
      time_ids_(m.time_ids),
      guidance_embedding_(std::move(guidance_embedding)) {}

void SampleDenoiser::SetConditioning(const float* conditioning, int samples) {
  conditioning_ = conditioning;
  conditioned_samples_ = samples;
}

void SampleDenoiser::Forward(const float* x_t, const float* t, const int32_t* y,
                             const float* context, int B, float* out) {
  model_.Reserve(B, 1);
  const size_t dim = guidance_embedding_.size();
  for (size_t row = guidance_rows_.size() / std::max<size_t>(dim, 1); row < size_t(B); ++row)
    guidance_rows_.insert(guidance_rows_.end(), guidance_embedding_.begin(),
                          guidance_embedding_.end());
  if (conditioning_floats_ > 0) {
    DT_CHECK(conditioning_ != nullptr && conditioned_samples_ > 0,
             "an inpainting model sampled without its conditioning channels");
    model_input_.resize(B * (sampled_floats_ + conditioning_floats_));
    for (int r = 0; r < B; ++r) {
      float* row = model_input_.data() + r * (sampled_floats_ + conditioning_floats_);
      std::copy_n(x_t + r * sampled_floats_, sampled_floats_, row);
      std::copy_n(conditioning_ + (r % conditioned_samples_) * conditioning_floats_,
                  conditioning_floats_, row + sampled_floats_);
    }
    x_t = model_input_.data();
  }
  ModelInputs inputs{x_t, t, y, context, dim > 0 ? guidance_rows_.data() : nullptr};
  if (pooled_floats_ > 0) {
    // SDXL's: each row's text is its [L, D] embedding, then its pooled one, then its time ids.
    text_rows_.resize(B * context_floats_);
    pooled_rows_.resize(B * pooled_floats_);
    time_id_rows_.resize(B * id_floats_);
    for (int r = 0; r < B; ++r) {
      const float* row = context + r * (context_floats_ + pooled_floats_ + id_floats_);
      std::copy_n(row, context_floats_, text_rows_.data() + r * context_floats_);
      std::copy_n(row + context_floats_, pooled_floats_, pooled_rows_.data() + r * pooled_floats_);
      std::copy_n(row + context_floats_ + pooled_floats_, id_floats_,
                  time_id_rows_.data() + r * id_floats_);
    }
    inputs.context = text_rows_.data();
    inputs.pooled_text = pooled_rows_.data();
    inputs.time_ids = time_id_rows_.data();
  }
  const Status s = model_.Forward(0, inputs, nullptr, nullptr);
  DT_CHECK(s.ok(), "{}", s.message());
  std::memcpy(out, model_.output(0), B * out_floats_ * sizeof(float));
}

Denoiser SampleDenoiser::ForLabels() {
  return [this](const float* x_t, const float* t, const int32_t* y, int B, float* out) {
    Forward(x_t, t, y, nullptr, B, out);
  };
}

Denoiser SampleDenoiser::ForPrompts(const Prompts& prompts,
                                    const std::vector<float>& negative_time_ids, int batch) {
  // Each prompt's text: its embedding, and an SDXL UNet's pooled one and time ids after it.
  std::vector<float> embeddings;
  for (int64_t id : prompts.ids) {
    const float* e = prompts.table.embedding(id);
    embeddings.insert(embeddings.end(), e, e + context_floats_);
    if (pooled_floats_ > 0) {
      const float* pooled = prompts.table.pooled_embedding(id);
      embeddings.insert(embeddings.end(), pooled, pooled + pooled_floats_);
      embeddings.insert(embeddings.end(), time_ids_.begin(), time_ids_.end());
    }
  }
  std::vector<float> null_text = prompts.null_text;
  if (pooled_floats_ > 0) {
    // Zeros where the pipeline has no unconditional text (SDXL's force_zeros_for_empty_prompt).
    null_text.resize(context_floats_, 0.0f);
    std::vector<float> null_pooled = prompts.null_pooled;
    null_pooled.resize(pooled_floats_, 0.0f);
    null_text.insert(null_text.end(), null_pooled.begin(), null_pooled.end());
    null_text.insert(null_text.end(), negative_time_ids.begin(), negative_time_ids.end());
  }
  no_labels_.assign(2 * size_t(batch), 0);
  return PromptDenoiser([this](const float* x_t, const float* t, const float* context, int B,
                               float* out) { Forward(x_t, t, no_labels_.data(), context, B, out); },
                        std::move(embeddings), context_floats_ + pooled_floats_ + id_floats_,
                        std::move(null_text));
}

}  // namespace difftrain::launch
