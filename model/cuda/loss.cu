#include "model/cuda/loss.h"

namespace difftrain::cuda {
namespace {

constexpr int kThreads = 1024;

// One block: every thread strides over the values, writing dout and summing its squared
// errors in double; then a shared-memory tree sums the block in a fixed order. One block
// keeps the loss deterministic, and at DiT's sizes (a few million values at most) the pass
// costs microseconds of bandwidth.
__global__ void EpsilonMseKernel(float* loss, float* dout, const float* out, const float* target,
                                 int B, int out_channels, int C, int HW) {
  __shared__ double partial[kThreads];
  const size_t per_sample = size_t(out_channels) * HW, eps_per_sample = size_t(C) * HW;
  const size_t total = size_t(B) * per_sample;
  const double n = double(B) * eps_per_sample;
  const float grad_scale = static_cast<float>(2.0 / n);
  double sum = 0;
  for (size_t i = threadIdx.x; i < total; i += blockDim.x) {
    const size_t b = i / per_sample, within = i % per_sample;
    if (within < eps_per_sample) {  // the first C channels: ε's
      const float e = out[i] - target[b * eps_per_sample + within];
      dout[i] = grad_scale * e;
      sum += double(e) * e;
    } else {
      dout[i] = 0.0f;
    }
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(partial[0] / n);
}

}  // namespace

void EpsilonMseLoss(float* loss, float* dout, const float* out, const float* target, int B,
                    int out_channels, int C, int HW, cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && HW > 0 && out_channels >= C, "loss of B {} C {} of {} HW {}", B, C,
           out_channels, HW);
  EpsilonMseKernel<<<1, kThreads, 0, stream>>>(loss, dout, out, target, B, out_channels, C, HW);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
