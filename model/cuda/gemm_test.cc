// The cuBLASLt Linear GEMMs against the CPU reference (model/cpu/linear, model/cpu/activation),
// computed in double on exactly the bf16 values the GPU reads.
//
// Tolerances (relative L2 over the whole output):
//   - bf16 outputs: ≤ 1e-2. Rounding a result to bf16 (8-bit significand) alone costs up to
//     2⁻⁹ ≈ 2e-3 relatively per element (about 1e-3 in RMS); the rest is fp32 accumulation
//     order and, for the epilogues, the GELU evaluated in fp32 on the GPU.
//   - fp32 outputs of bf16 GEMMs: ≤ 1e-3. The inputs are identical bf16 values and a product of
//     two bf16 values is exact in fp32 (8 + 8 significand bits ≤ 24), so only the order and the
//     fp32 rounding of the accumulation differ from the double reference: at most about
//     K·2⁻²⁴ ≈ 7e-5 relatively for K = 1152 in the worst case, ~√K·2⁻²⁴ typically. 1e-3 leaves
//     an order of magnitude for tensor-core accumulation details, and still fails any wrong
//     mapping (a transposed or misplaced operand gives an error of order 1).
#include "model/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "model/cpu/activation.h"
#include "model/cpu/linear.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using testing::DownloadAsFloat;
using testing::Poison;
using testing::RandomVector;
using testing::RelativeL2;
using testing::RoundToBf16;
using testing::UploadBf16;
using testing::UploadFloat;

constexpr double kBf16Tolerance = 1e-2;
constexpr double kFloatTolerance = 1e-3;

