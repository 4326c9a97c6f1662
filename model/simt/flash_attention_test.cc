// The GPU's flash-attention kernels (model/cuda/flash_kernels.h) run on the CPU emulator
// against the CPU reference attention (model/cpu/attention.h), in double, on the same
// bf16-rounded inputs: every output element, the log-sum-exp, dQ, dK and dV. Outputs start as
// bf16 NaN so an element the kernels never write fails; their ldmatrix reads must be free of
// shared-memory bank conflicts. The kernels run with one stage and double-buffered (two stages:
// cp.async copies, which the emulator lands only at their wait), which must agree bit for bit. This
// is where the kernels' fragment arithmetic is checked on every machine;
// model/cuda/attention_test.cc runs the compiled kernels on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/cpu/attention.h"
#include "model/cuda/flash_kernels.h"
#include "model/simt/simt.h"
#include "model/simt/testing.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

using simt::Bf16ToFloat;
using simt::FloatToBf16;
using simt::RelativeL2;

constexpr uint16_t kNaN = 0xFFFF;

struct Shape {
  int B, Tq, Tk, D, H;
  bool packed;  // self-attention over one qkv [B, T, 3·D]; else q [B, Tq, D], kv [B, Tk, 2·D]
};

// bf16 values: their bits and the same values as doubles.
struct Bf16Tensor {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};

Bf16Tensor Random(size_t n, uint64_t seed, double scale) {
  Rng rng(seed, RngStream::kData);
  Bf16Tensor t{std::vector<uint16_t>(n), std::vector<double>(n)};
  for (size_t i = 0; i < n; ++i) {
    t.bits[i] = FloatToBf16(static_cast<float>(rng.Normal() * scale));
    t.values[i] = Bf16ToFloat(t.bits[i]);
  }
  return t;
}

std::vector<double> ToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    v[i] = Bf16ToFloat(bits[i]);
  return v;
}

// Runs one kernel body of HDP on the emulator over grid (⌈rows/block_rows⌉, H, B).
template <int HDP, class Args>
void Run(void (*body)(const Args&), const Args& args, int rows, int H, int B, size_t smem,
         int block_rows = flash::kRows) {
  simt::Launch({(rows + block_rows - 1) / block_rows, H, B}, flash::kThreads, smem,
               [&] { body(args); });
}

