// The 1F1B schedule: each stage runs warm-up = min(pp − s − 1, m) forwards, then alternates,
// then cools down; values move stage to stage forward and gradients come back, in order.
#include "model/parallel/pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/parallel/gloo_comm.h"
#include "model/parallel/rank_processes.h"

namespace difftrain::parallel {
namespace {

// Forward adds 1 to every element (the first stage starts from the micro-batch index);
// backward passes the gradient on, adding 10. The stage checks what it receives and
// records the order of its calls: "F0 F1 B0 ...".
class CountingStage final : public PipelineStage {
 public:
  CountingStage(int stage, int stages) : stage_(stage), stages_(stages) {}
  size_t boundary_elements() const override { return 3; }
  Status Forward(int micro, const float* input, float* output) override {
    const float x = input ? input[0] : static_cast<float>(micro);
    if (x != static_cast<float>(micro + stage_)) {
      return Errorf("stage {} forward {}: input {}", stage_, micro, x);
    }
    if (output) std::fill(output, output + 3, x + 1);
    order_ += fmt::format("F{} ", micro);
    return Status::Ok();
  }
  Status Backward(int micro, const float* output_grad, float* input_grad) override {
    const float g = output_grad ? output_grad[2] : static_cast<float>(micro);
    if (g != static_cast<float>(micro + 10 * (stages_ - 1 - stage_))) {
      return Errorf("stage {} backward {}: gradient {}", stage_, micro, g);
    }
    if (input_grad) std::fill(input_grad, input_grad + 3, g + 10);
    order_ += fmt::format("B{} ", micro);
    return Status::Ok();
  }
  const std::string& order() const { return order_; }

 private:
  int stage_, stages_;
  std::string order_;
};

std::string Expected1F1B(int pp, int stage, int m) {
  const int warmup = std::min(pp - stage - 1, m);
  std::string order;
  int f = 0, b = 0;
  for (int i = 0; i < warmup; ++i)
    order += fmt::format("F{} ", f++);
  while (f < m) {
    order += fmt::format("F{} ", f++);
    order += fmt::format("B{} ", b++);
  }
  while (b < m)
    order += fmt::format("B{} ", b++);
  return order;
}

TEST(PipelineTest, OneProcessIsForwardBackwardInTurn) {
  CountingStage stage(0, 1);
  ASSERT_TRUE(RunOneForwardOneBackward(nullptr, 3, stage).ok());
  EXPECT_EQ(stage.order(), "F0 B0 F1 B1 F2 B2 ");
}

TEST(PipelineTest, StagesRunOneForwardOneBackward) {
  for (auto [pp, m] : {std::pair{3, 5}, {4, 2}, {2, 1}}) {
    TempDir dir;
    RankProcesses ranks(dir.path(), pp, [&, pp = pp, m = m](int rank) -> Status {
      DT_ASSIGN_OR_RETURN(FileStore store, FileStore::Open(dir.path() + "/store"));
      std::vector<int> members(pp);
      for (int r = 0; r < pp; ++r)
        members[r] = r;
      DT_ASSIGN_OR_RETURN(
          std::unique_ptr<Comm> comm,
          CreateGlooComm(store, "test/pp", rank, pp, members, std::chrono::milliseconds(5000)));
      CountingStage stage(rank, pp);
      DT_RETURN_IF_ERROR(RunOneForwardOneBackward(comm.get(), m, stage));
      if (stage.order() != Expected1F1B(pp, rank, m)) {
        return Errorf("stage {} ran '{}', expected '{}'", rank, stage.order(),
                      Expected1F1B(pp, rank, m));
      }
      if (InFlightMicroBatches(pp, rank, m) != std::min(pp - rank, m)) {
        return Status::Error("in-flight count");
      }
      return Status::Ok();
    });
    const Status s = ranks.WaitAll(std::chrono::milliseconds(30000));
    EXPECT_TRUE(s.ok()) << "pp " << pp << " m " << m << ": " << s.message();
  }
}

}  // namespace
}  // namespace difftrain::parallel
