// What a whole model trained on one GPU keeps besides its activations, and how its step runs:
//   - TrainState: the fp32 master weights, their bf16 copy (what the GEMMs read), the gradients,
//     AdamW's two moments and the EMA, one device arena each in the model's parameter table
//     layout (so a download is the CPU model's arena), and the optimizer step on them (global
//     norm, clipping, AdamW, EMA: model/cuda/optimizer.h);
//   - StepGraph: a forward-and-backward that runs eagerly once (cuBLASLt plans its GEMMs,
//     kernels set their attributes: neither may happen under capture), is captured as a CUDA
//     graph on its second call and replayed after that.
// Both GPU models, cuda::DiT (model/dit/cuda/dit.h) and cuda::UNet (model/unet/cuda/unet.h),
// are built on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "model/cuda/common.h"
#include "model/cuda/device_buffer.h"
#include "model/optim/adamw.h"

namespace difftrain::cuda {

// A stream for a model's step (non-blocking, at the device's greatest priority): its kernels go
// to the SMs before those of TrainState's EMA stream (the least priority) as blocks retire, so
// that the EMA fills what the step leaves idle instead of holding SMs a GEMM waits for.
cudaStream_t CreateStepStream();

class TrainState {
 public:
  TrainState(size_t num_params, cudaStream_t stream);

  size_t num_params() const { return n_; }
  bool allocated() const { return params_bf16_.data() != nullptr; }
  // Allocates every arena (zeroed); a GPU without room is an error naming the bytes in all.
  Status Allocate();
  size_t bytes() const;
  // What bytes() comes to for num_params parameters, without a GPU.
  static size_t BytesFor(size_t num_params);

  // Sets the master weights (and their bf16 copy), the EMA and AdamW's moments from host arenas
  // (null moments: zeros) and zeroes the gradients; copies whichever destination is not null
  // back. Both synchronous.
  void Upload(const float* params, const float* ema, const float* exp_avg, const float* exp_avg_sq);
  void Download(float* params, float* ema, float* exp_avg, float* exp_avg_sq) const;
  std::vector<float> DownloadParameters() const;
  std::vector<float> DownloadGradients() const;

  const float* master() const { return master_.data(); }
  const bf16* weights() const { return params_bf16_.data(); }
  float* gradients() { return grads_.data(); }

  void ZeroGradients();
  // Global gradient norm, clipping (config.grad_clip), AdamW at lr as step `step` (1-based),
  // refreshing the bf16 copy, and the EMA (config.ema_decay): the CPU's update, on the device.
  void OptimizerStep(double lr, int64_t step, const OptimizerConfig& config);
  // The squared global gradient norm of the last OptimizerStep (synchronises).
  double last_grad_norm_squared() const;

  // Where the EMA is updated. On (the default; DIFFTRAIN_EMA_STREAM=0 in the environment turns
  // it off for every program): on a stream of its own, after AdamW, while the stream goes on
  // with the next step's forward and backward, which read the bf16 copy, not the master weights
  // or the EMA; the next AdamW (or anything that writes or reads them: Upload, Download) waits
  // for it. AdamW then moves 30 bytes a parameter on the step's path instead of 38, and the
  // EMA's 12 run beside the GEMMs. Off: in AdamW's pass, as before. The same weights and moments
  // either way, bit for bit; the EMA as close as the two kernels' FMA contraction allows (~1e-7).
  void set_ema_stream(bool on) { ema_stream_on_ = on; }
  bool ema_stream() const { return ema_stream_on_; }

 private:
  // The step's stream waits for the EMA pending on its own stream, if any.
  void WaitForEma() const;

  struct StreamDeleter {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  struct EventDeleter {
    void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
  };

  size_t n_;
  cudaStream_t stream_;
  DeviceBuffer<float> master_, grads_, exp_avg_, exp_avg_sq_, ema_, norm_workspace_;
  DeviceBuffer<bf16> params_bf16_;
  DeviceBuffer<double> norm_squared_;
  bool ema_stream_on_;
  // Made by Allocate: the EMA's stream, and the events that order it after AdamW and the next
  // writer of the master weights after it.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> ema_stream_;
  std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter> updated_, ema_done_;
};

class StepGraph {
 public:
  StepGraph(cudaStream_t stream, bool use_graph) : stream_(stream), use_graph_(use_graph) {}
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Forgets the captured graphs and starts again with an eager call (the step's buffers moved).
  void Reset();
  // Runs `step` on the stream: eagerly on the first call after Reset (and always without
  // use_graph), then captured once for each `key` (what the graph holds that changes between
  // calls: the step's loss scale, and whether it overwrites the gradients, the first
  // micro-batch of an accumulation, or adds to them) and replayed after that. Graphs of up to
  // kKeys keys are kept (an accumulation alternates two); a new key beyond those drops them
  // all. A new key needs no new eager call: the buffers and the GEMMs' plans are the same.
  static constexpr size_t kKeys = 4;
  void Run(const std::function<void()>& step, float scale, bool overwrite = false);

 private:
  struct Captured {
    float scale;
    bool overwrite;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
  };
  void DropGraphs();

  cudaStream_t stream_;
  bool use_graph_;
  std::vector<Captured> graphs_;
  int eager_calls_ = 0;
};

}  // namespace difftrain::cuda