void ExpectMatchesReference(const Shape& s, uint64_t seed) {
  const int hd = s.D / s.H;
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " Tq=" << s.Tq << " Tk=" << s.Tk << " hd=" << hd
                                  << " H=" << s.H << (s.packed ? " packed qkv" : " q and kv"));
  // Operands: packed qkv, or q and a text-like kv; row strides and column offsets of q, k, v.
  const int ldq = s.packed ? 3 * s.D : s.D, ldkv = s.packed ? 3 * s.D : 2 * s.D;
  const Bf16Tensor x = Random(size_t(s.B) * s.Tq * ldq, seed, 1.0);
  const Bf16Tensor y = s.packed ? Bf16Tensor{} : Random(size_t(s.B) * s.Tk * ldkv, seed + 1, 1.0);
  const Bf16Tensor& kv = s.packed ? x : y;
  const size_t k_col = s.packed ? s.D : 0, v_col = s.packed ? 2 * s.D : s.D;
  const Bf16Tensor dout = Random(size_t(s.B) * s.Tq * s.D, seed + 2, 1.0);

  // The reference, in double.
  std::vector<double> out_ref(size_t(s.B) * s.Tq * s.D), probs(size_t(s.B) * s.H * s.Tq * s.Tk);
  cpu::AttentionForward(out_ref.data(), probs.data(), x.values.data(), ldq,
                        kv.values.data() + k_col, kv.values.data() + v_col, ldkv, s.B, s.Tq, s.Tk,
                        s.D, s.H);
  std::vector<double> dq_ref(x.values.size()), dkv_ref(kv.values.size());
  cpu::AttentionBackward(dq_ref.data(), dkv_ref.data() + k_col, dkv_ref.data() + v_col,
                         dout.values.data(), x.values.data(), ldq, kv.values.data() + k_col,
                         kv.values.data() + v_col, ldkv, probs.data(), s.B, s.Tq, s.Tk, s.D, s.H);
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> lse_ref(size_t(s.B) * s.H * s.Tq);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      for (int i = 0; i < s.Tq; ++i) {
        double sum = 0;
        for (int j = 0; j < s.Tk; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) {
            dot += x.values[(size_t(b) * s.Tq + i) * ldq + h * hd + d] *
                   kv.values[(size_t(b) * s.Tk + j) * ldkv + k_col + h * hd + d];
          }
          sum += std::exp(dot * scale);
        }
        lse_ref[(size_t(b) * s.H + h) * s.Tq + i] = std::log(sum);
      }
    }
  }

  // The kernels.
  const flash::Operands in{x.bits.data(),
                           kv.bits.data() + k_col,
                           kv.bits.data() + v_col,
                           size_t(ldq),
                           size_t(ldkv),
                           s.Tq,
                           s.Tk,
                           s.D,
                           s.H,
                           static_cast<float>(scale)};
  struct Outputs {
    std::vector<uint16_t> out;
    std::vector<float> lse;
    std::vector<uint16_t> dq, dkv_own;
    // The same gradients with dQ from the stored score gradients (BackwardDkv storing dSᵀ, then
    // BackwardDqStored), and the column sums' rows those kernels write (dq's, dk's, dv's: each
    // [B·⌈T/64⌉, D]).
    std::vector<uint16_t> dq_stored, dkv_stored_own;
    std::vector<float> sums[3];
  };
  // The three kernels with kStages stages, every output starting as NaN.
  auto run = [&](auto stages) {
    constexpr int kStages = decltype(stages)::value;
    Outputs o{std::vector<uint16_t>(out_ref.size(), kNaN),
              std::vector<float>(lse_ref.size(), NAN),
              std::vector<uint16_t>(x.bits.size(), kNaN),
              std::vector<uint16_t>(s.packed ? 0 : kv.bits.size(), kNaN),
              std::vector<uint16_t>(x.bits.size(), kNaN),
              std::vector<uint16_t>(s.packed ? 0 : kv.bits.size(), kNaN),
              {}};
    std::vector<uint16_t>& out = o.out;
    std::vector<float>& lse = o.lse;
    std::vector<uint16_t>& dq = o.dq;
    std::vector<uint16_t>& dkv = s.packed ? o.dq : o.dkv_own;
    std::vector<float> delta(lse.size());
    flash::WithPaddedHeadDim(hd, [&](auto padded) {
      constexpr int HDP = decltype(padded)::value;
      Run<HDP>(&flash::Forward<HDP, simt::Primitives, kStages>,
               flash::ForwardArgs{in, out.data(), lse.data()}, s.Tq, s.H, s.B,
               flash::ForwardSmemBytes<HDP, kStages>());
      // delta = Σ_d dout·out over each head, from the bf16 out: the Delta kernel, against the
      // sum in double (every element starts as NaN).
      std::fill(delta.begin(), delta.end(), NAN);
      simt::Launch({(s.B * s.Tq + flash::kWarps - 1) / flash::kWarps, 1, 1}, flash::kThreads,
                   flash::DeltaSmemBytes(s.D), [&] {
                     flash::Delta<simt::Primitives>(
                         {dout.bits.data(), out.data(), delta.data(), s.B, s.Tq, s.D, s.H});
                   });
      std::vector<double> delta_got(delta.begin(), delta.end()), delta_want(delta.size());
      for (int b = 0; b < s.B; ++b) {
        for (int i = 0; i < s.Tq; ++i) {
          for (int h = 0; h < s.H; ++h) {
            double sum = 0;
            for (int d = 0; d < hd; ++d) {
              const size_t e = (size_t(b) * s.Tq + i) * s.D + h * hd + d;
              sum += dout.values[e] * Bf16ToFloat(out[e]);
            }
            delta_want[(size_t(b) * s.H + h) * s.Tq + i] = sum;
          }
        }
      }
      EXPECT_LE(RelativeL2(delta_got, delta_want), 1e-6) << "delta";
      const flash::BackwardArgs args{in,        dout.bits.data(),   lse.data(),        delta.data(),
                                     dq.data(), dkv.data() + k_col, dkv.data() + v_col};
      Run<HDP>(&flash::BackwardDq<HDP, simt::Primitives, kStages>, args, s.Tq, s.H, s.B,
               flash::DqSmemBytes<HDP, kStages>());
      Run<HDP>(&flash::BackwardDkv<HDP, simt::Primitives, kStages>, args, s.Tk, s.H, s.B,
               flash::DkvSmemBytes<HDP, kStages>());
      // dSᵀ starts as NaN: BackwardDqStored reading an element BackwardDkv did not write would
      // make dq NaN.
      std::vector<uint16_t>& dkv_stored = s.packed ? o.dq_stored : o.dkv_stored_own;
      flash::BackwardArgs stored = args;
      stored.dq = o.dq_stored.data();
      stored.dk = dkv_stored.data() + k_col;
      stored.dv = dkv_stored.data() + v_col;
      stored.ds_rows = flash::StoredScoresRows(s.Tk);
      stored.ds_cols = flash::StoredScoresRows(s.Tq);
      std::vector<uint16_t> ds(size_t(s.B) * s.H * stored.ds_rows * stored.ds_cols, kNaN);
      stored.ds = ds.data();
      const int q_blocks = s.B * ((s.Tq + flash::kRows - 1) / flash::kRows);
      const int k_blocks = s.B * ((s.Tk + flash::kRows - 1) / flash::kRows);
      o.sums[0].assign(size_t(q_blocks) * s.D, NAN);
      o.sums[1].assign(size_t(k_blocks) * s.D, NAN);
      o.sums[2].assign(size_t(k_blocks) * s.D, NAN);
      stored.dq_sums = o.sums[0].data();
      stored.dk_sums = o.sums[1].data();
      stored.dv_sums = o.sums[2].data();
      stored.sums_stride = s.D;
      Run<HDP>(&flash::BackwardDkv<HDP, simt::Primitives, kStages, /*kStoreScores=*/true>, stored,
               s.Tk, s.H, s.B, flash::DkvSmemBytes<HDP, kStages>());
      Run<HDP>(&flash::BackwardDqStored<HDP, simt::Primitives, kStages>, stored, s.Tq, s.H, s.B,
               flash::DqStoredSmemBytes<HDP, kStages>());
    });
    return o;
  };
  simt::ResetCounters();
  const Outputs one = run(std::integral_constant<int, 1>());
  const Outputs two = run(std::integral_constant<int, 2>());
  // Double-buffered loads change when tiles arrive, not what is computed: the same bits.
  EXPECT_TRUE(one.out == two.out && one.dq == two.dq && one.dkv_own == two.dkv_own)
      << "the two-stage kernels' outputs differ from the one-stage kernels'";
  EXPECT_TRUE(one.dq_stored == two.dq_stored && one.dkv_stored_own == two.dkv_stored_own)
      << "dQ from the stored score gradients: two stages differ from one";
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(std::memcmp(one.sums[p].data(), two.sums[p].data(), one.sums[p].size() * 4), 0)
        << "column sums " << p << ": two stages differ from one";
  }
  EXPECT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float)), 0)
      << "lse";
  // The forward with two m-tiles a warp, with one stage and two: each row's arithmetic is the
  // one-m-tile kernel's, so the same bits.
  flash::WithPaddedHeadDim(hd, [&](auto padded) {
    constexpr int HDP = decltype(padded)::value;
    const auto wide = [&](auto stages) {
      constexpr int kStages = decltype(stages)::value;
      std::vector<uint16_t> out(out_ref.size(), kNaN);
      std::vector<float> lse(lse_ref.size(), NAN);
      Run<HDP>(&flash::Forward<HDP, simt::Primitives, kStages, 2>,
               flash::ForwardArgs{in, out.data(), lse.data()}, s.Tq, s.H, s.B,
               flash::ForwardSmemBytes<HDP, kStages, 2>(), 2 * flash::kRows);
      EXPECT_TRUE(out == one.out) << "two m-tiles a warp, " << kStages << " stages: out";
      EXPECT_EQ(std::memcmp(lse.data(), one.lse.data(), lse.size() * sizeof(float)), 0)
          << "two m-tiles a warp, " << kStages << " stages: lse";
    };
    wide(std::integral_constant<int, 1>());
    wide(std::integral_constant<int, 2>());
  });
  const std::vector<uint16_t>& out = one.out;
  const std::vector<float>& lse = one.lse;
  const std::vector<uint16_t>& dq = one.dq;
  const std::vector<uint16_t>& dkv = s.packed ? one.dq : one.dkv_own;

  // Every ldmatrix of the three kernels free of bank conflicts (the tiles' padded rows).
  const simt::Counters counters = simt::ReadCounters();
  EXPECT_GT(counters.ldmatrix_matrices, 0u);
  EXPECT_EQ(counters.ldmatrix_extra_wavefronts, 0u) << "of " << counters.ldmatrix_matrices;

  EXPECT_LT(RelativeL2(ToDouble(out), out_ref), 1e-2) << "out";
  std::vector<double> lse_got(lse.begin(), lse.end());
  EXPECT_LT(RelativeL2(lse_got, lse_ref), 1e-5) << "lse";
  // The gradients of q, k and v, each read back from its own columns.
  auto columns = [&](const std::vector<double>& v, int T, int ld, size_t col) {
    std::vector<double> r;
    for (int bt = 0; bt < s.B * T; ++bt)
      r.insert(r.end(), v.begin() + size_t(bt) * ld + col, v.begin() + size_t(bt) * ld + col + s.D);
    return r;
  };
  const std::vector<double> dq_got = ToDouble(dq), dkv_got = ToDouble(dkv);
  EXPECT_LT(RelativeL2(columns(dq_got, s.Tq, ldq, 0), columns(dq_ref, s.Tq, ldq, 0)), 1e-2) << "dq";
  EXPECT_LT(RelativeL2(columns(dkv_got, s.Tk, ldkv, k_col), columns(dkv_ref, s.Tk, ldkv, k_col)),
            1e-2)
      << "dk";
  EXPECT_LT(RelativeL2(columns(dkv_got, s.Tk, ldkv, v_col), columns(dkv_ref, s.Tk, ldkv, v_col)),
            1e-2)
      << "dv";

  // Storing dSᵀ leaves dK and dV as they were, bit for bit; dQ from it against the reference.
  const std::vector<double> dq_stored = ToDouble(one.dq_stored);
  const std::vector<double> dkv_stored = ToDouble(s.packed ? one.dq_stored : one.dkv_stored_own);
  for (const size_t col : {k_col, v_col}) {
    EXPECT_TRUE(columns(dkv_stored, s.Tk, ldkv, col) == columns(dkv_got, s.Tk, ldkv, col))
        << (col == k_col ? "dk" : "dv") << " with dSᵀ stored";
  }
  EXPECT_LT(RelativeL2(columns(dq_stored, s.Tq, ldq, 0), columns(dq_ref, s.Tq, ldq, 0)), 1e-2)
      << "dq from the stored score gradients";
  // And close to the recomputing kernel's: the same bf16 dS (up to the fp32 order of S and dP's
  // products, K·Qᵀ there, Q·Kᵀ here), so well inside bf16's rounding of dq.
  EXPECT_LT(RelativeL2(columns(dq_stored, s.Tq, ldq, 0), columns(dq_got, s.Tq, ldq, 0)), 5e-3)
      << "dq from the stored score gradients against BackwardDq's";

  // The column sums' rows, added up, against the column sums of the gradients the kernels
  // stored (bf16: their rounding, ~2⁻⁹ an element, is all that differs) and of the reference;
  // every element written (NaN otherwise), and rows past T (partial blocks) adding nothing.
  // Errors are measured against the gradient's own size (its Frobenius norm): dk's column sums
  // are zero in exact arithmetic (Σ_j dS_ij = Σ_j P_ij·dP_ij − delta_i = 0: a key bias shifts
  // every score of a row alike), so only rounding is left of them.
  const auto column_sums = [&](const std::vector<double>& v, int T, int ld, size_t col) {
    std::vector<double> sums(s.D, 0.0);
    for (int bt = 0; bt < s.B * T; ++bt)
      for (int c = 0; c < s.D; ++c)
        sums[c] += v[size_t(bt) * ld + col + c];
    return sums;
  };
  const auto norm = [&](const std::vector<double>& v, int T, int ld, size_t col) {
    double sum = 0;
    for (int bt = 0; bt < s.B * T; ++bt)
      for (int c = 0; c < s.D; ++c)
        sum += v[size_t(bt) * ld + col + c] * v[size_t(bt) * ld + col + c];
    return std::sqrt(sum);
  };
  const auto error = [](const std::vector<double>& a, const std::vector<double>& b) {
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i)
      sum += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(sum);
  };
  const struct {
    const char* name;
    const std::vector<double>& got;
    const std::vector<double>& ref;
    int T, ld;
    size_t col;
  } parts[] = {{"dq", dq_stored, dq_ref, s.Tq, ldq, 0},
               {"dk", dkv_stored, dkv_ref, s.Tk, ldkv, k_col},
               {"dv", dkv_stored, dkv_ref, s.Tk, ldkv, v_col}};
  for (int p = 0; p < 3; ++p) {
    const auto& [name, got, ref, T, ld, col] = parts[p];
    std::vector<double> sums(s.D, 0.0);
    for (size_t i = 0; i < one.sums[p].size(); ++i)
      sums[i % s.D] += one.sums[p][i];
    const double size = norm(ref, T, ld, col);
    EXPECT_LT(error(sums, column_sums(got, T, ld, col)) / size, 2e-3)
        << name << "'s column sums against those of the stored " << name;
    EXPECT_LT(error(sums, column_sums(ref, T, ld, col)) / size, 1e-2)
        << name << "'s column sums against the reference's";
  }
}

