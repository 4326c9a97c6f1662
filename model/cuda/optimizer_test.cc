// The GPU optimizer step against model/optim/adamw.h: the squared norm (written and added,
// at sizes around the block and partial counts), AdamW with clipping active, inactive and off,
// with and without the bf16 copy, the EMA, and arrays aligned for the kernel's four-parameter
// accesses or not (model/simt/adamw_kernel_test.cc checks its indexing on the CPU emulator).
#include "model/cuda/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cuda/testing.h"
#include "model/cuda/train_state.h"
#include "model/optim/adamw.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::Poison;
using testing::RandomVector;
using testing::RelativeL2;
using testing::RoundToBf16;
using testing::UploadFloat;

class SumOfSquaresTest : public ::testing::TestWithParam<size_t> {};

TEST_P(SumOfSquaresTest, MatchesCpu) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = GetParam(), m = n / 3 + 1;
  const std::vector<float> a = RandomVector(n, 1, 0.01), b = RandomVector(m, 2, 3.0);
  const double want_a = ::difftrain::SumOfSquares(a.data(), n),
               want_b = ::difftrain::SumOfSquares(b.data(), m);

  DeviceBuffer<float> d_a = UploadFloat(a), d_b = UploadFloat(b);
  DeviceBuffer<float> ws_a(SumOfSquaresWorkspace(n)), ws_b(SumOfSquaresWorkspace(m));
  DeviceBuffer<double> result(1), second(1);
  DT_CUDA_CHECK(cudaMemset(result.data(), 0xFF, sizeof(double)));  // NaN: the first call writes
  Poison(ws_a);
  Poison(ws_b);
  SumOfSquares(result.data(), d_a.data(), n, ws_a.data(), /*accumulate=*/false, nullptr);
  SumOfSquares(second.data(), d_a.data(), n, ws_a.data(), /*accumulate=*/false, nullptr);
  SumOfSquares(second.data(), d_b.data(), m, ws_b.data(), /*accumulate=*/true, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  const double got = result.Download()[0], got_sum = second.Download()[0];
  EXPECT_NEAR(got, want_a, 1e-10 * want_a);  // both in double: only the order differs
  EXPECT_NEAR(got_sum, want_a + want_b, 1e-10 * (want_a + want_b));
  // From an address that is not 16-byte aligned (a bucket's slice): the one-value kernel.
  if (n > 1) {
    const double want_tail = ::difftrain::SumOfSquares(a.data() + 1, n - 1);
    SumOfSquares(result.data(), d_a.data() + 1, n - 1, ws_a.data(), /*accumulate=*/false, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_NEAR(result.Download()[0], want_tail, 1e-10 * want_tail) << "unaligned";
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SumOfSquaresTest,
                         ::testing::Values(size_t{1}, size_t{255}, size_t{2049}, size_t{3000017},
                                           size_t{40000001}));

struct AdamWCase {
  const char* name;
  float max_norm;  // relative to the gradients' norm: 0.5 clips, 2 does not, 0 is off
  bool with_bf16;
};

class AdamWTest : public ::testing::TestWithParam<AdamWCase> {};

TEST_P(AdamWTest, MatchesCpu) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = 1000037;
  const std::vector<float> master0 = RandomVector(n, 3), grads = RandomVector(n, 4, 0.1);
  std::vector<float> m0 = RandomVector(n, 5, 0.01), v0 = RandomVector(n, 6, 0.001);
  for (float& v : v0)
    v = v * v;  // exp_avg_sq is non-negative

  const double sum = ::difftrain::SumOfSquares(grads.data(), n), norm = std::sqrt(sum);
  OptimizerConfig config;
  config.lr = 3e-3;
  config.beta2 = 0.95;
  config.weight_decay = 0.1;
  config.grad_clip = GetParam().max_norm * norm;
  constexpr int64_t kStep = 7;
  const double scale = ::difftrain::ClipScale(norm, config.grad_clip);
  if (GetParam().max_norm == 0.5f) {
    EXPECT_LT(scale, 0.6);  // the case clips for real
  }

  std::vector<float> master = master0, m = m0, v = v0;
  ::difftrain::AdamWUpdate(master.data(), grads.data(), m.data(), v.data(), n, config.lr, scale,
                           kStep, config);

  DeviceBuffer<float> d_master = UploadFloat(master0), d_m = UploadFloat(m0);
  DeviceBuffer<float> d_v = UploadFloat(v0), d_g = UploadFloat(grads);
  DeviceBuffer<double> d_sum(1);
  d_sum.Upload(&sum);
  DeviceBuffer<bf16> d_bf16(n);
  Poison(d_bf16);
  AdamWStep(d_master.data(), GetParam().with_bf16 ? d_bf16.data() : nullptr, d_m.data(), d_v.data(),
            d_g.data(), d_sum.data(), n, AdamWScalarsAt(config.lr, kStep, config), config.grad_clip,
            /*ema=*/{}, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());

  // The updates alone (the parameters barely move, which would hide a wrong step).
  const std::vector<float> got = DownloadAsFloat(d_master);
  std::vector<float> got_delta(n), want_delta(n);
  for (size_t i = 0; i < n; ++i) {
    got_delta[i] = got[i] - master0[i];
    want_delta[i] = master[i] - master0[i];
  }
  EXPECT_LE(RelativeL2(got, master), 1e-5);
  EXPECT_LE(RelativeL2(got_delta, want_delta), 1e-4);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_m), m), 1e-5);
  EXPECT_LE(RelativeL2(DownloadAsFloat(d_v), v), 1e-5);
  if (GetParam().with_bf16) {
    EXPECT_EQ(DownloadAsFloat(d_bf16), RoundToBf16(got));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AdamWTest,
                         ::testing::Values(AdamWCase{"Clipped", 0.5f, true},
                                           AdamWCase{"NotClipped", 2.0f, true},
                                           AdamWCase{"ClippingOff", 0.0f, false}),
                         [](const ::testing::TestParamInfo<AdamWCase>& info) {
                           return info.param.name;
                         });