std::vector<double> ToDouble(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
std::vector<float> ToFloat(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

// Random bf16-exact values of the given scale.
std::vector<float> RandomBf16(size_t n, uint64_t seed, double scale) {
  return RoundToBf16(RandomVector(n, seed, scale));
}

// The operands of one Linear layer: in [N, I], w [O, I] (scaled so that outputs are O(1)),
// bias [O], dout [N, O].
struct Operands {
  Operands(int N, int I, int O, uint64_t seed)
      : in(RandomBf16(size_t(N) * I, seed, 1.0)),
        w(RandomBf16(size_t(O) * I, seed + 1, 1.0 / std::sqrt(double(I)))),
        bias(RandomBf16(size_t(O), seed + 2, 0.5)),
        dout(RandomBf16(size_t(N) * O, seed + 3, 1.0)) {}
  std::vector<float> in, w, bias, dout;
};

// out = in · wᵀ (+ bias), in double.
std::vector<double> ReferenceForward(const Operands& x, int N, int I, int O, bool with_bias) {
  const std::vector<double> in = ToDouble(x.in), w = ToDouble(x.w), bias = ToDouble(x.bias);
  std::vector<double> out(size_t(N) * O);
  cpu::LinearForward<double>(out.data(), in.data(), w.data(), with_bias ? bias.data() : nullptr, N,
                             I, O);
  return out;
}

class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DT_SKIP_WITHOUT_GPU();
    DT_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) DT_CUDA_CHECK(cudaStreamDestroy(stream_));
  }
  void Sync() { DT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // Forward with bf16 output; with kBiasGelu also checks the aux (pre-activation).
  void CheckForwardBf16(int N, int I, int O, Epilogue epilogue, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O);
    const Operands x(N, I, O, seed);
    const std::vector<double> pre = ReferenceForward(x, N, I, O, epilogue != Epilogue::kNone);
    std::vector<double> want = pre;
    if (epilogue == Epilogue::kBiasGelu)
      cpu::GeluForward<double>(want.data(), pre.data(), pre.size());

    DeviceBuffer<bf16> in = UploadBf16(x.in), w = UploadBf16(x.w), bias = UploadBf16(x.bias);
    DeviceBuffer<bf16> out(size_t(N) * O), aux(size_t(N) * O);
    Poison(out);
    Poison(aux);
    Gemm gemm(stream_);
    gemm.Forward(out.data(), in.data(), w.data(),
                 epilogue == Epilogue::kNone ? nullptr : bias.data(), N, I, O, epilogue,
                 epilogue == Epilogue::kBiasGelu ? aux.data() : nullptr);
    Sync();
    EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(want)), kBf16Tolerance);
    if (epilogue == Epilogue::kBiasGelu) {
      EXPECT_LE(RelativeL2(DownloadAsFloat(aux), ToFloat(pre)), kBf16Tolerance);
    }
  }

  void CheckForwardFloat(int N, int I, int O, Epilogue epilogue, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O);
    const Operands x(N, I, O, seed);
    const bool with_bias = epilogue == Epilogue::kBias;
    const std::vector<double> want = ReferenceForward(x, N, I, O, with_bias);

    DeviceBuffer<bf16> in = UploadBf16(x.in), w = UploadBf16(x.w), bias = UploadBf16(x.bias);
    DeviceBuffer<float> out(size_t(N) * O);
    Poison(out);
    Gemm gemm(stream_);
    gemm.Forward(out.data(), in.data(), w.data(), with_bias ? bias.data() : nullptr, N, I, O,
                 epilogue);
    Sync();
    EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(want)), kFloatTolerance);
  }

  // dw starts from known non-zero values and must come back as dw₀ + doutᵀ·in; with the bias,
  // (BackwardWeightAndBias) db likewise as db₀ + dout's column sums.
  void CheckBackwardWeight(int N, int I, int O, uint64_t seed, bool with_bias = false) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << N << " I=" << I << " O=" << O << (with_bias ? ", with the bias" : ""));
    const Operands x(N, I, O, seed);
    const std::vector<float> dw0 = RandomVector(size_t(O) * I, seed + 10, 3.0);
    const std::vector<float> db0 = RandomVector(size_t(O), seed + 11, 3.0);
    std::vector<double> want = ToDouble(dw0), want_db = ToDouble(db0);
    const std::vector<double> dout = ToDouble(x.dout), in = ToDouble(x.in), w = ToDouble(x.w);
    cpu::LinearBackward<double>(nullptr, want.data(), with_bias ? want_db.data() : nullptr,
                                dout.data(), in.data(), w.data(), N, I, O);

    DeviceBuffer<bf16> d_dout = UploadBf16(x.dout), d_in = UploadBf16(x.in);
    DeviceBuffer<float> dw = UploadFloat(dw0), db = UploadFloat(db0), scratch(O);
    Poison(scratch);
    Gemm gemm(stream_);
    if (with_bias) {
      gemm.BackwardWeightAndBias(dw.data(), db.data(), d_dout.data(), d_in.data(), N, I, O,
                                 scratch.data());
      // Which path ran, for the session's log (bench/cuda_dit.sh prints the notes).
      std::printf("note: bias gradient of N=%d I=%d O=%d: %s\n", N, I, O,
                  gemm.FusesBiasGradient(N, I, O) ? "in the GEMM's epilogue (BGRADB)"
                                                  : "by BiasGradient (no BGRADB algorithm)");
    } else {
      gemm.BackwardWeight(dw.data(), d_dout.data(), d_in.data(), N, I, O);
    }
    Sync();
    // The whole result, then the increment alone, so that a kernel that dropped the product
    // (or the +=) cannot hide behind large starting values.
    const auto expect = [](const std::vector<float>& got, const std::vector<float>& start,
                           const std::vector<double>& want, const char* what) {
      EXPECT_LE(RelativeL2(got, ToFloat(want)), kFloatTolerance) << what;
      std::vector<float> got_delta(got.size()), want_delta(got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        got_delta[i] = got[i] - start[i];
        want_delta[i] = static_cast<float>(want[i] - start[i]);
      }
      EXPECT_LE(RelativeL2(got_delta, want_delta), kFloatTolerance) << what << ", the increment";
    };
    expect(DownloadAsFloat(dw), dw0, want, "dw");
    if (with_bias) expect(DownloadAsFloat(db), db0, want_db, "db");
  }

  // din = dout · w, or (dout · w) ⊙ gelu'(pre) with a GELU pre-activation pre [N, I]; with the
  // bias (BackwardInputGeluAndBias, with_gelu only), db from known values must come back as
  // db₀ + din's column sums.
  void CheckBackwardInput(int N, int I, int O, bool with_gelu, uint64_t seed,
                          bool with_bias = false) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << N << " I=" << I << " O=" << O << (with_bias ? ", with the bias" : ""));
    ASSERT_TRUE(with_gelu || !with_bias) << "the bias gradient comes with the GELU epilogue";
    const Operands x(N, I, O, seed);
    const std::vector<float> pre = RandomBf16(size_t(N) * I, seed + 20, 1.5);
    const std::vector<double> dout = ToDouble(x.dout), w = ToDouble(x.w);
    std::vector<double> dh(size_t(N) * I, 0.0);
    cpu::LinearBackward<double>(dh.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), N, I,
                                O);
    std::vector<double> want = dh;
    if (with_gelu) {
      const std::vector<double> pre_d = ToDouble(pre);
      std::fill(want.begin(), want.end(), 0.0);
      cpu::GeluBackward<double>(want.data(), dh.data(), pre_d.data(), want.size());
    }

    DeviceBuffer<bf16> d_dout = UploadBf16(x.dout), d_w = UploadBf16(x.w);
    DeviceBuffer<bf16> d_pre = UploadBf16(pre), din(size_t(N) * I);
    Poison(din);
    Gemm gemm(stream_);
    if (with_bias) {
      const std::vector<float> db0 = RandomVector(size_t(I), seed + 21, 3.0);
      std::vector<double> want_db(db0.begin(), db0.end());
      for (int r = 0; r < N; ++r)
        for (int i = 0; i < I; ++i)
          want_db[i] += want[size_t(r) * I + i];
      DeviceBuffer<float> db = UploadFloat(db0), scratch(I);
      Poison(scratch);
      gemm.BackwardInputGeluAndBias(din.data(), db.data(), d_dout.data(), d_w.data(), N, I, O,
                                    d_pre.data(), scratch.data());
      const bool fused = gemm.FusesGeluBiasGradient(N, I, O);
      std::printf("note: GELU input's bias gradient of N=%d I=%d O=%d: %s\n", N, I, O,
                  fused ? "in the GEMM's epilogue (DGELU_BGRAD)"
                        : "by BiasGradient over din (no DGELU_BGRAD algorithm)");
      Sync();
      // The epilogue sums the fp32 values before they are rounded to bf16; the fallback sums
      // din as stored, whose rounding (2⁻⁹ an element) the sum's cancellations can magnify.
      const double tolerance = fused ? kFloatTolerance : kBf16Tolerance;
      const std::vector<float> got_db = DownloadAsFloat(db);
      std::vector<float> got_delta(I), want_delta(I);
      for (int i = 0; i < I; ++i) {
        got_delta[i] = got_db[i] - db0[i];
        want_delta[i] = static_cast<float>(want_db[i] - db0[i]);
      }
      EXPECT_LE(RelativeL2(got_delta, want_delta), tolerance) << "db, the increment";
      EXPECT_LE(RelativeL2(got_db, ToFloat(want_db)), tolerance) << "db";
    } else {
      gemm.BackwardInput(din.data(), d_dout.data(), d_w.data(), N, I, O,
                         with_gelu ? d_pre.data() : nullptr);
    }
    Sync();
    EXPECT_LE(RelativeL2(DownloadAsFloat(din), ToFloat(want)), kBf16Tolerance);
  }

  cudaStream_t stream_ = nullptr;
};

