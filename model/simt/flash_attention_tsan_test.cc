// The flash-attention kernels' barriers, checked by ThreadSanitizer on the CPU emulator: this
// program is built with -fsanitize=thread (CMakeLists.txt: every *_tsan_test.cc), where the
// emulator runs each CUDA thread as a fiber that synchronises with the others only at
// barriers, warp collectives and the kernel's start and end (model/simt/simt.cc). A shared-
// memory tile read by one warp while another writes it, with no barrier between, is a report.
//
// The kernels as written must give none, at shapes like those of
// model/simt/flash_attention_test.cc (which checks their values). To show that the check can fail,
// the same kernels run with one barrier dropped (the n-th each thread reaches): the one after the
// first key/value tile is loaded (then warps read rows others are still writing) and the one before
// the second is loaded (then warps overwrite rows others are still reading); each must be reported.
// The backward's Delta kernel likewise, with and without its one barrier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "model/cuda/flash_kernels.h"
#include "model/cuda/flash_short_kernels.h"
#include "model/simt/simt.h"
#include "model/simt/tsan_testing.h"
#include "model/tensor/rng.h"

namespace difftrain {
namespace {

using simt::DroppingPrimitives;
using simt::FloatToBf16;
using simt::g_tsan_reports;

struct Shape {
  int B, Tq, Tk, D, H;
};

std::vector<uint16_t> Random(size_t n, uint64_t seed) {
  Rng rng(seed, RngStream::kData);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v)
    x = FloatToBf16(static_cast<float>(rng.Normal()));
  return v;
}

// wide: two m-tiles a warp; dQ stored: dQ from stored score gradients (random values here);
// dK/dV storing: storing them. Both stored kernels write their column sums too (shared memory
// reused after the loop).
enum class Kernel { kForward, kDq, kDkv, kForwardWide, kDqStored, kDkvStoring };

// Runs one kernel (q [B, Tq, D], k and v in one [B, Tk, 2·D]) with `stages` stages (1, or 2:
// double-buffered) and `drop` as the dropped barrier; the number of races reported.
int Races(Kernel kernel, const Shape& s, int drop, int stages = 1) {
  const int hd = s.D / s.H;
  const std::vector<uint16_t> q = Random(size_t(s.B) * s.Tq * s.D, 1);
  const std::vector<uint16_t> kv = Random(size_t(s.B) * s.Tk * 2 * s.D, 2);
  const std::vector<uint16_t> dout = Random(q.size(), 3);
  std::vector<uint16_t> out(q.size()), dq(q.size()), dkv(kv.size());
  std::vector<float> lse(size_t(s.B) * s.H * s.Tq, 1.0f), delta(lse.size(), 0.5f);
  const flash::Operands in{q.data(),
                           kv.data(),
                           kv.data() + s.D,
                           size_t(s.D),
                           size_t(2 * s.D),
                           s.Tq,
                           s.Tk,
                           s.D,
                           s.H,
                           1.0f / std::sqrt(float(hd))};
  const flash::ForwardArgs forward{in, out.data(), lse.data()};
  flash::BackwardArgs backward{in,        dout.data(), lse.data(),      delta.data(),
                               dq.data(), dkv.data(),  dkv.data() + s.D};
  std::vector<uint16_t> ds;
  std::vector<float> sums;
  if (kernel == Kernel::kDqStored || kernel == Kernel::kDkvStoring) {
    backward.ds_rows = flash::StoredScoresRows(s.Tk);
    backward.ds_cols = flash::StoredScoresRows(s.Tq);
    ds = Random(size_t(s.B) * s.H * backward.ds_rows * backward.ds_cols, 4);
    backward.ds = ds.data();
    const int rows = s.B * (std::max(backward.ds_rows, backward.ds_cols) / flash::kRows);
    sums.assign(size_t(rows) * 3 * s.D, 0.0f);
    backward.dq_sums = sums.data();
    backward.dk_sums = sums.data() + s.D;
    backward.dv_sums = sums.data() + 2 * s.D;
    backward.sums_stride = 3 * size_t(s.D);
  }
  using P = DroppingPrimitives;
  P::drop = drop;
  const int before = g_tsan_reports;
  const auto launch = [&](auto padded, auto staged) {
    constexpr int HDP = decltype(padded)::value, kStages = decltype(staged)::value;
    const auto grid = [&](int rows, int block_rows = flash::kRows) {
      return simt::Dim3{(rows + block_rows - 1) / block_rows, s.H, s.B};
    };
    switch (kernel) {
      case Kernel::kForward:
        simt::Launch(grid(s.Tq), flash::kThreads, flash::ForwardSmemBytes<HDP, kStages>(),
                     [&] { flash::Forward<HDP, P, kStages>(forward); });
        break;
      case Kernel::kDq:
        simt::Launch(grid(s.Tq), flash::kThreads, flash::DqSmemBytes<HDP, kStages>(),
                     [&] { flash::BackwardDq<HDP, P, kStages>(backward); });
        break;
      case Kernel::kDkv:
        simt::Launch(grid(s.Tk), flash::kThreads, flash::DkvSmemBytes<HDP, kStages>(),
                     [&] { flash::BackwardDkv<HDP, P, kStages>(backward); });
        break;
      case Kernel::kForwardWide:
        simt::Launch(grid(s.Tq, 2 * flash::kRows), flash::kThreads,
                     flash::ForwardSmemBytes<HDP, kStages, 2>(),
                     [&] { flash::Forward<HDP, P, kStages, 2>(forward); });
        break;
      case Kernel::kDqStored:
        simt::Launch(grid(s.Tq), flash::kThreads, flash::DqStoredSmemBytes<HDP, kStages>(),
                     [&] { flash::BackwardDqStored<HDP, P, kStages>(backward); });
        break;
      case Kernel::kDkvStoring:
        simt::Launch(grid(s.Tk), flash::kThreads, flash::DkvSmemBytes<HDP, kStages>(),
                     [&] { flash::BackwardDkv<HDP, P, kStages, true>(backward); });
        break;
    }
  };
  flash::WithPaddedHeadDim(hd, [&](auto padded) {
    if (stages == 2) {
      launch(padded, std::integral_constant<int, 2>());
    } else {
      launch(padded, std::integral_constant<int, 1>());
    }
  });
  P::drop = -1;
  return g_tsan_reports - before;
}

const char* Name(Kernel k) {
  return k == Kernel::kForward      ? "forward"
         : k == Kernel::kDq         ? "dQ"
         : k == Kernel::kDkv        ? "dK/dV"
         : k == Kernel::kDqStored   ? "dQ from stored score gradients"
         : k == Kernel::kDkvStoring ? "dK/dV storing score gradients"
                                    : "forward, two m-tiles a warp";
}

constexpr Kernel kKernels[] = {Kernel::kForward,     Kernel::kDq,       Kernel::kDkv,
                               Kernel::kForwardWide, Kernel::kDqStored, Kernel::kDkvStoring};

// Each tile size: head dim 72 (padded to 80, 64-row tiles) over two tiles, one partial; 64
// with fewer keys than a tile, over two heads; 128 (32-row tiles) over three tiles.
TEST(FlashAttentionRaces, NoneInTheKernels) {
  DT_REQUIRE_TSAN();
  const Shape shapes[] = {{1, 80, 80, 72, 1}, {1, 40, 37, 128, 2}, {1, 20, 70, 128, 1}};
  for (const Shape& s : shapes) {
    for (Kernel k : kKernels) {
      for (const int stages : {1, 2}) {
        EXPECT_EQ(Races(k, s, -1, stages), 0) << Name(k) << " at Tq=" << s.Tq << " Tk=" << s.Tk
                                              << " hd=" << s.D / s.H << ", " << stages << " stages";
      }
    }
  }
}

// Barrier 1 follows the first tile's load; without it warps read rows not yet written.
TEST(FlashAttentionRaces, ReportedWithoutTheBarrierAfterALoad) {
  DT_REQUIRE_TSAN();
  for (Kernel k : kKernels)
    EXPECT_GT(Races(k, {1, 65, 65, 64, 1}, 1), 0) << Name(k);
}

// Barrier 2 precedes the second tile's load; without it warps overwrite rows still being read.
TEST(FlashAttentionRaces, ReportedWithoutTheBarrierBeforeTheNextLoad) {
  DT_REQUIRE_TSAN();
  for (Kernel k : kKernels)
    EXPECT_GT(Races(k, {1, 65, 65, 64, 1}, 2), 0) << Name(k);
}

// Double-buffered (two stages, cp.async landing at the copy under ThreadSanitizer): barrier 0
// follows the wait for the first tile; without it warps read rows other threads copied.
TEST(FlashAttentionRaces, TwoStagesReportedWithoutTheBarrierAfterTheWait) {
  DT_REQUIRE_TSAN();
  for (Kernel k : kKernels)
    EXPECT_GT(Races(k, {1, 65, 65, 64, 1}, 0, 2), 0) << Name(k);
}

// Barrier 1 ends the work on the first tile; without it the copies of the third tile into the
// same stage overwrite rows still being read (three tiles of 64 rows).
TEST(FlashAttentionRaces, TwoStagesReportedWithoutTheBarrierAfterATile) {
  DT_REQUIRE_TSAN();
  for (Kernel k : kKernels)
    EXPECT_GT(Races(k, {1, 130, 130, 64, 1}, 1, 2), 0) << Name(k);
}

// The backward's Delta: each warp's dot products go through shared memory between two of its
// lanes' work, behind one barrier (B = 1, T = 9: three blocks, the last partial; D = 144, 2
// heads); without it the sums read dot products not yet written.
int DeltaRaces(int drop) {
  const int T = 9, D = 144, H = 2;
  const std::vector<uint16_t> dout = Random(size_t(T) * D, 4), out = Random(size_t(T) * D, 5);
  std::vector<float> delta(size_t(H) * T);
  DroppingPrimitives::drop = drop;
  const int before = g_tsan_reports;
  simt::Launch(
      {(T + flash::kWarps - 1) / flash::kWarps, 1, 1}, flash::kThreads, flash::DeltaSmemBytes(D),
      [&] {
        flash::Delta<DroppingPrimitives>({dout.data(), out.data(), delta.data(), 1, T, D, H});
      });
  DroppingPrimitives::drop = -1;
  return g_tsan_reports - before;
}

TEST(FlashAttentionRaces, DeltaReportedOnlyWithoutItsBarrier) {
  DT_REQUIRE_TSAN();
  EXPECT_EQ(DeltaRaces(-1), 0);
  EXPECT_GT(DeltaRaces(0), 0);
}

// The short-sequence kernels (flash_short_kernels.h): every thread copies part of every warp's
// tiles, so barrier 0, after the copies' wait, stands between one warp's copies and another's
// reads; the backward's barrier 1 between delta's dot products and their sums (lanes of one
// warp), barrier 2 between those sums and the reads of every lane. 5 sequences of 13 rows, hd
// 64 over 2 heads: three blocks, the last with two warps idle.
int ShortRaces(bool backward, int drop) {
  const int S = 5, T = 13, D = 128, H = 2;
  const std::vector<uint16_t> qkv = Random(size_t(S) * T * 3 * D, 6);
  const std::vector<uint16_t> dout = Random(size_t(S) * T * D, 7), out = Random(dout.size(), 8);
  std::vector<uint16_t> o(dout.size()), dqkv(qkv.size());
  std::vector<float> lse(size_t(S) * H * T, 1.0f);
  const flash::Operands in{
      qkv.data(), qkv.data() + D, qkv.data() + 2 * D, 3 * size_t(D), 3 * size_t(D), T, T, D,
      H,          0.125f};
  flash::BackwardArgs args{in,          dout.data(),     lse.data(),         nullptr,
                           dqkv.data(), dqkv.data() + D, dqkv.data() + 2 * D};
  args.out = out.data();
  using P = DroppingPrimitives;
  P::drop = drop;
  const int before = g_tsan_reports;
  const simt::Dim3 grid{static_cast<int>(flash::ShortBlocks(S, H)), 1, 1};
  if (backward) {
    simt::Launch(grid, flash::kThreads, flash::ShortBackwardSmemBytes<64>(),
                 [&] { flash::ShortBackward<64, P>(args, S); });
  } else {
    simt::Launch(grid, flash::kThreads, flash::ShortForwardSmemBytes<64>(), [&] {
      flash::ShortForward<64, P>({in, o.data(), lse.data()}, S);
    });
  }
  P::drop = -1;
  return g_tsan_reports - before;
}

TEST(FlashAttentionRaces, ShortKernelsReportedOnlyWithoutEachBarrier) {
  DT_REQUIRE_TSAN();
  EXPECT_EQ(ShortRaces(false, -1), 0) << "forward";
  EXPECT_EQ(ShortRaces(true, -1), 0) << "backward";
  EXPECT_GT(ShortRaces(false, 0), 0) << "forward without barrier 0";
  for (const int drop : {0, 1, 2})
    EXPECT_GT(ShortRaces(true, drop), 0) << "backward without barrier " << drop;
}

// The emulator's own primitives: a value one warp writes to shared memory and another reads is
// a race without a barrier and none with one, and so are 16 bytes one thread zeroes and another
// copies to (GCC's ThreadSanitizer once missed the zeroing); shuffles and ldmatrix exchange
// registers between lanes without reports.
TEST(FlashAttentionRaces, TheCheckItself) {
  DT_REQUIRE_TSAN();
  for (const bool barrier : {false, true}) {
    const int before = g_tsan_reports;
    simt::Launch({1, 1, 1}, 64, 64, [&] {
      auto* smem = reinterpret_cast<float*>(simt::SharedMemory());
      const int t = simt::ThreadIdx();
      if (t < 32) smem[t] = float(t);
      if (barrier) simt::SyncThreads();
      float v = t >= 32 ? smem[t - 32] : 0.0f;
      v += simt::ShflXor(v, 1);
      uint32_t r[4];
      simt::LdMatrixX4(r, simt::SharedMemory() + 16 * (t % 4), false);
      (void)v;
    });
    EXPECT_EQ(g_tsan_reports - before > 0, !barrier)
        << (barrier ? "with" : "without") << " a barrier";
  }
  for (const bool barrier : {false, true}) {
    const int before = g_tsan_reports;
    const uint16_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    simt::Launch({1, 1, 1}, 64, 64, [&] {
      if (simt::ThreadIdx() == 0) simt::Primitives::Zero16(simt::SharedMemory());
      if (barrier) simt::SyncThreads();
      if (simt::ThreadIdx() == 32) simt::Primitives::Copy16(simt::SharedMemory(), data);
    });
    EXPECT_EQ(g_tsan_reports - before > 0, !barrier)
        << "Zero16 and Copy16 " << (barrier ? "with" : "without") << " a barrier";
  }
}

}  // namespace
}  // namespace difftrain
