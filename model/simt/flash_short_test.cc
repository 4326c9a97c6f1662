// The short-sequence flash kernels (model/cuda/flash_short_kernels.h: one warp a sequence and
// head, at most 16 queries and keys) on the CPU emulator against the general flash kernels
// (model/cuda/flash_kernels.h), which model/simt/flash_attention_test.cc checks against the CPU
// reference: the same out, lse, dq, dk and dv bit for bit, every element written (outputs start
// as bf16 NaN), over dense and interleaved (Latte's frame-major video) layouts, sequences of 16
// rows and fewer, every padded head dim, and blocks whose last warps have no sequence; and the
// column sums the short backward writes (qkv's bias gradient) against those of its gradients.
// Their ldmatrix reads must be free of bank conflicts. Before each comparison the general kernels'
// out is checked against the reference's, so that two kernels agreeing on a wrong answer fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/cpu/attention.h"
#include "model/cuda/flash_kernels.h"
#include "model/cuda/flash_short_kernels.h"
#include "model/simt/simt.h"
#include "model/simt/testing.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

using simt::Bf16ToFloat;
using simt::FloatToBf16;
using simt::RelativeL2;

constexpr uint16_t kNaN = 0xFFFF;

// S sequences of T rows, D features over H heads; interleaved: a frame-major video of
// S / tokens samples, each token a sequence across T frames (flash::Operands::inner = tokens).
struct Shape {
  int S, T, D, H;
  int tokens = 1;  // 1: dense, sequence after sequence
};

std::vector<uint16_t> Random(size_t n, uint64_t seed) {
  Rng rng(seed, RngStream::kData);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v)
    x = FloatToBf16(static_cast<float>(rng.Normal() * 1.5));
  return v;
}

struct Results {
  std::vector<uint16_t> out, dqkv;
  std::vector<float> lse;
  std::vector<float> sums;  // the short backward's column sums of dqkv, [S, 3·D]
};

// The operands over a packed qkv [S·T, 3·D] (row t of dense sequence b at b·T + t; interleaved,
// sample s's frame f, token n at (s·T + f)·tokens + n, the frame-major video).
flash::Operands OperandsOf(const Shape& s, const std::vector<uint16_t>& qkv) {
  const size_t row = 3 * size_t(s.D), stride = row * s.tokens;
  flash::Operands in{qkv.data(),
                     qkv.data() + s.D,
                     qkv.data() + 2 * s.D,
                     stride,
                     stride,
                     s.T,
                     s.T,
                     s.D,
                     s.H,
                     1.0f / std::sqrt(float(s.D / s.H))};
  if (s.tokens > 1) {
    in.inner = s.tokens;
    in.q_inner = in.kv_inner = row;
    in.o_stride = size_t(s.tokens) * s.D;
    in.o_inner = s.D;
  }
  return in;
}

