// The communication of tensor and context parallelism, each forward op next to its
// backward twin (Megatron-Core's mappings.py). A layer calls Forward in its forward pass
// and the same pair's Backward at the mirrored place of its backward pass; a null Comm, or
// a group of one, makes both a no-op (tensor parallelism) or a plain copy (context
// parallelism), so one process runs the same code.
//
//   pair                        forward                         backward
//   CopyToTensorParallel        identity                        all-reduce (sum) of dx
//   ReduceFromTensorParallel    all-reduce (sum) of y           identity
//   GatherSequence              all-gather the token shards     reduce-scatter (sum) of dfull
//   GatherSequenceSplitGrad     all-gather the token shards     keep this rank's shard of dfull
//
// Sequence buffers are [B, T, width] (full) and [B, T/cp, width] (local): context-parallel
// rank r holds tokens [r·T/cp, (r+1)·T/cp) of every sample. The gathers go through a
// rank-major scratch [cp, B, T/cp, width]. With one rank, full and local (dfull and dlocal)
// may be the same buffer: then there is nothing to move.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "model/parallel/comm.h"

namespace difftrain::parallel {

// f: the input of a column-parallel layer. Every tensor-parallel rank already holds x; the
// layer's input gradient is a partial sum over the ranks' column shards.
struct CopyToTensorParallel {
  static Status Forward(Comm* tp, const float* x, size_t n) { return Status::Ok(); }
  static Status Backward(Comm* tp, float* dx, size_t n);
};

// g: the output of a row-parallel layer, a partial sum over the ranks' row shards. Its
// gradient is the same on every rank and passes through.
struct ReduceFromTensorParallel {
  static Status Forward(Comm* tp, float* y, size_t n);
  static Status Backward(Comm* tp, const float* dy, size_t n) { return Status::Ok(); }
};

// The shape of a sequence exchanged within the context-parallel group.
struct SequenceShape {
  int B = 0;        // samples
  int local_T = 0;  // tokens per rank
  int width = 0;    // floats per token
  size_t local() const { return size_t(B) * local_T * width; }
};

// Keys and values: every rank needs the whole sequence forward; each rank's gradient of
// the whole sequence is partial, so backward sums them and keeps this rank's tokens.
struct GatherSequence {
  static Status Forward(Comm* cp, const float* local, float* full, const SequenceShape& s,
                        float* scratch);
  // Adds the sum over the group of dfull's rows of this rank's tokens into dlocal.
  static Status Backward(Comm* cp, const float* dfull, float* dlocal, const SequenceShape& s,
                         float* scratch);
};

// The model output: every rank computes the whole loss from the gathered sequence, so the
// gradient of the whole sequence is the same everywhere and each rank keeps its tokens.
struct GatherSequenceSplitGrad {
  static Status Forward(Comm* cp, const float* local, float* full, const SequenceShape& s,
                        float* scratch) {
    return GatherSequence::Forward(cp, local, full, s, scratch);
  }
  // Adds this rank's tokens of dfull into dlocal.
  static void Backward(Comm* cp, const float* dfull, float* dlocal, const SequenceShape& s);
};

}  // namespace difftrain::parallel