// A small shape with an odd N (N is never a leading dimension; I and O are multiples of 8, which
// Gemm requires of them).
constexpr int kSmallN = 37, kSmallI = 24, kSmallO = 40;
// DiT-XL/2 at batch 4 of 256 tokens.
constexpr int kTokens = 4 * 256, kHidden = 1152, kQkv = 3 * 1152, kMlp = 4 * 1152;

TEST_F(GemmTest, ForwardSmall) {
  CheckForwardBf16(kSmallN, kSmallI, kSmallO, Epilogue::kNone, 100);
  CheckForwardBf16(kSmallN, kSmallI, kSmallO, Epilogue::kBias, 110);
  CheckForwardBf16(kSmallN, kSmallI, kSmallO, Epilogue::kBiasGelu, 120);
}

TEST_F(GemmTest, ForwardFloatSmall) {
  CheckForwardFloat(kSmallN, kSmallI, kSmallO, Epilogue::kNone, 130);
  CheckForwardFloat(kSmallN, kSmallI, kSmallO, Epilogue::kBias, 140);
}

TEST_F(GemmTest, BackwardSmall) {
  CheckBackwardWeight(kSmallN, kSmallI, kSmallO, 150);
  CheckBackwardWeight(kSmallN, kSmallI, kSmallO, 155, /*with_bias=*/true);
  CheckBackwardInput(kSmallN, kSmallI, kSmallO, /*with_gelu=*/false, 160);
  CheckBackwardInput(kSmallN, kSmallI, kSmallO, /*with_gelu=*/true, 170);
  CheckBackwardInput(kSmallN, kSmallI, kSmallO, /*with_gelu=*/true, 175, /*with_bias=*/true);
}