// short_kernels: ShortForward and ShortBackward; otherwise Forward, Delta, BackwardDq and
// BackwardDkv with one stage. The backward of either reads the general forward's out and lse
// (`forward`), so that each kernel is compared on the same inputs.
Results Run(const Shape& s, const std::vector<uint16_t>& qkv, const std::vector<uint16_t>& dout,
            bool short_kernels, const Results* forward = nullptr) {
  const size_t rows = size_t(s.S) * s.T;
  const flash::Operands in = OperandsOf(s, qkv);
  Results r{std::vector<uint16_t>(rows * s.D, kNaN),
            std::vector<uint16_t>(rows * 3 * s.D, kNaN),
            std::vector<float>(size_t(s.S) * s.H * s.T, NAN),
            {}};
  const std::vector<uint16_t>& out = forward != nullptr ? forward->out : r.out;
  const std::vector<float>& lse = forward != nullptr ? forward->lse : r.lse;
  std::vector<float> delta(r.lse.size(), NAN);
  flash::BackwardArgs back{in,
                           dout.data(),
                           lse.data(),
                           delta.data(),
                           r.dqkv.data(),
                           r.dqkv.data() + s.D,
                           r.dqkv.data() + 2 * s.D};
  back.out = out.data();
  if (short_kernels) {  // every element written (NaN otherwise)
    r.sums.assign(size_t(s.S) * 3 * s.D, NAN);
    back.dq_sums = r.sums.data();
    back.dk_sums = r.sums.data() + s.D;
    back.dv_sums = r.sums.data() + 2 * s.D;
    back.sums_stride = 3 * size_t(s.D);
  }
  flash::WithPaddedHeadDim(s.D / s.H, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    using P = simt::Primitives;
    if (short_kernels) {
      const simt::Dim3 grid{static_cast<int>(flash::ShortBlocks(s.S, s.H)), 1, 1};
      simt::Launch(grid, flash::kThreads, flash::ShortForwardSmemBytes<HDP>(), [&] {
        flash::ShortForward<HDP, P>({in, r.out.data(), r.lse.data()}, s.S);
      });
      simt::Launch(grid, flash::kThreads, flash::ShortBackwardSmemBytes<HDP>(),
                   [&] { flash::ShortBackward<HDP, P>(back, s.S); });
      return;
    }
    const simt::Dim3 grid{1, s.H, s.S};
    simt::Launch(grid, flash::kThreads, flash::ForwardSmemBytes<HDP>(), [&] {
      flash::Forward<HDP, P>({in, r.out.data(), r.lse.data()});
    });
    flash::DeltaArgs delta_args{dout.data(), out.data(), delta.data(), s.S, s.T, s.D, s.H};
    delta_args.inner = in.inner;
    delta_args.o_stride = in.o_stride;
    delta_args.o_inner = in.o_inner;
    simt::Launch({static_cast<int>((rows + flash::kWarps - 1) / flash::kWarps), 1, 1},
                 flash::kThreads, flash::DeltaSmemBytes(s.D), [&] { flash::Delta<P>(delta_args); });
    simt::Launch(grid, flash::kThreads, flash::DqSmemBytes<HDP>(),
                 [&] { flash::BackwardDq<HDP, P>(back); });
    simt::Launch(grid, flash::kThreads, flash::DkvSmemBytes<HDP>(),
                 [&] { flash::BackwardDkv<HDP, P>(back); });
  });
  return r;
}

// The reference's out (double, on the same bf16 inputs) of a dense shape.
std::vector<double> ReferenceOut(const Shape& s, const std::vector<uint16_t>& qkv) {
  std::vector<double> x(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i)
    x[i] = Bf16ToFloat(qkv[i]);
  std::vector<double> out(size_t(s.S) * s.T * s.D), probs(size_t(s.S) * s.H * s.T * s.T);
  cpu::AttentionForward(out.data(), probs.data(), x.data(), 3 * s.D, x.data() + s.D,
                        x.data() + 2 * s.D, 3 * s.D, s.S, s.T, s.T, s.D, s.H);
  return out;
}