// DiT-XL/2's head dim (72, padded to 80) over more than two tiles and a partial one.
TEST(FlashAttentionEmulated, SelfAttentionHeadDim72) {
  ExpectMatchesReference({1, 130, 130, 144, 2, true}, 1);
}

// Cross-attention: fewer keys than a tile, queries over two tiles, head dim 64.
TEST(FlashAttentionEmulated, CrossAttentionHeadDim64) {
  ExpectMatchesReference({2, 100, 37, 128, 2, false}, 2);
}

// Head dim 128: the 32-row inner tiles; more keys than queries.
TEST(FlashAttentionEmulated, HeadDim128) {
  ExpectMatchesReference({1, 20, 70, 128, 1, false}, 3);
}

// Head dim 8 (padded to 64) over three heads, and Latte's temporal attention: 8 frames.
TEST(FlashAttentionEmulated, SmallHeadsAndShortSequences) {
  ExpectMatchesReference({2, 20, 20, 24, 3, true}, 4);
  ExpectMatchesReference({3, 8, 8, 128, 2, true}, 5);
}

// Latte's temporal attention read straight from the frame-major video (each token a sequence
// across frames, rows a frame apart: Operands::inner) gives the bits of the dense kernels run on
// the token-major copy, with one stage and two: out, lse, delta, dq, dk and dv. B = 2 samples of
// F = 5 frames of T = 3 tokens, D = 48 over 2 heads.
TEST(FlashAttentionEmulated, AcrossFramesGivesTheTokenMajorBits) {
  const int B = 2, F = 5, T = 3, D = 48, H = 2, hd = D / H, S = B * T;
  const size_t n = size_t(B) * F * T;
  const Bf16Tensor qkv = Random(n * 3 * D, 21, 1.0), dout = Random(n * D, 22, 1.0);
  // Row (b, f, t) of a frame-major [B, F, T, W] tensor ↔ row (b, t, f) of the token-major one.
  const auto to_token_major = [&](const std::vector<uint16_t>& v, int W) {
    std::vector<uint16_t> r(v.size());
    for (int b = 0; b < B; ++b)
      for (int f = 0; f < F; ++f)
        for (int t = 0; t < T; ++t)
          std::memcpy(&r[((size_t(b) * T + t) * F + f) * W], &v[((size_t(b) * F + f) * T + t) * W],
                      W * sizeof(uint16_t));
    return r;
  };
  const std::vector<uint16_t> qkv_t = to_token_major(qkv.bits, 3 * D);
  const std::vector<uint16_t> dout_t = to_token_major(dout.bits, D);
  const float scale = 1.0f / std::sqrt(float(hd));

  struct Results {
    std::vector<uint16_t> out, dqkv;
    std::vector<float> lse, delta;
  };
  // interleaved: the frame-major operands; otherwise the token-major copy, dense.
  const auto run = [&](bool interleaved, auto stages) {
    constexpr int kStages = decltype(stages)::value;
    const std::vector<uint16_t>& x = interleaved ? qkv.bits : qkv_t;
    const std::vector<uint16_t>& g = interleaved ? dout.bits : dout_t;
    flash::Operands in{
        x.data(), x.data() + D, x.data() + 2 * D, 3 * size_t(D), 3 * size_t(D), F, F, D, H, scale};
    flash::DeltaArgs delta_args{g.data(), nullptr, nullptr, S, F, D, H};
    if (interleaved) {
      in.q_stride = in.kv_stride = size_t(T) * 3 * D;
      in.inner = delta_args.inner = T;
      in.q_inner = in.kv_inner = 3 * size_t(D);
      in.o_stride = delta_args.o_stride = size_t(T) * D;
      in.o_inner = delta_args.o_inner = D;
    }
    Results r{std::vector<uint16_t>(n * D, kNaN), std::vector<uint16_t>(n * 3 * D, kNaN),
              std::vector<float>(size_t(S) * H * F, NAN),
              std::vector<float>(size_t(S) * H * F, NAN)};
    delta_args.out = r.out.data();
    delta_args.delta = r.delta.data();
    flash::WithPaddedHeadDim(hd, [&](auto padded) {
      constexpr int HDP = decltype(padded)::value;
      difftrain::Run<HDP>(&flash::Forward<HDP, simt::Primitives, kStages>,
                          flash::ForwardArgs{in, r.out.data(), r.lse.data()}, F, H, S,
                          flash::ForwardSmemBytes<HDP, kStages>());
      simt::Launch({(S * F + flash::kWarps - 1) / flash::kWarps, 1, 1}, flash::kThreads,
                   flash::DeltaSmemBytes(D), [&] { flash::Delta<simt::Primitives>(delta_args); });
      const flash::BackwardArgs args{in,
                                     g.data(),
                                     r.lse.data(),
                                     r.delta.data(),
                                     r.dqkv.data(),
                                     r.dqkv.data() + D,
                                     r.dqkv.data() + 2 * D};
      difftrain::Run<HDP>(&flash::BackwardDq<HDP, simt::Primitives, kStages>, args, F, H, S,
                          flash::DqSmemBytes<HDP, kStages>());
      difftrain::Run<HDP>(&flash::BackwardDkv<HDP, simt::Primitives, kStages>, args, F, H, S,
                          flash::DkvSmemBytes<HDP, kStages>());
    });
    if (interleaved) {
      r.out = to_token_major(r.out, D);
      r.dqkv = to_token_major(r.dqkv, 3 * D);
    }
    return r;
  };
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const bool two : {false, true}) {
    SCOPED_TRACE(two ? "two stages" : "one stage");
    const Results dense = two ? run(false, std::integral_constant<int, 2>())
                              : run(false, std::integral_constant<int, 1>());
    const Results across = two ? run(true, std::integral_constant<int, 2>())
                               : run(true, std::integral_constant<int, 1>());
    EXPECT_EQ(std::count(dense.out.begin(), dense.out.end(), kNaN), 0);
    EXPECT_EQ(std::count(dense.dqkv.begin(), dense.dqkv.end(), kNaN), 0);
    EXPECT_TRUE(across.out == dense.out) << "out";
    EXPECT_TRUE(same(across.lse, dense.lse)) << "lse";
    EXPECT_TRUE(same(across.delta, dense.delta)) << "delta";
    EXPECT_TRUE(across.dqkv == dense.dqkv) << "dq, dk, dv";
  }
}

}  // namespace
}  // namespace difftrain