TEST_F(GemmTest, QkvForwardAndBackward) {
  CheckForwardBf16(kTokens, kHidden, kQkv, Epilogue::kBias, 200);
  CheckBackwardWeight(kTokens, kHidden, kQkv, 210);
  CheckBackwardWeight(kTokens, kHidden, kQkv, 215, /*with_bias=*/true);
  CheckBackwardInput(kTokens, kHidden, kQkv, /*with_gelu=*/false, 220);
}

TEST_F(GemmTest, Fc1ForwardBiasGeluAndBackwardWithBias) {
  CheckForwardBf16(kTokens, kHidden, kMlp, Epilogue::kBiasGelu, 300);
  CheckBackwardWeight(kTokens, kHidden, kMlp, 310, /*with_bias=*/true);
}

// fc2's input gradient straight to fc1's pre-activation: fc2 maps I = 4608 → O = 1152.
TEST_F(GemmTest, Fc2BackwardInputThroughGelu) {
  CheckBackwardInput(kTokens, kMlp, kHidden, /*with_gelu=*/true, 400);
  CheckBackwardInput(kTokens, kMlp, kHidden, /*with_gelu=*/true, 405, /*with_bias=*/true);
  CheckBackwardWeight(kTokens, kMlp, kHidden, 410);
}

// accumulate = false (the first micro-batch of a step): dw is written, whatever it held (NaN
// here: a β of 0 does not read it), with and without the bias gradient (which is still added).
TEST_F(GemmTest, OverwritingIgnoresWhatTheGradientHeld) {
  const int N = 96, I = 64, O = 40;
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with the bias" : "weight only");
    const Operands x(N, I, O, 900 + with_bias);
    std::vector<double> want(size_t(O) * I, 0.0), want_db(O, 0.0);
    const std::vector<double> dout = ToDouble(x.dout), in = ToDouble(x.in), w = ToDouble(x.w);
    cpu::LinearBackward<double>(nullptr, want.data(), want_db.data(), dout.data(), in.data(),
                                w.data(), N, I, O);
    DeviceBuffer<bf16> d_dout = UploadBf16(x.dout), d_in = UploadBf16(x.in);
    DeviceBuffer<float> dw(size_t(O) * I), db = UploadFloat(std::vector<float>(O, 0.0f)),
                                           scratch(O);
    Poison(dw);
    Gemm gemm(stream_);
    if (with_bias) {
      gemm.BackwardWeightAndBias(dw.data(), db.data(), d_dout.data(), d_in.data(), N, I, O,
                                 scratch.data(), /*accumulate=*/false);
    } else {
      gemm.BackwardWeight(dw.data(), d_dout.data(), d_in.data(), N, I, O, /*accumulate=*/false);
    }
    Sync();
    EXPECT_LE(RelativeL2(DownloadAsFloat(dw), ToFloat(want)), kFloatTolerance);
    if (with_bias) {
      EXPECT_LE(RelativeL2(DownloadAsFloat(db), ToFloat(want_db)), kFloatTolerance);
    }
  }
}