void ExpectSameBits(const Shape& s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "sequences " << s.S << " of T=" << s.T << ", hd " << s.D / s.H
                                  << " × " << s.H << " heads"
                                  << (s.tokens > 1 ? ", interleaved" : ""));
  const size_t rows = size_t(s.S) * s.T;
  const std::vector<uint16_t> qkv = Random(rows * 3 * s.D, seed);
  const std::vector<uint16_t> dout = Random(rows * s.D, seed + 1);

  const Results general = Run(s, qkv, dout, /*short_kernels=*/false);
  if (s.tokens == 1) {
    std::vector<double> got(general.out.size());
    for (size_t i = 0; i < got.size(); ++i)
      got[i] = Bf16ToFloat(general.out[i]);
    EXPECT_LT(RelativeL2(got, ReferenceOut(s, qkv)), 1e-2) << "the general kernels' out";
  }
  simt::ResetCounters();
  const Results forward = Run(s, qkv, dout, /*short_kernels=*/true);
  const Results backward = Run(s, qkv, dout, /*short_kernels=*/true, &general);
  const simt::Counters counters = simt::ReadCounters();
  EXPECT_GT(counters.ldmatrix_matrices, 0u);
  EXPECT_EQ(counters.ldmatrix_extra_wavefronts, 0u) << "of " << counters.ldmatrix_matrices;

  EXPECT_EQ(std::count(general.out.begin(), general.out.end(), kNaN), 0);
  EXPECT_EQ(std::count(general.dqkv.begin(), general.dqkv.end(), kNaN), 0);
  EXPECT_TRUE(forward.out == general.out) << "out";
  EXPECT_EQ(std::memcmp(forward.lse.data(), general.lse.data(), general.lse.size() * 4), 0)
      << "lse";
  EXPECT_TRUE(backward.dqkv == general.dqkv) << "dq, dk, dv";
  for (const int part : {0, 1, 2}) {  // which of dq, dk, dv differs, if any
    size_t differ = 0;
    for (size_t r = 0; r < rows; ++r)
      for (int c = 0; c < s.D; ++c) {
        const size_t i = r * 3 * s.D + part * s.D + c;
        differ += backward.dqkv[i] != general.dqkv[i];
      }
    EXPECT_EQ(differ, 0u) << "elements of "
                          << "qkv"[part] << "'s gradient";
  }

  // The column sums (qkv's bias gradient, added up over the sequences' rows) against those of the
  // bf16 gradients the kernel stored: their rounding (~2⁻⁹ an element) is all that differs,
  // measured against the size of each part (dk's sums are zero in exact arithmetic).
  for (const int part : {0, 1, 2}) {
    std::vector<double> got(s.D, 0.0), want(s.D, 0.0);
    double size = 0;
    for (int b = 0; b < s.S; ++b)
      for (int c = 0; c < s.D; ++c)
        got[c] += backward.sums[size_t(b) * 3 * s.D + part * s.D + c];
    for (size_t r = 0; r < rows; ++r) {
      for (int c = 0; c < s.D; ++c) {
        const double v = Bf16ToFloat(backward.dqkv[r * 3 * s.D + part * s.D + c]);
        want[c] += v;
        size += v * v;
      }
    }
    double error = 0;
    for (int c = 0; c < s.D; ++c)
      error += (got[c] - want[c]) * (got[c] - want[c]);
    EXPECT_LT(std::sqrt(error / size), 2e-3) << "qkv"[part] << "'s column sums";
  }
}

// Latte's 16 frames at hd 64, 5 sequences × 2 heads: three blocks, the last with two warps idle.
TEST(FlashShortEmulated, SixteenRowsHeadDim64) {
  ExpectSameBits({5, 16, 128, 2}, 31);
}

// hd 72 (padded to 80, DiT-XL/2's and Latte-XL/2's), 8 frames.
TEST(FlashShortEmulated, EightRowsHeadDim72) {
  ExpectSameBits({3, 8, 144, 2}, 32);
}

// hd 128 (the general kernels' 32-row inner tiles), 5 rows; and hd 8 over 3 heads, 13 rows.
TEST(FlashShortEmulated, HeadDims128And8) {
  ExpectSameBits({2, 5, 256, 2}, 33);
  ExpectSameBits({3, 13, 24, 3}, 34);
}

// A single row: the softmax over one key.
TEST(FlashShortEmulated, OneRow) {
  ExpectSameBits({4, 1, 64, 1}, 35);
}

// Latte's temporal attention in place: 2 samples of 3 tokens across 16 frames (6 sequences),
// rows a frame apart.
TEST(FlashShortEmulated, AcrossFramesOfAVideo) {
  ExpectSameBits({6, 16, 128, 2, /*tokens=*/3}, 36);
}

}  // namespace
}  // namespace difftrain
