// The CPU emulator's primitives on their own: an m16n8k16 product through ldmatrix (plain and
// transposed) and mma equals the plain product of the matrices in shared memory; shuffles; a
// barrier orders shared memory; blocks see their own index and zeroed shared memory; and the
// misuses a GPU would hang or misbehave on stop the emulator with a message.
#include "model/simt/simt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace difftrain::simt {
namespace {

// Small integers are exact in bf16 and their products' sums exact in fp32.
float Value(int i, int j, int salt) {
  return float((i * 7 + j * 3 + salt) % 11 - 5);
}

// D (16×8) = A (16×16) · B (16×8), A row-major in shared memory; B given as Bᵀ row-major (n rows
// of k: ldmatrix without .trans) or as B row-major (k rows of n: with .trans).
void ExpectProduct(bool b_transposed_in_memory) {
  std::vector<float> d(16 * 8, NAN);
  Launch({1, 1, 1}, 32, 2 * 16 * 16 * 2, [&] {
    auto* a_s = reinterpret_cast<uint16_t*>(SharedMemory());
    uint16_t* b_s = a_s + 16 * 16;
    const int lane = ThreadIdx();
    if (lane == 0) {
      for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
          a_s[i * 16 + j] = FloatToBf16(Value(i, j, 1));
          // B(k, n) for n < 8; the rest of the 16×16 tile stays zero.
          if (b_transposed_in_memory && i < 8) b_s[i * 16 + j] = FloatToBf16(Value(j, i, 2));
          if (!b_transposed_in_memory && j < 8) b_s[i * 16 + j] = FloatToBf16(Value(i, j, 2));
        }
      }
    }
    SyncThreads();
    uint32_t a[4], b[4];
    Primitives::LdMatrixX4(a, a_s + (lane & 15) * 16 + (lane >> 4) * 8);
    if (b_transposed_in_memory) {  // rows n, columns k
      Primitives::LdMatrixX4(b, b_s + ((lane & 7) + (lane >> 4) * 8) * 16 + ((lane >> 3) & 1) * 8);
    } else {  // rows k, columns n
      Primitives::LdMatrixX4Trans(
          b, b_s + ((lane & 7) + ((lane >> 3) & 1) * 8) * 16 + (lane >> 4) * 8);
    }
    float acc[4] = {0, 0, 0, 0};
    Primitives::Mma(acc, a, b[0], b[1]);
    for (int i = 0; i < 4; ++i)
      d[(lane / 4 + 8 * (i / 2)) * 8 + 2 * (lane % 4) + i % 2] = acc[i];
  });
  for (int i = 0; i < 16; ++i) {
    for (int n = 0; n < 8; ++n) {
      float want = 0;
      for (int k = 0; k < 16; ++k)
        want += Value(i, k, 1) * Value(k, n, 2);
      EXPECT_EQ(d[i * 8 + n], want) << "row " << i << " col " << n;
    }
  }
}

TEST(SimtTest, LdMatrixAndMmaMultiply) {
  ExpectProduct(/*b_transposed_in_memory=*/true);
  ExpectProduct(/*b_transposed_in_memory=*/false);
}

TEST(SimtTest, ShuffleExchangesAcrossLanes) {
  std::vector<float> got(64);
  Launch({1, 1, 1}, 64, 0, [&] {
    const int t = ThreadIdx();
    got[t] = ShflXor(float(t), 5);
  });
  for (int t = 0; t < 64; ++t)
    EXPECT_EQ(got[t], float((t & ~31) | ((t & 31) ^ 5))) << t;
}

TEST(SimtTest, BarrierOrdersSharedMemoryAndBlocksAreSeparate) {
  std::vector<int> sums;
  Launch({3, 2, 1}, 64, 64 * sizeof(int), [&] {
    int* s = reinterpret_cast<int*>(SharedMemory());
    const int t = ThreadIdx();
    EXPECT_EQ(s[t], 0);  // every block starts from zeroed shared memory
    s[t] = t + 100 * BlockIdx().x + 1000 * BlockIdx().y;
    SyncThreads();
    if (t == 0) {
      int sum = 0;
      for (int i = 0; i < 64; ++i)
        sum += s[i];
      sums.push_back(sum);
    }
  });
  ASSERT_EQ(sums.size(), 6u);
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x)
      EXPECT_EQ(sums[y * 3 + x], 64 * 63 / 2 + 64 * (100 * x + 1000 * y));
  }
}