// Autotuning: a forward's plan is timed on its first call (its output is the reference's,
// whichever candidate won), an accumulating weight gradient's is not (timing would add its
// product several times), one that overwrites is; Tuning() sums what was timed.
TEST_F(GemmTest, AutotuningTimesOnlyCallsThatOverwrite) {
  const int N = kTokens, I = kHidden, O = kQkv;
  Gemm gemm(stream_);
  const Operands x(N, I, O, 950);
  DeviceBuffer<bf16> in = UploadBf16(x.in), w = UploadBf16(x.w), bias = UploadBf16(x.bias);
  DeviceBuffer<bf16> out(size_t(N) * O), d_dout = UploadBf16(x.dout);
  gemm.Forward(out.data(), in.data(), w.data(), bias.data(), N, I, O, Epilogue::kBias);
  Sync();
  EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(ReferenceForward(x, N, I, O, true))),
            kBf16Tolerance);
  GemmTuning t = gemm.Tuning();
  EXPECT_EQ(t.plans, 1);
  EXPECT_LE(t.tuned, 1);  // 0 where cuBLASLt offered one algorithm only
  std::printf(
      "note: autotuning N=%d I=%d O=%d forward: %d of %d plans timed, %d changed, %.3f ms "
      "on the first choice, %.3f tuned\n",
      N, I, O, t.tuned, t.plans, t.changed, t.heuristic_ms, t.tuned_ms);
  if (t.tuned == 1) {
    EXPECT_LE(t.tuned_ms, t.heuristic_ms);
  }

  DeviceBuffer<float> dw(size_t(O) * I);
  Poison(dw);
  gemm.BackwardWeight(dw.data(), d_dout.data(), in.data(), N, I, O, /*accumulate=*/true);
  Sync();
  EXPECT_EQ(gemm.Tuning().tuned, t.tuned) << "an accumulating call was timed";
  gemm.BackwardWeight(dw.data(), d_dout.data(), in.data(), N, I, O, /*accumulate=*/false);
  Sync();
  t = gemm.Tuning();
  EXPECT_EQ(t.plans, 2);
  std::vector<double> want(size_t(O) * I, 0.0);
  const std::vector<double> dout = ToDouble(x.dout), in_d = ToDouble(x.in), w_d = ToDouble(x.w);
  cpu::LinearBackward<double>(nullptr, want.data(), nullptr, dout.data(), in_d.data(), w_d.data(),
                              N, I, O);
  EXPECT_LE(RelativeL2(DownloadAsFloat(dw), ToFloat(want)), kFloatTolerance);
}

// adaLN modulation: c [4, 1152] → 6 · 1152 fp32 vectors.
TEST_F(GemmTest, AdaLnForwardFloat) {
  CheckForwardFloat(4, kHidden, 6 * kHidden, Epilogue::kBias, 500);
}

