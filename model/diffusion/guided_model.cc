#include "model/diffusion/guided_model.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace difftrain {

std::vector<Rng> StepNoiseStreams(uint64_t seed, int64_t first_index, int N) {
  std::vector<Rng> rngs;
  for (int b = 0; b < N; ++b)
    rngs.emplace_back(seed, RngStream::kSample, StepNoiseCounter(first_index + b));
  return rngs;
}

ImageKeeper::ImageKeeper(const KeptImage* keep, const DenoiserShape& shape, int N)
    : keep_(keep),
      N_(N),
      plane_(size_t(shape.height) * shape.width),
      n_(size_t(shape.frames) * shape.channels * plane_) {
  DT_CHECK(!keep || (keep->x0 && keep->mask && keep->noise), "a kept image without its parts");
}

GuidedModel::GuidedModel(const Denoiser& model, const DenoiserShape& shape,
                         const SamplerOptions& options, const int32_t* y, int N)
    : model_(model),
      options_(options),
      N_(N),
      frame_(size_t(shape.channels) * shape.height * shape.width),
      n_(shape.frames * frame_),
      out_frame_((shape.learn_sigma ? 2 : 1) * frame_),
      out_n_(shape.frames * out_frame_),
      any_guidance_(options.cfg_scale != 1),
      doubled_(any_guidance_ ? 2 * N * n_ : 0),
      t_(any_guidance_ ? 2 * N : N),
      out_(t_.size() * out_n_),
      labels_(y, y + N),
      rescale_(N, 1.0) {
  if (any_guidance_) labels_.resize(2 * N, shape.null_class);
}

void GuidedModel::Run(const float* x, float timestep) {
  guided_ = any_guidance_ && timestep >= options_.cfg_from && timestep <= options_.cfg_to;
  std::fill(t_.begin(), t_.end(), timestep);
  if (guided_) {
    std::copy(x, x + N_ * n_, doubled_.begin());
    std::copy(x, x + N_ * n_, doubled_.begin() + N_ * n_);
  }
  model_(guided_ ? doubled_.data() : x, t_.data(), labels_.data(), guided_ ? 2 * N_ : N_,
         out_.data());
  std::fill(rescale_.begin(), rescale_.end(), 1.0);
  const double phi = options_.guidance_rescale;
  if (!guided_ || phi == 0 || n_ < 2) return;
  // Unbiased standard deviations of the conditional and the guided output, per sample.
  const auto deviation = [&](auto value) {
    double mean = 0, square = 0;
    for (size_t j = 0; j < n_; ++j)
      mean += value(j);
    mean /= n_;
    for (size_t j = 0; j < n_; ++j)
      square += (value(j) - mean) * (value(j) - mean);
    return std::sqrt(square / (n_ - 1));
  };
  for (int b = 0; b < N_; ++b) {
    const double cond = deviation([&](size_t j) { return out_[b * out_n_ + OutputIndex(j)]; });
    const double guided = deviation([&](size_t j) { return Output(b, j); });
    if (guided > 0) rescale_[b] = phi * cond / guided + (1 - phi);
  }
}

}  // namespace difftrain