TEST(SimtDeathTest, MisusesStopWithAMessage) {
  // A barrier that some threads never reach would hang a GPU.
  EXPECT_DEATH(Launch({1, 1, 1}, 64, 0,
                      [] {
                        if (ThreadIdx() < 32) SyncThreads();
                      }),
               "deadlocked");
  // Lanes of one warp in different collectives.
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64,
                      [] {
                        uint32_t r[4];
                        if (ThreadIdx() == 0) {
                          ShflXor(1.0f, 1);
                        } else {
                          LdMatrixX4(r, SharedMemory(), false);
                        }
                      }),
               "different collectives");
  // ldmatrix outside shared memory.
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 16,
                      [] {
                        uint32_t r[4];
                        LdMatrixX4(r, SharedMemory() + 16, false);
                      }),
               "outside the block's shared memory");
  // A 16-byte copy from an address 8 bytes past a 16-byte boundary (a head's columns at an odd
  // multiple of 4 elements, say) faults on a GPU.
  alignas(16) static uint16_t global[16] = {};
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64, [] { Primitives::Copy16(SharedMemory(), global + 4); }),
               "Copy16 source .* not 16-byte aligned");
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64, [] { Primitives::Zero16(SharedMemory() + 8); }),
               "Zero16 destination .* not 16-byte aligned");
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64, [] { Primitives::Store32(SharedMemory() + 2, 1); }),
               "Store32 destination .* not 4-byte aligned");
  // cp.async: a copy never waited for, one into global memory, one from a misaligned source.
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64,
                      [] {
                        Primitives::CopyAsync16(SharedMemory(), global);
                        Primitives::CommitGroup();
                      }),
               "ended with cp.async copies it never waited for");
  alignas(16) static uint16_t other[8] = {};
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64, [] { Primitives::CopyAsync16(other, global); }),
               "cp.async destination outside the block's shared memory");
  EXPECT_DEATH(
      Launch({1, 1, 1}, 32, 64, [] { Primitives::CopyAsync16(SharedMemory(), global + 4); }),
      "cp.async source .* not 16-byte aligned");
}

// cp.async's bytes land at the wait that retires their group, not before: WaitPrior leaves the
// newest committed group in flight, WaitAll lands it, and copies after the last commit are in no
// group yet. (This program is not built with ThreadSanitizer, under which they land at once.)
TEST(SimtTest, AsyncCopiesLandAtTheirWait) {
  alignas(16) static const uint32_t first[4] = {1, 2, 3, 4}, second[4] = {5, 6, 7, 8};
  std::vector<uint32_t> seen;
  Launch({1, 1, 1}, 32, 64, [&] {
    auto* tile = reinterpret_cast<uint32_t*>(SharedMemory());
    if (ThreadIdx() != 0) return;
    Primitives::CopyAsync16(tile, first);
    Primitives::CommitGroup();
    Primitives::CopyAsync16(tile + 4, second);
    seen.push_back(tile[0]);  // 0: nothing landed before a wait
    Primitives::CommitGroup();
    Primitives::WaitPrior();
    seen.push_back(tile[0]);  // 1: the first group
    seen.push_back(tile[4]);  // 0: the second still in flight
    Primitives::WaitAll();
    seen.push_back(tile[7]);  // 8
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 0, 8}));
}

TEST(SimtTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);  // a tie: to the even 1.0
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie: to even
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 200)), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

// The bank-conflict count: 16 rows × 64 bf16 a tile, read as the A operand. Rows 128 bytes
// apart put a matrix's 8 rows in one bank group (8 wavefronts, 7 extra, each of the 4
// matrices); 144 bytes apart (8 elements of padding) in 8 different groups; all lanes reading
// one row is a broadcast.
TEST(SimtTest, CountsTheBankConflictsOfLdMatrix) {
  for (const int ld : {64, 72, 0}) {
    ResetCounters();
    Launch({1, 1, 1}, 32, 16 * 72 * 2, [&] {
      const auto* tile = reinterpret_cast<const uint16_t*>(SharedMemory());
      const int lane = ThreadIdx();
      uint32_t r[4];
      Primitives::LdMatrixX4(r, tile + (lane & 15) * ld + (lane >> 4) * 8);
      Primitives::LdMatrixX4Trans(r, tile + (lane & 15) * ld + (lane >> 4) * 8);
    });
    const Counters c = ReadCounters();
    EXPECT_EQ(c.ldmatrix_matrices, 8u);
    EXPECT_EQ(c.ldmatrix_extra_wavefronts, ld == 64 ? 8u * 7 : 0u) << "row stride " << ld;
  }
}

}  // namespace
}  // namespace difftrain::simt