// A cached plan serves later calls with other buffers: the bias and aux pointers are per call.
TEST_F(GemmTest, CachedPlanTakesNewPointers) {
  const int N = 64, I = 128, O = 96;
  Gemm gemm(stream_);
  for (uint64_t seed : {600, 610, 620}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Operands x(N, I, O, seed);
    const std::vector<double> pre = ReferenceForward(x, N, I, O, /*with_bias=*/true);
    std::vector<double> want(pre.size());
    cpu::GeluForward<double>(want.data(), pre.data(), pre.size());
    DeviceBuffer<bf16> in = UploadBf16(x.in), w = UploadBf16(x.w), bias = UploadBf16(x.bias);
    DeviceBuffer<bf16> out(size_t(N) * O), aux(size_t(N) * O);
    Poison(out);
    Poison(aux);
    gemm.Forward(out.data(), in.data(), w.data(), bias.data(), N, I, O, Epilogue::kBiasGelu,
                 aux.data());
    Sync();
    EXPECT_LE(RelativeL2(DownloadAsFloat(out), ToFloat(want)), kBf16Tolerance);
    EXPECT_LE(RelativeL2(DownloadAsFloat(aux), ToFloat(pre)), kBf16Tolerance);
  }
}

// Batched products, every combination of transposes, bf16 and fp32 results, against a double
// loop over the items: c_i = alpha · op(a_i) · op(b_i). Shapes of attention's per-head GEMMs
// (m, n, k among T = 64 and hd = 72) and unequal m, n, k so a swapped dimension cannot pass.
TEST_F(GemmTest, BatchedEveryTranspose) {
  const int m = 64, n = 72, k = 40, batch = 5;
  const float alpha = 0.375f;
  Gemm gemm(stream_);
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      const std::vector<float> a = RandomBf16(size_t(batch) * m * k, 700 + 2 * ta + tb, 1.0);
      const std::vector<float> b = RandomBf16(size_t(batch) * k * n, 710 + 2 * ta + tb, 1.0);
      std::vector<double> want(size_t(batch) * m * n, 0.0);
      for (int i = 0; i < batch; ++i) {
        const float* ai = a.data() + size_t(i) * m * k;
        const float* bi = b.data() + size_t(i) * k * n;
        for (int r = 0; r < m; ++r) {
          for (int c = 0; c < n; ++c) {
            double sum = 0;
            for (int j = 0; j < k; ++j)
              sum += double(ta ? ai[j * m + r] : ai[r * k + j]) *
                     double(tb ? bi[c * k + j] : bi[j * n + c]);
            want[(size_t(i) * m + r) * n + c] = alpha * sum;
          }
        }
      }
      DeviceBuffer<bf16> d_a = UploadBf16(a), d_b = UploadBf16(b);
      DeviceBuffer<bf16> c_bf16(want.size());
      DeviceBuffer<float> c_float(want.size());
      Poison(c_bf16);
      Poison(c_float);
      gemm.Batched(c_bf16.data(), d_a.data(), ta, d_b.data(), tb, m, n, k, batch, alpha);
      gemm.Batched(c_float.data(), d_a.data(), ta, d_b.data(), tb, m, n, k, batch, alpha);
      Sync();
      EXPECT_LE(RelativeL2(DownloadAsFloat(c_bf16), ToFloat(want)), kBf16Tolerance);
      EXPECT_LE(RelativeL2(DownloadAsFloat(c_float), ToFloat(want)), kFloatTolerance);
    }
  }
}

// I = 20 is not a multiple of 8: the launcher refuses the shape by name.
void ForwardWithMisalignedI() {
  Gemm gemm(nullptr);
  DeviceBuffer<bf16> in(4 * 20), w(8 * 20), out(4 * 8);
  gemm.Forward(out.data(), in.data(), w.data(), nullptr, 4, 20, 8, Epilogue::kNone);
}

TEST(GemmDeathTest, MisalignedLeadingDimensionFails) {
  DT_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(ForwardWithMisalignedI(), "multiples of 8");
}

}  // namespace
}  // namespace difftrain::cuda
