#include "model/cuda/fp8.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "model/cuda/device_primitives.cuh"
#include "model/cuda/fp8_kernels.h"

namespace difftrain::cuda {
namespace {

__global__ void __launch_bounds__(fp8::kThreads) QuantizeKernel(fp8::QuantizeArgs args) {
  fp8::Quantize<DevicePrimitives>(args);
}

__global__ void __launch_bounds__(fp8::kScaleThreads) UpdateScalesKernel(fp8::ScaleArgs args) {
  fp8::UpdateScales<DevicePrimitives>(args);
}

DeviceBuffer<float> Filled(size_t n, float value) {
  DeviceBuffer<float> buffer(n);
  buffer.Upload(std::vector<float>(n, value));
  return buffer;
}

}  // namespace

Status Fp8Supported() {
  int device = 0, major = 0, minor = 0;
  DT_CUDA_CHECK(cudaGetDevice(&device));
  DT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  DT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (Fp8Capable(major, minor)) return Status::Ok();
  return Errorf(
      "FP8 GEMMs need compute capability 8.9 or later (Ada, Hopper); device {} has {}.{}: train "
      "in bf16 instead",
      device, major, minor);
}

Fp8Scaling::Fp8Scaling(std::vector<fp8::Format> formats, Fp8Recipe recipe)
    : formats_(std::move(formats)), recipe_(recipe) {
  DT_CHECK(!formats_.empty(), "Fp8Scaling of no tensors");
  DT_CHECK(recipe_.history >= 1, "FP8 amax history of {} steps: at least 1", recipe_.history);
  DT_CHECK(recipe_.margin >= 0 && recipe_.margin < 64, "FP8 margin {}: 0 to 63", recipe_.margin);
  const size_t n = formats_.size();
  scale_ = Filled(n, 1.0f);
  scale_inv_ = Filled(n, 1.0f);
  amax_ = Filled(n, 0.0f);
  history_ = Filled(n * recipe_.history, 0.0f);
  std::vector<float> limit(n);
  for (size_t i = 0; i < n; ++i)
    limit[i] = std::ldexp(fp8::MaxFinite(formats_[i]), -recipe_.margin);
  limit_ = DeviceBuffer<float>(n);
  limit_.Upload(limit);
  count_ = DeviceBuffer<int>(n);
  count_.Upload(std::vector<int>(n, 0));
}

void Fp8Scaling::Update(cudaStream_t stream) {
  const fp8::ScaleArgs args{amax_.data(),      history_.data(), count_.data(),  scale_.data(),
                            scale_inv_.data(), limit_.data(),   recipe_.history};
  UpdateScalesKernel<<<tensors(), fp8::kScaleThreads, fp8::kScaleSharedBytes, stream>>>(args);
  DT_CUDA_CHECK_LAUNCH();
}

std::vector<float> Fp8Scaling::DownloadScales() const {
  return scale_.Download();
}

std::vector<float> Fp8Scaling::DownloadAmax() const {
  return amax_.Download();
}

void QuantizeFp8(uint8_t* out, uint8_t* out_t, const bf16* in, int rows, int cols,
                 Fp8Scaling& scaling, int i, cudaStream_t stream) {
  DT_CHECK(rows > 0 && cols > 0 && rows % 16 == 0 && cols % 16 == 0,
           "FP8 quantisation of [{}, {}]: both must be positive multiples of 16", rows, cols);
  DT_CHECK(i >= 0 && i < scaling.tensors(), "FP8 scaling tensor {} of {}", i, scaling.tensors());
  DT_CHECK(out != nullptr || out_t != nullptr, "FP8 quantisation with no output");
  const dim3 grid((cols + fp8::kTile - 1) / fp8::kTile, (rows + fp8::kTile - 1) / fp8::kTile);
  DT_CHECK(grid.y <= 65535, "FP8 quantisation of {} rows: at most {}", rows, 65535 * fp8::kTile);
  const fp8::QuantizeArgs args{reinterpret_cast<const uint16_t*>(in),
                               out,
                               out_t,
                               rows,
                               cols,
                               scaling.scale(i),
                               scaling.amax(i),
                               scaling.format(i)};
  QuantizeKernel<<<grid, fp8::kThreads, fp8::kQuantizeSharedBytes, stream>>>(args);
  DT_CUDA_CHECK_LAUNCH();
}

namespace {

std::vector<fp8::Format> LayerFormats(int layers) {
  DT_CHECK(layers > 0, "Fp8Linears of {} layers", layers);
  std::vector<fp8::Format> formats;
  for (int l = 0; l < layers; ++l) {
    formats.push_back(fp8::kE4M3);  // input
    formats.push_back(fp8::kE4M3);  // weight
    formats.push_back(fp8::kE5M2);  // output gradient
  }
  return formats;
}

constexpr size_t kWorkspaceAlignment = 256;

size_t Padded(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

int MaxOf(const std::vector<int>& v) {
  DT_CHECK(!v.empty(), "Fp8Linears of no layers");
  return *std::max_element(v.begin(), v.end());
}

}  // namespace

Fp8Linears::Fp8Linears(std::vector<int> in_features, Fp8Recipe recipe)
    : layers_(static_cast<int>(in_features.size())),
      in_features_(std::move(in_features)),
      max_in_(MaxOf(in_features_)),
      scaling_(LayerFormats(layers_), recipe) {}

size_t Fp8Linears::WorkspaceBytes(const std::vector<int>& in_features, int max_rows, int max_out) {
  const size_t rows = max_rows, in = MaxOf(in_features), out = max_out;
  size_t kept = 0;
  for (int features : in_features)
    kept += Padded(rows * features);
  return kept + Padded(rows * in) + Padded(in * out) + 2 * Padded(rows * out);
}

void Fp8Linears::Bind(unsigned char* workspace, int max_rows, int max_out) {
  DT_CHECK(workspace != nullptr, "Fp8Linears::Bind with no workspace");
  max_rows_ = max_rows, max_out_ = max_out;
  const size_t rows = max_rows, in = max_in_, out = max_out;
  unsigned char* p = workspace;
  kept_.clear();
  for (int features : in_features_) {
    kept_.push_back(p);
    p += Padded(rows * features);
  }
  in_ = p, p += Padded(rows * in);
  w_ = p, p += Padded(in * out);
  dout_ = p, p += Padded(rows * out);
  dout_t_ = p;
}

void Fp8Linears::CheckShape(int layer, int N, int I, int O) const {
  DT_CHECK(layer >= 0 && layer < layers_, "FP8 layer {} of {}", layer, layers_);
  DT_CHECK(in_ != nullptr, "Fp8Linears used before Bind");
  DT_CHECK(N <= max_rows_ && I == in_features_[layer] && O <= max_out_,
           "FP8 layer {} of N={} I={} O={}: made for {} inputs, at most {} rows and {} outputs",
           layer, N, I, O, in_features_[layer], max_rows_, max_out_);
}

void Fp8Linears::Forward(Gemm& gemm, int layer, bf16* out, const bf16* in, const bf16* w,
                         const bf16* bias, int N, int I, int O, Epilogue epilogue, bf16* aux) {
  CheckShape(layer, N, I, O);
  const cudaStream_t stream = gemm.stream();
  const int x = InputTensor(layer), wt = WeightTensor(layer);
  QuantizeFp8(in_, kept_[layer], in, N, I, scaling_, x, stream);  // kept for the backward
  QuantizeFp8(w_, nullptr, w, O, I, scaling_, wt, stream);
  if (gemm.ForwardFp8(out, {in_, scaling_.scale_inv(x)}, {w_, scaling_.scale_inv(wt)}, bias, N, I,
                      O, epilogue, aux)) {
    return;
  }
  ++fallbacks_;
  gemm.Forward(out, in, w, bias, N, I, O, epilogue, aux);
}

void Fp8Linears::Backward(Gemm& gemm, int layer, float* dw, bool accumulate, bf16* din,
                          const bf16* dout, const bf16* in, const bf16* w, int N, int I, int O,
                          const bf16* gelu_pre, float* dbias, float* scratch) {
  CheckShape(layer, N, I, O);
  const cudaStream_t stream = gemm.stream();
  const int x = InputTensor(layer), wt = WeightTensor(layer), g = GradTensor(layer);
  // dout in both layouts from one read, w transposed; the input as the forward kept it (with
  // the scale it had then, which no update has changed since).
  QuantizeFp8(dout_, dout_t_, dout, N, O, scaling_, g, stream);
  QuantizeFp8(nullptr, w_, w, O, I, scaling_, wt, stream);
  const Fp8Operand dout8{dout_, scaling_.scale_inv(g)}, dout8_t{dout_t_, scaling_.scale_inv(g)};
  if (!gemm.BackwardWeightFp8(dw, dout8_t, {kept_[layer], scaling_.scale_inv(x)}, N, I, O,
                              accumulate)) {
    ++fallbacks_;
    gemm.BackwardWeight(dw, dout, in, N, I, O, accumulate);
  }
  if (gemm.BackwardInputFp8(din, dout8, {w_, scaling_.scale_inv(wt)}, N, I, O, gelu_pre, dbias,
                            scratch)) {
    return;
  }
  ++fallbacks_;
  if (dbias != nullptr) {
    gemm.BackwardInputGeluAndBias(din, dbias, dout, w, N, I, O, gelu_pre, scratch);
  } else {
    gemm.BackwardInput(din, dout, w, N, I, O, gelu_pre);
  }
}

}  // namespace difftrain::cuda
