// The 1F1B pipeline schedule (PipeDream-Flush, as Megatron-Core's
// forward_backward_pipelining_without_interleaving). It knows nothing about the model: it
// calls a stage's Forward and Backward for each micro-batch and moves the tensors between
// neighbouring stages over the pipeline group.
//
// Stage s of pp runs warm-up = min(pp − s − 1, m) forwards, then alternates one forward
// and one backward until every forward is done, then the remaining (cool-down) backwards.
// At most pp − s micro-batches are in flight on stage s, so a stage needs
// InFlightMicroBatches(pp, s, m) activation slots; micro-batch i uses slot i % that.
// Backwards run in the order of their forwards. With pp = 1 (or no communicator) the
// schedule is forward, backward, forward, backward, …: one process runs the same code.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "model/parallel/comm.h"

namespace difftrain::parallel {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Floats sent to the next stage per micro-batch (and its gradient, sent back).
  virtual size_t boundary_elements() const = 0;
  // input: from the previous stage, null on the first; output: for the next, null on the last.
  virtual Status Forward(int micro, const float* input, float* output) = 0;
  // output_grad: from the next stage, null on the last; input_grad: for the previous stage,
  // null on the first.
  virtual Status Backward(int micro, const float* output_grad, float* input_grad) = 0;
};

int InFlightMicroBatches(int pp, int stage, int micro_batches);

// Runs `micro_batches` forwards and backwards of `stage` (its position in `pp`).
Status RunOneForwardOneBackward(Comm* pp, int micro_batches, PipelineStage& stage);

}  // namespace difftrain::parallel
