#include "model/cuda/loss.h"

namespace difftrain::cuda {
namespace {

constexpr int kThreads = 256;

// Sums `value` over the block in a fixed order (a shared-memory tree), so that the loss does
// not depend on scheduling; every thread gets the sum.
__device__ double BlockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();  // shared is reused by the next sum
  return sum;
}

// One block per sample b: its ε-MSE gradient and weighted squared error into partial[2b],
// and with the vb term its v gradient and vb_b (bits) into partial[2b + 1].
__global__ void SampleLossKernel(double* partial, float* dout, const float* out, const float* noise,
                                 const float* x0, const float* x_t, const SampleLoss* samples,
                                 int B, int out_channels, int C, int HW, bool vb_term,
                                 float grad_scale) {
  __shared__ double shared[kThreads];
  const int b = blockIdx.x;
  const SampleLoss s = samples[b];
  const size_t n = size_t(C) * HW, count = size_t(B) * n;
  const float* eps = out + size_t(b) * out_channels * HW;
  float* d_eps = dout + size_t(b) * out_channels * HW;
  const float* target = noise + size_t(b) * n;
  // As the CPU's EpsilonMseLoss rounds it.
  const float mse_coeff = static_cast<float>(2.0 * s.weight / double(count)) * grad_scale;
  double squares = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float diff = eps[i] - target[i];
    squares += double(diff) * diff;
    d_eps[i] = mse_coeff * diff;
  }
  const double weighted = s.weight * BlockSum(squares, shared);
  double vb = 0;
  if (vb_term) {
    const double vb_coeff = grad_scale / (double(B) * n * vb::kLn2);
    const double d_log_variance_dv = s.coefficients.DLogVarianceDv();
    const float* v = eps + n;
    const float* sample_x0 = x0 + size_t(b) * n;
    const float* sample_x_t = x_t + size_t(b) * n;
    double terms = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
      const vb::Term term =
          vb::Element(s.coefficients, s.decoder != 0, eps[i], v[i], sample_x0[i], sample_x_t[i]);
      terms += term.value;
      d_eps[n + i] = static_cast<float>(vb_coeff * term.d_log_variance * d_log_variance_dv);
    }
    vb = BlockSum(terms, shared) / (double(n) * vb::kLn2);
  } else {
    for (size_t i = n + threadIdx.x; i < size_t(out_channels) * HW; i += blockDim.x)
      d_eps[i] = 0.0f;
  }
  if (threadIdx.x == 0) {
    partial[2 * b] = weighted;
    partial[2 * b + 1] = vb;
  }
}

// The batch's loss from the per-sample partial sums, added in sample order.
__global__ void BatchLossKernel(float* loss, const double* partial, int B, double count) {
  double weighted = 0, vb = 0;
  for (int b = 0; b < B; ++b) {
    weighted += partial[2 * b];
    vb += partial[2 * b + 1];
  }
  loss[0] = static_cast<float>(weighted / count + vb / B);
}

}  // namespace

void DiffusionLoss(float* loss, float* dout, const float* out, const float* noise, const float* x0,
                   const float* x_t, const SampleLoss* samples, int B, int out_channels, int C,
                   int HW, bool vb_term, float grad_scale, double* workspace, cudaStream_t stream) {
  DT_CHECK(B > 0 && C > 0 && HW > 0 && out_channels >= C, "loss of B {} C {} of {} HW {}", B, C,
           out_channels, HW);
  DT_CHECK(!vb_term || (out_channels == 2 * C && x0 != nullptr && x_t != nullptr),
           "the vb term needs 2C = {} output channels (found {}), x0 and x_t", 2 * C, out_channels);
  SampleLossKernel<<<B, kThreads, 0, stream>>>(workspace, dout, out, noise, x0, x_t, samples, B,
                                               out_channels, C, HW, vb_term, grad_scale);
  DT_CUDA_CHECK_LAUNCH();
  BatchLossKernel<<<1, 1, 0, stream>>>(loss, workspace, B, double(B) * C * HW);
  DT_CUDA_CHECK_LAUNCH();
}

}  // namespace difftrain::cuda
