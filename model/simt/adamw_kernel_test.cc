// The GPU's AdamW pass (model/cuda/adamw_kernels.h) on the CPU emulator against the CPU
// optimizer (model/optim/adamw.h): one and four parameters a thread, sizes that leave 0–3
// parameters after the last vector, grids with more threads than work and with many loop
// trips, with and without clipping, the bf16 copy and the EMA. The bf16 copy starts as NaN,
// so a parameter the pass skips fails. model/cuda/optimizer_test.cc runs the compiled kernel
// on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/cuda/adamw_kernels.h"
#include "model/optim/adamw.h"
#include "model/simt/simt.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

constexpr uint16_t kNaNBits = 0xFFFF;

struct State {
  std::vector<float> master, grads, exp_avg, exp_avg_sq, ema;
  std::vector<uint16_t> bf16;
};

State RandomState(size_t n, uint64_t seed) {
  Rng rng(seed, RngStream::kData);
  State s;
  for (std::vector<float>* v : {&s.master, &s.grads, &s.exp_avg, &s.ema}) {
    v->resize(n);
    for (float& x : *v)
      x = static_cast<float>(rng.Normal());
  }
  s.exp_avg_sq.resize(n);
  for (float& x : s.exp_avg_sq)
    x = static_cast<float>(std::abs(rng.Normal()) * 0.1);
  s.bf16.assign(n, kNaNBits);
  return s;
}

struct Run {
  size_t n;
  int W;
  int blocks, threads;
  double max_norm;  // 0: no clipping
  bool ema;
  bool bf16;
};

void ExpectMatchesTheCpuOptimizer(const Run& r) {
  SCOPED_TRACE(::testing::Message() << "n " << r.n << ", " << r.W << " a thread, grid " << r.blocks
                                    << "x" << r.threads << ", max_norm " << r.max_norm
                                    << (r.ema ? ", EMA" : "") << (r.bf16 ? ", bf16 copy" : ""));
  OptimizerConfig config;
  config.lr = 3e-3;  // large enough that every update shows
  config.weight_decay = 0.01;
  config.grad_clip = r.max_norm;
  const int64_t step = 3;
  const double ema_decay = 0.99;
  State gpu = RandomState(r.n, /*seed=*/r.n + 7), cpu = gpu;
  // A squared norm that clips the gradients to about half.
  const double sum_of_squares = r.max_norm > 0 ? 4 * r.max_norm * r.max_norm : 0;

  const adamw::Args args{gpu.master.data(),
                         r.bf16 ? gpu.bf16.data() : nullptr,
                         gpu.exp_avg.data(),
                         gpu.exp_avg_sq.data(),
                         gpu.grads.data(),
                         &sum_of_squares,
                         r.n,
                         AdamWScalarsAt(config.lr, step, config),
                         r.max_norm,
                         r.ema ? gpu.ema.data() : nullptr,
                         static_cast<float>(ema_decay),
                         static_cast<float>(1.0 - ema_decay),
                         r.blocks,
                         r.threads};
  simt::Launch({r.blocks, 1, 1}, r.threads, 0, [&] {
    if (r.W == 4) {
      adamw::Step<simt::Primitives, 4>(args);
    } else {
      adamw::Step<simt::Primitives, 1>(args);
    }
  });

  const double scale = ClipScale(std::sqrt(sum_of_squares), r.max_norm);
  AdamWUpdate(cpu.master.data(), cpu.grads.data(), cpu.exp_avg.data(), cpu.exp_avg_sq.data(), r.n,
              config.lr, scale, step, config);
  if (r.ema) EmaUpdate(cpu.ema.data(), cpu.master.data(), r.n, ema_decay);
  const State before = RandomState(r.n, r.n + 7);
  for (size_t i = 0; i < r.n; ++i) {
    SCOPED_TRACE(::testing::Message() << "parameter " << i);
    const auto near = [](float got, float want) {
      return std::abs(got - want) <= 1e-6f * (1.0f + std::abs(want));
    };
    // An update moves the moments far beyond the tolerance, so a skipped parameter fails here.
    ASSERT_TRUE(near(gpu.master[i], cpu.master[i])) << gpu.master[i] << " vs " << cpu.master[i];
    ASSERT_TRUE(near(gpu.exp_avg[i], cpu.exp_avg[i])) << before.exp_avg[i];
    ASSERT_TRUE(near(gpu.exp_avg_sq[i], cpu.exp_avg_sq[i]));
    ASSERT_TRUE(near(gpu.ema[i], r.ema ? cpu.ema[i] : before.ema[i]));
    ASSERT_EQ(gpu.bf16[i], r.bf16 ? simt::FloatToBf16(gpu.master[i]) : kNaNBits);
  }
}

TEST(AdamWKernelTest, MatchesTheCpuOptimizer) {
  for (int W : {1, 4}) {
    for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{7}, size_t{1000}, size_t{1027}}) {
      ExpectMatchesTheCpuOptimizer({n, W, /*blocks=*/2, /*threads=*/64, 1.0, true, true});
    }
    // More threads than work, and many trips round the grid-stride loop.
    ExpectMatchesTheCpuOptimizer({130, W, 8, 128, 0.5, true, true});
    ExpectMatchesTheCpuOptimizer({4099, W, 1, 32, 2.0, true, true});
    // Without clipping, the bf16 copy or the EMA.
    ExpectMatchesTheCpuOptimizer({1001, W, 3, 64, 0.0, false, true});
    ExpectMatchesTheCpuOptimizer({1002, W, 3, 64, 1.0, true, false});
  }
}

// Four parameters a thread computes what one does, bit for bit.
TEST(AdamWKernelTest, FourAThreadGiveOneAThreadsBits) {
  OptimizerConfig config;
  config.grad_clip = 1.0;
  const size_t n = 2051;
  const double sum_of_squares = 9.0;
  State one = RandomState(n, 5), four = one;
  for (State* s : {&one, &four}) {
    const adamw::Args args{s->master.data(),
                           s->bf16.data(),
                           s->exp_avg.data(),
                           s->exp_avg_sq.data(),
                           s->grads.data(),
                           &sum_of_squares,
                           n,
                           AdamWScalarsAt(1e-3, 10, config),
                           config.grad_clip,
                           s->ema.data(),
                           0.9999f,
                           static_cast<float>(1.0 - 0.9999),
                           4,
                           96};
    simt::Launch({4, 1, 1}, 96, 0, [&] {
      if (s == &four) {
        adamw::Step<simt::Primitives, 4>(args);
      } else {
        adamw::Step<simt::Primitives, 1>(args);
      }
    });
  }
  EXPECT_EQ(one.master, four.master);
  EXPECT_EQ(one.exp_avg, four.exp_avg);
  EXPECT_EQ(one.exp_avg_sq, four.exp_avg_sq);
  EXPECT_EQ(one.ema, four.ema);
  EXPECT_EQ(one.bf16, four.bf16);
}

}  // namespace
}  // namespace difftrain
