// DiT's training loss on the GPU against the CPU's DiffusionLoss (model/diffusion/vb_loss.h):
// the ε-MSE alone, min-SNR weighted, with variance channels that get no gradient, and with the
// variational-bound term (timestep 0's decoder NLL included).
#include "model/cuda/loss.h"

#include <gtest/gtest.h>

#include "model/cuda/testing.h"
#include "model/diffusion/vb_loss.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::RandomVector;
using testing::RelativeL2;
using testing::UploadFloat;

struct Case {
  int B, C, HW;
  bool learn_sigma;  // 2C output channels
  bool vb_term;
  std::string weighting;
};

class LossTest : public ::testing::TestWithParam<Case> {};

TEST_P(LossTest, MatchesCpuDiffusionLoss) {
  DT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  const int Co = k.learn_sigma ? 2 * k.C : k.C;
  const size_t n = size_t(k.C) * k.HW;
  DiffusionConfig config;
  config.loss_weighting = k.weighting;
  const GaussianDiffusion diffusion(config);
  // x0 in [−1, 1] with the edge bins (beyond ±0.999) hit, t = 0 (the decoder) included.
  std::vector<float> x0 = RandomVector(k.B * n, 1, 0.6);
  for (size_t i = 0; i < x0.size(); ++i)
    x0[i] = i % 17 == 0 ? (i % 2 == 0 ? 1.0f : -1.0f) : std::max(-1.0f, std::min(1.0f, x0[i]));
  const std::vector<float> noise = RandomVector(k.B * n, 2);
  std::vector<int64_t> t(k.B);
  Rng rng(3, RngStream::kNoise);
  for (int b = 0; b < k.B; ++b)
    t[b] = b == 0 ? 0 : static_cast<int64_t>(rng.Below(diffusion.steps()));
  std::vector<float> x_t(k.B * n);
  diffusion.QSample(x_t.data(), x0.data(), noise.data(), t.data(), k.B, n);
  std::vector<float> out = RandomVector(size_t(k.B) * Co * k.HW, 4, 0.8);
  const float grad_scale = 0.25f;

  std::vector<float> want_dout(out.size());
  const std::vector<double> weights = diffusion.LossWeights(t.data(), k.B);
  const double want =
      k.vb_term ? DiffusionLoss(diffusion, out.data(), x0.data(), x_t.data(), noise.data(),
                                t.data(), k.B, k.C, k.HW, /*learn_sigma=*/true, grad_scale,
                                want_dout.data(), weights.empty() ? nullptr : weights.data())
                : EpsilonMseLoss(out.data(), noise.data(), k.B, k.C, Co, k.HW, grad_scale,
                                 want_dout.data(), weights.empty() ? nullptr : weights.data());

  const std::vector<SampleLoss> samples = SampleLosses(diffusion, t.data(), k.B);
  DeviceBuffer<SampleLoss> d_samples(samples.size());
  d_samples.Upload(samples);
  DeviceBuffer<float> d_out = UploadFloat(out), d_noise = UploadFloat(noise);
  DeviceBuffer<float> d_x0 = UploadFloat(x0), d_x_t = UploadFloat(x_t);
  DeviceBuffer<float> d_dout(out.size()), d_loss(1);
  DeviceBuffer<double> workspace(DiffusionLossWorkspace(k.B));
  testing::Poison(d_dout);
  testing::Poison(d_loss);
  DiffusionLoss(d_loss.data(), d_dout.data(), d_out.data(), d_noise.data(), d_x0.data(),
                d_x_t.data(), d_samples.data(), k.B, Co, k.C, k.HW, k.vb_term, grad_scale,
                workspace.data(), nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_loss), {static_cast<float>(want)}), 1e-6);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_dout), want_dout), 1e-6);  // zeros included
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LossTest,
    ::testing::Values(Case{3, 1, 49, false, false, "uniform"},         // one channel
                      Case{2, 4, 64, true, false, "uniform"},          // v channels get 0
                      Case{5, 1, 64, false, false, "min_snr"},         // weighted ε-MSE
                      Case{4, 2, 64, true, true, "uniform"},           // the vb term
                      Case{6, 1, 100, true, true, "min_snr"},          // both
                      Case{256, 4, 32 * 32, true, true, "uniform"}));  // DiT-XL/2's

}  // namespace
}  // namespace difftrain::cuda
