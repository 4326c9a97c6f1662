#include "model/cuda/train_state.h"

#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "model/cuda/activation.h"
#include "model/cuda/optimizer.h"

namespace difftrain::cuda {

namespace {

bool EmaStreamByDefault() {
  const char* on = std::getenv("DIFFTRAIN_EMA_STREAM");
  return on == nullptr || std::string(on) != "0";
}

// A non-blocking stream at the device's greatest priority, or its least.
cudaStream_t CreateStream(bool greatest_priority) {
  int least = 0, greatest = 0;
  DT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  DT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                             greatest_priority ? greatest : least));
  return stream;
}

}  // namespace

cudaStream_t CreateStepStream() {
  return CreateStream(/*greatest_priority=*/true);
}

TrainState::TrainState(size_t num_params, cudaStream_t stream)
    : n_(num_params), stream_(stream), norm_squared_(1), ema_stream_on_(EmaStreamByDefault()) {}

Status TrainState::Allocate() {
  DeviceBuffer<float>* const fp32[] = {&master_, &grads_, &exp_avg_, &exp_avg_sq_, &ema_};
  Status s = [&]() -> Status {
    for (DeviceBuffer<float>* arena : fp32) {
      DT_ASSIGN_OR_RETURN(*arena, DeviceBuffer<float>::TryAllocate(n_));
    }
    DT_ASSIGN_OR_RETURN(params_bf16_, DeviceBuffer<bf16>::TryAllocate(n_));
    DT_ASSIGN_OR_RETURN(norm_workspace_,
                        DeviceBuffer<float>::TryAllocate(SumOfSquaresWorkspace(n_)));
    return Status::Ok();
  }();
  if (!s.ok()) {
    params_bf16_ = DeviceBuffer<bf16>();
    const double gib = n_ * (5 * sizeof(float) + sizeof(bf16)) / double(1 << 30);
    return s.WithContext(
        fmt::format("the parameters, gradients, AdamW moments and EMA ({:.2f} GiB in all)", gib));
  }
  for (DeviceBuffer<float>* arena : fp32)
    DT_CUDA_CHECK(cudaMemsetAsync(arena->data(), 0, arena->bytes(), stream_));
  DT_CUDA_CHECK(cudaMemsetAsync(params_bf16_.data(), 0, params_bf16_.bytes(), stream_));
  ema_stream_.reset(CreateStream(/*greatest_priority=*/false));
  for (auto* event : {&updated_, &ema_done_}) {
    cudaEvent_t e = nullptr;
    DT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event->reset(e);
  }
  return Status::Ok();
}

void TrainState::WaitForEma() const {
  // An event never recorded (no EMA yet) is no wait.
  if (ema_done_ != nullptr) DT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ema_done_.get()));
}

size_t TrainState::BytesFor(size_t n) {
  return n * (5 * sizeof(float) + sizeof(bf16)) + SumOfSquaresWorkspace(n) * sizeof(float) +
         sizeof(double);
}

size_t TrainState::bytes() const {
  return master_.bytes() + grads_.bytes() + exp_avg_.bytes() + exp_avg_sq_.bytes() + ema_.bytes() +
         norm_workspace_.bytes() + params_bf16_.bytes() + norm_squared_.bytes();
}

void TrainState::Upload(const float* params, const float* ema, const float* exp_avg,
                        const float* exp_avg_sq) {
  DT_CHECK(allocated(), "TrainState::Upload before Allocate");
  WaitForEma();
  const std::pair<DeviceBuffer<float>*, const float*> arenas[] = {
      {&master_, params}, {&ema_, ema}, {&exp_avg_, exp_avg}, {&exp_avg_sq_, exp_avg_sq}};
  for (const auto& [device, host] : arenas) {
    if (host != nullptr) {
      DT_CUDA_CHECK(
          cudaMemcpyAsync(device->data(), host, device->bytes(), cudaMemcpyHostToDevice, stream_));
    } else {
      DT_CUDA_CHECK(cudaMemsetAsync(device->data(), 0, device->bytes(), stream_));
    }
  }
  CastToBf16(params_bf16_.data(), master_.data(), n_, stream_);
  ZeroGradients();
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void TrainState::Download(float* params, float* ema, float* exp_avg, float* exp_avg_sq) const {
  DT_CHECK(allocated(), "TrainState::Download before Allocate");
  WaitForEma();
  const std::pair<const DeviceBuffer<float>*, float*> arenas[] = {
      {&master_, params}, {&ema_, ema}, {&exp_avg_, exp_avg}, {&exp_avg_sq_, exp_avg_sq}};
  for (const auto& [device, host] : arenas) {
    if (host != nullptr) {
      DT_CUDA_CHECK(
          cudaMemcpyAsync(host, device->data(), device->bytes(), cudaMemcpyDeviceToHost, stream_));
    }
  }
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> TrainState::DownloadParameters() const {
  WaitForEma();  // no writer of the master weights runs beside it, but AdamW's order holds
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return master_.Download();
}

std::vector<float> TrainState::DownloadGradients() const {
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return grads_.Download();
}

void TrainState::ZeroGradients() {
  DT_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), stream_));
}