TEST(EmaTest, MatchesCpu) {
  DT_SKIP_WITHOUT_GPU();
  for (const size_t n : {size_t{3}, size_t{1000037}}) {
    const std::vector<float> ema0 = RandomVector(n, 7), params = RandomVector(n, 8);
    const double decay = 0.999;
    std::vector<float> want = ema0;
    ::difftrain::EmaUpdate(want.data(), params.data(), n, decay);
    DeviceBuffer<float> d_ema = UploadFloat(ema0), d_params = UploadFloat(params);
    EmaUpdate(d_ema.data(), d_params.data(), n, decay, nullptr);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(RelativeL2(DownloadAsFloat(d_ema), want), 1e-6) << "n = " << n;
  }
}

// The EMA updated in AdamW's pass (what TrainState does) equals AdamWStep then EmaUpdate of
// the new master, and leaves the other outputs as they are without it.
// One AdamW step (with the EMA fused, or EmaUpdate after it) on device copies of the inputs that
// start `offset` floats into their buffers, read back.
struct AdamWInputs {
  std::vector<float> master, grads, m, v, ema;
  double sum_of_squares;
  OptimizerConfig config;
};
struct AdamWOutputs {
  std::vector<float> master, m, v, bf16, ema;
};
AdamWInputs RandomAdamWInputs(size_t n) {
  AdamWInputs in{RandomVector(n, 9),
                 RandomVector(n, 10, 0.1),
                 RandomVector(n, 11, 0.01),
                 RandomVector(n, 13, 0.001),
                 RandomVector(n, 12),
                 0,
                 {}};
  for (float& v : in.v)
    v = v * v;
  in.sum_of_squares = ::difftrain::SumOfSquares(in.grads.data(), n);
  in.config.lr = 1e-3;
  in.config.grad_clip = 0.5 * std::sqrt(in.sum_of_squares);
  return in;
}
AdamWOutputs RunAdamW(const AdamWInputs& in, bool fused, size_t offset) {
  constexpr double kDecay = 0.9999;
  const size_t n = in.master.size();
  const auto upload = [&](const std::vector<float>& host) {
    std::vector<float> padded(offset, 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    return UploadFloat(padded);
  };
  const auto download = [&](const auto& buffer) {
    std::vector<float> all = DownloadAsFloat(buffer);
    return std::vector<float>(all.begin() + offset, all.end());
  };
  DeviceBuffer<float> d_master = upload(in.master), d_m = upload(in.m), d_v = upload(in.v);
  DeviceBuffer<float> d_g = upload(in.grads), d_ema = upload(in.ema);
  DeviceBuffer<double> d_sum(1);
  d_sum.Upload(&in.sum_of_squares);
  DeviceBuffer<bf16> d_bf16(n + offset);
  Poison(d_bf16);
  float* ema = d_ema.data() + offset;
  AdamWStep(d_master.data() + offset, d_bf16.data() + offset, d_m.data() + offset,
            d_v.data() + offset, d_g.data() + offset, d_sum.data(), n,
            AdamWScalarsAt(in.config.lr, /*step=*/3, in.config), in.config.grad_clip,
            fused ? EmaOfMaster{.values = ema, .decay = kDecay} : EmaOfMaster{}, nullptr);
  if (!fused) EmaUpdate(ema, d_master.data() + offset, n, kDecay, nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  return {download(d_master), download(d_m), download(d_v), download(d_bf16), download(d_ema)};
}

// How many elements differ in their bits (a count, not two vectors of a million printed).
size_t Differ(const std::vector<float>& a, const std::vector<float>& b) {
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i)
    count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return count;
}

// The weights, moments and bf16 copy of two runs bit for bit, and the EMA too with `ema`.
void ExpectSameBits(const AdamWOutputs& a, const AdamWOutputs& b, bool ema) {
  EXPECT_EQ(Differ(a.master, b.master), 0u);
  EXPECT_EQ(Differ(a.m, b.m), 0u);
  EXPECT_EQ(Differ(a.v, b.v), 0u);
  EXPECT_EQ(Differ(a.bf16, b.bf16), 0u);
  if (ema) {
    EXPECT_EQ(Differ(a.ema, b.ema), 0u);
  }
}

TEST(AdamWTest, FusedEmaEqualsTheSeparateUpdate) {
  DT_SKIP_WITHOUT_GPU();
  const AdamWInputs in = RandomAdamWInputs(1000037);
  const AdamWOutputs separate = RunAdamW(in, false, 0), fused = RunAdamW(in, true, 0);
  ExpectSameBits(fused, separate, /*ema=*/false);
  EXPECT_GT(RelativeL2(fused.ema, in.ema), 1e-6);  // the EMA moved
  // The same expression in both kernels: equal up to how nvcc contracts it into an FMA.
  EXPECT_LE(RelativeL2(fused.ema, separate.ema), 1e-7);
}

// Arrays one float off 16-byte alignment take the kernel's one-parameter-a-thread path, aligned
// ones four a thread: the same bits.
TEST(AdamWTest, UnalignedArraysGiveTheAlignedBits) {
  DT_SKIP_WITHOUT_GPU();
  const AdamWInputs in = RandomAdamWInputs(1000037);
  const AdamWOutputs aligned = RunAdamW(in, true, 0), unaligned = RunAdamW(in, true, 1);
  ExpectSameBits(aligned, unaligned, /*ema=*/true);
  EXPECT_GT(RelativeL2(aligned.master, in.master), 1e-6);  // the step moved the weights
}

// TrainState's EMA on a stream of its own (the default) against the EMA in AdamW's pass, over
// steps with new gradients each: the weights and moments bit for bit, the EMA as close as the
// two kernels' FMA contraction allows. Download right after the last step, without a
// synchronisation of ours: it must wait for the EMA still running on its stream.
TEST(TrainStateTest, EmaOnItsOwnStreamFollowsTheFusedPass) {
  DT_SKIP_WITHOUT_GPU();
  constexpr size_t n = 1000037;
  constexpr int kSteps = 5;
  const AdamWInputs in = RandomAdamWInputs(n);
  OptimizerConfig config = in.config;
  config.ema_decay = 0.9;  // so that five steps move it visibly
  cudaStream_t stream = CreateStepStream();
  int least = 0, greatest = 0, priority = 0;
  DT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  DT_CUDA_CHECK(cudaStreamGetPriority(stream, &priority));
  EXPECT_EQ(priority, greatest) << "the step's stream outranks the EMA's (" << least << ")";
  struct Run {
    std::vector<float> master, ema, m, v;
  };
  const auto run = [&](bool ema_stream) {
    TrainState state(n, stream);
    state.set_ema_stream(ema_stream);
    EXPECT_TRUE(state.Allocate().ok());
    state.Upload(in.master.data(), in.ema.data(), in.m.data(), in.v.data());
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<float> grads = RandomVector(n, 100 + step, 0.1);
      DT_CUDA_CHECK(cudaMemcpyAsync(state.gradients(), grads.data(), n * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
      state.OptimizerStep(config.lr, step, config);
    }
    Run r{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
          std::vector<float>(n)};
    state.Download(r.master.data(), r.ema.data(), r.m.data(), r.v.data());
    return r;
  };
  const Run fused = run(false), beside = run(true);
  DT_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(Differ(beside.master, fused.master), 0u);
  EXPECT_EQ(Differ(beside.m, fused.m), 0u);
  EXPECT_EQ(Differ(beside.v, fused.v), 0u);
  EXPECT_GT(RelativeL2(fused.ema, in.ema), 1e-3);  // the EMA moved
  EXPECT_LE(RelativeL2(beside.ema, fused.ema), 1e-6);
}

// ZeroRanges zeroes exactly its ranges: one longer than a block's chunk (16 Ki), short ones,
// adjacent ones, the first and last element of the array; everything else keeps its value.
TEST(ZeroRangesTest, ZeroesExactlyItsRanges) {
  DT_SKIP_WITHOUT_GPU();
  const size_t n = 100000;
  const std::vector<uint64_t> ranges = {0, 1, 5, 3, 8, 2, 1000, 40000, 99990, 10};
  std::vector<float> want(n, 1.5f);
  size_t longest = 0;
  for (size_t r = 0; r < ranges.size(); r += 2) {
    for (uint64_t i = 0; i < ranges[r + 1]; ++i)
      want[ranges[r] + i] = 0.0f;
    longest = std::max<size_t>(longest, ranges[r + 1]);
  }
  DeviceBuffer<float> values = testing::UploadFloat(std::vector<float>(n, 1.5f));
  DeviceBuffer<uint64_t> device_ranges(ranges.size());
  DT_CUDA_CHECK(cudaMemcpy(device_ranges.data(), ranges.data(), ranges.size() * sizeof(uint64_t),
                           cudaMemcpyHostToDevice));
  ZeroRanges(values.data(), device_ranges.data(), static_cast<int>(ranges.size() / 2), longest,
             nullptr);
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(values.Download() == want);
}

}  // namespace
}  // namespace difftrain::cuda
