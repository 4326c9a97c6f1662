#include "model/cuda/loss.h"

#include "model/diffusion/vb_loss.h"

namespace difftrain::cuda {

std::vector<SampleLoss> SampleLosses(const GaussianDiffusion& diffusion, const int64_t* t, int B,
                                     const std::vector<double>& sample_weights, int frames) {
  DT_CHECK(sample_weights.empty() || sample_weights.size() * frames == size_t(B),
           "{} sample weights for {} losses of {} frames each", sample_weights.size(), B, frames);
  std::vector<SampleLoss> samples(B);
  for (int b = 0; b < B; ++b) {
    DT_CHECK(t[b] >= 0 && t[b] < diffusion.steps(), "timestep {} out of range", t[b]);
    samples[b].coefficients =
        CoefficientsAt(diffusion.betas(), diffusion.alphas_cumprod(), static_cast<int>(t[b]));
    samples[b].weight = diffusion.LossWeight(t[b]);
    if (!sample_weights.empty()) samples[b].weight *= sample_weights[b / frames];
    samples[b].decoder = t[b] == 0 ? 1 : 0;
  }
  return samples;
}

float ReadLoss(const float* loss, cudaStream_t stream) {
  float value = 0;
  DT_CUDA_CHECK(cudaMemcpyAsync(&value, loss, sizeof(float), cudaMemcpyDeviceToHost, stream));
  DT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return value;
}

void UploadUnweightedSamples(SampleLoss* samples, size_t n, cudaStream_t stream) {
  const std::vector<SampleLoss> unweighted(n);
  DT_CUDA_CHECK(cudaMemcpyAsync(samples, unweighted.data(), n * sizeof(SampleLoss),
                                cudaMemcpyHostToDevice, stream));
  DT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace difftrain::cuda