void TrainState::OptimizerStep(double lr, int64_t step, const OptimizerConfig& config) {
  DT_CHECK(step >= 1, "AdamW step {} must be 1-based", step);
  DT_CHECK(allocated(), "OptimizerStep before Allocate");
  SumOfSquares(norm_squared_.data(), grads_.data(), n_, norm_workspace_.data(),
               /*accumulate=*/false, stream_);
  // The last step's EMA read the master weights AdamW is about to write.
  WaitForEma();
  const AdamWScalars scalars = AdamWScalarsAt(lr, step, config);
  const double ema_decay = EmaDecayAt(config, step);
  if (!ema_stream_on_) {
    AdamWStep(master_.data(), params_bf16_.data(), exp_avg_.data(), exp_avg_sq_.data(),
              grads_.data(), norm_squared_.data(), n_, scalars, config.grad_clip,
              {.values = ema_.data(), .decay = ema_decay}, stream_);
    return;
  }
  AdamWStep(master_.data(), params_bf16_.data(), exp_avg_.data(), exp_avg_sq_.data(), grads_.data(),
            norm_squared_.data(), n_, scalars, config.grad_clip, {}, stream_);
  DT_CUDA_CHECK(cudaEventRecord(updated_.get(), stream_));
  DT_CUDA_CHECK(cudaStreamWaitEvent(ema_stream_.get(), updated_.get()));
  EmaUpdate(ema_.data(), master_.data(), n_, ema_decay, ema_stream_.get());
  DT_CUDA_CHECK(cudaEventRecord(ema_done_.get(), ema_stream_.get()));
}

double TrainState::last_grad_norm_squared() const {
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return norm_squared_.Download()[0];
}

StepGraph::~StepGraph() {
  // Teardown: statuses are ignored, as DeviceBuffer ignores cudaFree's.
  for (const Captured& c : graphs_) {
    cudaGraphExecDestroy(c.exec);
    cudaGraphDestroy(c.graph);
  }
}

void StepGraph::Reset() {
  eager_calls_ = 0;
  DropGraphs();
}

void StepGraph::DropGraphs() {
  for (const Captured& c : graphs_) {
    DT_CUDA_CHECK(cudaGraphExecDestroy(c.exec));
    DT_CUDA_CHECK(cudaGraphDestroy(c.graph));
  }
  graphs_.clear();
}

void StepGraph::Run(const std::function<void()>& step, float scale, bool overwrite) {
  if (!use_graph_ || eager_calls_ < 1) {
    step();
    ++eager_calls_;
    return;
  }
  const Captured* found = nullptr;
  for (const Captured& c : graphs_) {
    if (c.scale == scale && c.overwrite == overwrite) found = &c;
  }
  if (found == nullptr) {
    if (graphs_.size() == kKeys) DropGraphs();
    Captured c{scale, overwrite, nullptr, nullptr};
    DT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    step();
    DT_CUDA_CHECK(cudaStreamEndCapture(stream_, &c.graph));
    DT_CUDA_CHECK(cudaGraphInstantiate(&c.exec, c.graph, 0));
    graphs_.push_back(c);
    found = &graphs_.back();
  }
  DT_CUDA_CHECK(cudaGraphLaunch(found->exec, stream_));
}

}  // namespace difftrain::cuda
