#include "model/parallel/pipeline.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/check.h"

namespace difftrain::parallel {
namespace {

// This stage's transfers with its neighbours. Every exchange posts its send and receive
// together before waiting for either, so two stages that exchange in opposite directions
// at the same time (a forward's output against a backward's gradient) never deadlock.
class Neighbours {
 public:
  Neighbours(Comm* pp, size_t n) : pp_(pp), n_(n) {
    const int stage = pp ? pp->rank() : 0, stages = pp ? pp->size() : 1;
    first_ = stage == 0;
    last_ = stage + 1 == stages;
    input_.resize(first_ ? 0 : n);
    output_.resize(last_ ? 0 : n);
    input_grad_.resize(first_ ? 0 : n);
    output_grad_.resize(last_ ? 0 : n);
  }

  bool first() const { return first_; }
  bool last() const { return last_; }
  float* input() { return first_ ? nullptr : input_.data(); }
  float* output() { return last_ ? nullptr : output_.data(); }
  float* input_grad() { return first_ ? nullptr : input_grad_.data(); }
  float* output_grad() { return last_ ? nullptr : output_grad_.data(); }

  // Any of: send the output forward, receive the gradient of the output, send the gradient
  // of the input back, receive the next input; then wait for all of them.
  Status Exchange(bool send_output, bool recv_output_grad, bool send_input_grad, bool recv_input) {
    std::vector<std::unique_ptr<CommWork>> works;
    const int stage = pp_ ? pp_->rank() : 0;
    if (send_output && !last_) works.push_back(pp_->SendAsync(output_.data(), n_, stage + 1));
    if (recv_output_grad && !last_)
      works.push_back(pp_->RecvAsync(output_grad_.data(), n_, stage + 1));
    if (send_input_grad && !first_)
      works.push_back(pp_->SendAsync(input_grad_.data(), n_, stage - 1));
    if (recv_input && !first_) works.push_back(pp_->RecvAsync(input_.data(), n_, stage - 1));
    for (auto& w : works)
      DT_RETURN_IF_ERROR(w->Wait().WithContext("pipeline exchange"));
    return Status::Ok();
  }

 private:
  Comm* pp_;
  size_t n_;
  bool first_ = true, last_ = true;
  std::vector<float> input_, output_, input_grad_, output_grad_;
};

}  // namespace

int InFlightMicroBatches(int pp, int stage, int micro_batches) {
  return std::min(pp - stage, micro_batches);
}

Status RunOneForwardOneBackward(Comm* pp, int m, PipelineStage& stage) {
  DT_CHECK(m > 0, "no micro-batches");
  const int stages = pp ? pp->size() : 1, s = pp ? pp->rank() : 0;
  Neighbours io(pp, stage.boundary_elements());
  const int warmup = std::min(stages - s - 1, m);
  const int steady = m - warmup;
  int forwarded = 0, backwarded = 0;
  auto forward = [&] { return stage.Forward(forwarded++, io.input(), io.output()); };
  auto backward = [&] { return stage.Backward(backwarded++, io.output_grad(), io.input_grad()); };

  for (int i = 0; i < warmup; ++i) {
    DT_RETURN_IF_ERROR(io.Exchange(false, false, false, true));
    DT_RETURN_IF_ERROR(forward());
    DT_RETURN_IF_ERROR(io.Exchange(true, false, false, false));
  }
  if (steady > 0) DT_RETURN_IF_ERROR(io.Exchange(false, false, false, true));
  for (int i = 0; i < steady; ++i) {
    DT_RETURN_IF_ERROR(forward());
    DT_RETURN_IF_ERROR(io.Exchange(true, true, false, false));
    DT_RETURN_IF_ERROR(backward());
    const bool more = i + 1 < steady;
    DT_RETURN_IF_ERROR(io.Exchange(false, false, true, more));
  }
  for (int i = 0; i < warmup; ++i) {
    DT_RETURN_IF_ERROR(io.Exchange(false, true, false, false));
    DT_RETURN_IF_ERROR(backward());
    DT_RETURN_IF_ERROR(io.Exchange(false, false, true, false));
  }
  DT_CHECK(forwarded == m && backwarded == m, "1F1B ran {} forwards, {} backwards of {}", forwarded,
           backwarded, m);
  return Status::Ok();
}

}  // namespace difftrain::parallel
