#include "model/parallel/mappings.h"

#include <cstring>

namespace difftrain::parallel {
namespace {

int SizeOf(const Comm* c) {
  return c == nullptr ? 1 : c->size();
}
int RankOf(const Comm* c) {
  return c == nullptr ? 0 : c->rank();
}

// Copies between the rank-major [cp, B, Tl, w] and the sample-major [B, cp·Tl, w] layouts.
void RankMajorToSampleMajor(const float* from, float* to, const SequenceShape& s, int cp) {
  const size_t chunk = size_t(s.local_T) * s.width;
  for (int r = 0; r < cp; ++r) {
    for (int b = 0; b < s.B; ++b)
      std::memcpy(to + (size_t(b) * cp + r) * chunk, from + (size_t(r) * s.B + b) * chunk,
                  chunk * sizeof(float));
  }
}
void SampleMajorToRankMajor(const float* from, float* to, const SequenceShape& s, int cp) {
  const size_t chunk = size_t(s.local_T) * s.width;
  for (int r = 0; r < cp; ++r) {
    for (int b = 0; b < s.B; ++b)
      std::memcpy(to + (size_t(r) * s.B + b) * chunk, from + (size_t(b) * cp + r) * chunk,
                  chunk * sizeof(float));
  }
}

}  // namespace

Status CopyToTensorParallel::Backward(Comm* tp, float* dx, size_t n) {
  if (SizeOf(tp) == 1) return Status::Ok();
  return tp->AllReduce(dx, n, ReduceOp::kSum);
}

Status ReduceFromTensorParallel::Forward(Comm* tp, float* y, size_t n) {
  if (SizeOf(tp) == 1) return Status::Ok();
  return tp->AllReduce(y, n, ReduceOp::kSum);
}

Status GatherSequence::Forward(Comm* cp, const float* local, float* full, const SequenceShape& s,
                               float* scratch) {
  const int size = SizeOf(cp);
  if (size == 1) {
    if (full != local) std::memcpy(full, local, s.local() * sizeof(float));
    return Status::Ok();
  }
  DT_RETURN_IF_ERROR(cp->AllGather(local, scratch, s.local()));
  RankMajorToSampleMajor(scratch, full, s, size);
  return Status::Ok();
}

Status GatherSequence::Backward(Comm* cp, const float* dfull, float* dlocal, const SequenceShape& s,
                                float* scratch) {
  const int size = SizeOf(cp);
  if (size == 1 && dfull == dlocal) return Status::Ok();
  const float* mine = dfull;
  if (size > 1) {
    SampleMajorToRankMajor(dfull, scratch, s, size);
    float* out = scratch + size_t(cp->rank()) * s.local();
    DT_RETURN_IF_ERROR(cp->ReduceScatter(scratch, out, s.local(), ReduceOp::kSum));
    mine = out;
  }
  for (size_t i = 0; i < s.local(); ++i)
    dlocal[i] += mine[i];
  return Status::Ok();
}

void GatherSequenceSplitGrad::Backward(Comm* cp, const float* dfull, float* dlocal,
                                       const SequenceShape& s) {
  const int size = SizeOf(cp), r = RankOf(cp);
  const size_t chunk = size_t(s.local_T) * s.width;
  for (int b = 0; b < s.B; ++b) {
    const float* from = dfull + (size_t(b) * size + r) * chunk;
    float* to = dlocal + size_t(b) * chunk;
    for (size_t i = 0; i < chunk; ++i)
      to[i] += from[i];
  }
}

}  // namespace difftrain::parallel
