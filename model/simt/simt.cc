#include "model/simt/simt.h"

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "common/check.h"
#include "model/io/half.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace difftrain::simt {
namespace {

constexpr size_t kStackBytes = 256 << 10;

// Under ThreadSanitizer (a *_tsan_test program), each emulated thread is a fiber of its own
// that synchronises with the others only where the CUDA execution model says it does: at a
// barrier (all of a block's threads; a warp collective: the warp's lanes, as __syncwarp), and
// at the kernel's start and end. Switching fibers implies nothing, so two threads touching the
// same shared (or global) memory between barriers, one of them writing, is a reported race.
// Blocks run in turn and end with the scheduler acquiring them: races between blocks go unseen.
#if defined(__SANITIZE_THREAD__)
void* TsanCurrentFiber() {
  return __tsan_get_current_fiber();
}
void* TsanNewFiber() {
  return __tsan_create_fiber(0);
}
void TsanDeleteFiber(void* fiber) {
  __tsan_destroy_fiber(fiber);
}
void TsanSwitchTo(void* fiber) {
  __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
}
void TsanRelease(void* sync) {
  __tsan_release(sync);
}
void TsanAcquire(void* sync) {
  __tsan_acquire(sync);
}
#else
void* TsanCurrentFiber() {
  return nullptr;
}
void* TsanNewFiber() {
  return nullptr;
}
void TsanDeleteFiber(void*) {}
void TsanSwitchTo(void*) {}
void TsanRelease(void*) {}
void TsanAcquire(void*) {}
#endif

// A counter or flag the fibers share: an atomic whose every access is relaxed, so that
// ThreadSanitizer sees the emulator's bookkeeping as race-free and yet ordering nothing (a
// seq_cst counter that every barrier bumps would order every thread after every other).
template <class T>
class Relaxed {
 public:
  Relaxed(T v = T()) : v_(v) {}
  operator T() const { return v_.load(std::memory_order_relaxed); }
  Relaxed& operator=(T v) {
    v_.store(v, std::memory_order_relaxed);
    return *this;
  }
  T operator++() { return v_.fetch_add(1, std::memory_order_relaxed) + 1; }
  T operator+=(T d) { return v_.fetch_add(d, std::memory_order_relaxed) + d; }

 private:
  std::atomic<T> v_;
};

// A barrier of `size` fibers: the last to arrive opens it. `sync` carries ThreadSanitizer's
// happens-before edges, one object per parity of the generation (a thread may arrive at the
// next generation before a slow one has left this one).
struct Barrier {
  int size = 0;
  Relaxed<int> arrived = 0;
  Relaxed<uint64_t> generation = 0;
  char sync[2] = {};

  void Reset(int n) {
    size = n;
    arrived = 0;
    generation = 0;
  }
};

// What a warp's lanes exchange at a collective; `op` catches lanes that call different ones.
enum class Op { kNone, kLdMatrix, kLdMatrixTrans, kMma, kShfl };
struct Warp {
  Barrier barrier;
  Op op[32] = {};
  const unsigned char* row[32] = {};
  uint32_t a[32][4] = {};
  uint32_t b[32][2] = {};
  float value[32] = {};
};

// A cp.async copy not yet landed: where, and the source's bytes as read at the call.
struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

struct Fiber {
  ucontext_t context;
  Relaxed<bool> done = false;
  void* tsan = nullptr;  // its ThreadSanitizer fiber
  // Its cp.async copies: since the last commit, and committed groups, oldest first.
  std::vector<PendingCopy> open;
  std::vector<std::vector<PendingCopy>> committed;
};

// The block being run on this OS thread.
struct Block {
  const std::function<void()>* body = nullptr;
  Dim3 index;
  int threads = 0;
  std::vector<unsigned char> smem;
  std::unique_ptr<Fiber[]> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::unique_ptr<Warp[]> warps;
  Barrier all;
  ucontext_t scheduler;
  void* scheduler_tsan = nullptr;
  char finished = 0;  // ThreadSanitizer's sync object: the block's threads are done
  Relaxed<int> current = 0;
  // Barriers opened and fibers finished: a round without any is a deadlock.
  Relaxed<uint64_t> progress = 0;
};

thread_local Block* g_block = nullptr;

// ReadCounters(): bumped by lane 0 of every warp (hence relaxed atomics).
Relaxed<uint64_t> g_ldmatrix_matrices, g_ldmatrix_extra_wavefronts;

// Wavefronts beyond the first that the 8 rows (offsets into shared memory) of one ldmatrix
// matrix cost: the most different rows in one 16-byte bank group, less one.
int ExtraWavefronts(std::array<ptrdiff_t, 8> rows) {
  std::sort(rows.begin(), rows.end());
  int in_group[8] = {};
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i == 0 || rows[i] != rows[i - 1]) ++in_group[(rows[i] / 16) % 8];
  }
  return *std::max_element(std::begin(in_group), std::end(in_group)) - 1;
}

Block& Current() {
  DT_CHECK(g_block != nullptr, "a simt primitive called outside simt::Launch");
  return *g_block;
}

void Yield() {
  Block& b = Current();
  TsanSwitchTo(b.scheduler_tsan);
  DT_CHECK(swapcontext(&b.fibers[b.current].context, &b.scheduler) == 0, "swapcontext");
}

void Arrive(Barrier& barrier) {
  const uint64_t generation = barrier.generation;
  char* sync = &barrier.sync[generation & 1];
  TsanRelease(sync);
  if (++barrier.arrived == barrier.size) {
    barrier.arrived = 0;
    ++barrier.generation;
    ++Current().progress;
  } else {
    while (barrier.generation == generation)
      Yield();
  }
  TsanAcquire(sync);
}

void FiberMain() {
  TsanAcquire(&g_block);  // the launch's set-up (its address is no read of g_block)
  Block& b = Current();
  (*b.body)();
  Fiber& self = b.fibers[b.current];
  DT_CHECK(self.open.empty() && self.committed.empty(),
           "simt: thread {} of block ({}, {}, {}) ended with cp.async copies it never waited for",
           static_cast<int>(b.current), b.index.x, b.index.y, b.index.z);
  // Back to the scheduler for good (not by returning: ThreadSanitizer's record of this fiber's
  // calls would then end on the scheduler's). The block is not read after the release.
  void* scheduler_tsan = b.scheduler_tsan;
  const ucontext_t* scheduler = &b.scheduler;
  b.fibers[b.current].done = true;
  ++b.progress;
  TsanRelease(&b.finished);
  TsanSwitchTo(scheduler_tsan);
  setcontext(scheduler);
  DT_CHECK(false, "setcontext returned");
}

// The calling lane's warp and its lane index.
Warp& MyWarp(int& lane) {
  Block& b = Current();
  lane = b.current % 32;
  return b.warps[b.current / 32];
}

// Waits for every lane of the warp, each having written its operands, and checks that they all
// called the same collective.
void Exchange(Warp& w, Op op, int lane) {
  w.op[lane] = op;
  Arrive(w.barrier);
  for (int i = 0; i < 32; ++i)
    DT_CHECK(w.op[i] == op, "simt: the lanes of a warp called different collectives");
}

// Prepares a fiber to run FiberMain on `stack`. (Its own function: getcontext returns twice,
// which the caller's locals must not see.)
[[gnu::noinline]] void StartFiber(Fiber& f, char* stack) {
  f.done = false;
  f.open.clear();
  f.committed.clear();
  DT_CHECK(getcontext(&f.context) == 0, "getcontext");
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;  // FiberMain never returns
  makecontext(&f.context, FiberMain, 0);
}

// Runs fiber i until it waits or ends; whether it ended.
[[gnu::noinline]] bool Resume(Block& block, int i) {
  block.current = i;
  TsanSwitchTo(block.fibers[i].tsan);
  DT_CHECK(swapcontext(&block.scheduler, &block.fibers[i].context) == 0, "swapcontext");
  return block.fibers[i].done;
}

uint16_t Load16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

void Launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  DT_CHECK(threads > 0 && threads % 32 == 0, "simt: {} threads a block is not whole warps",
           threads);
  DT_CHECK(g_block == nullptr, "simt::Launch inside a kernel");
  Block block;
  block.body = &body;
  block.threads = threads;
  block.fibers = std::make_unique<Fiber[]>(threads);
  block.warps = std::make_unique<Warp[]>(threads / 32);
  block.scheduler_tsan = TsanCurrentFiber();
  for (int i = 0; i < threads; ++i) {
    // Not zeroed: a fiber's stack is written before it is read. Zeroing 32 MiB a launch of 128
    // threads, each byte instrumented, was half the time of the race tests of the kernels.
    block.stacks.push_back(std::make_unique_for_overwrite<char[]>(kStackBytes));
    block.fibers[i].tsan = TsanNewFiber();
  }
  g_block = &block;
  for (int z = 0; z < grid.z; ++z) {
    for (int y = 0; y < grid.y; ++y) {
      for (int x = 0; x < grid.x; ++x) {
        block.index = {x, y, z};
        block.smem.assign(smem_bytes, 0);
        for (int w = 0; w < threads / 32; ++w) {
          Warp& warp = block.warps[w];
          warp.barrier.Reset(32);
          std::fill(std::begin(warp.op), std::end(warp.op), Op::kNone);
        }
        block.all.Reset(threads);
        for (int i = 0; i < threads; ++i)
          StartFiber(block.fibers[i], block.stacks[i].get());
        TsanRelease(&g_block);
        int remaining = threads;
        while (remaining > 0) {
          const uint64_t progress = block.progress;
          for (int i = 0; i < threads; ++i) {
            if (!block.fibers[i].done && Resume(block, i)) --remaining;
          }
          DT_CHECK(remaining == 0 || block.progress != progress,
                   "simt: block ({}, {}, {}) deadlocked: {} threads wait at a barrier others "
                   "never reach",
                   x, y, z, remaining);
        }
        TsanAcquire(&block.finished);
      }
    }
  }
  g_block = nullptr;
  for (int i = 0; i < threads; ++i)
    TsanDeleteFiber(block.fibers[i].tsan);
}

int ThreadIdx() {
  return Current().current;
}
Dim3 BlockIdx() {
  return Current().index;
}
unsigned char* SharedMemory() {
  return Current().smem.data();
}

void SyncThreads() {
  Arrive(Current().all);
}

void CheckAligned(const void* p, size_t bytes, const char* what) {
  DT_CHECK(reinterpret_cast<uintptr_t>(p) % bytes == 0, "simt: {} {} not {}-byte aligned", what, p,
           bytes);
}

void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  const Block& b = Current();
  const auto* p = static_cast<const unsigned char*>(row);
  DT_CHECK(p >= b.smem.data() && p + 16 <= b.smem.data() + b.smem.size(),
           "simt: ldmatrix row address outside the block's shared memory");
  DT_CHECK((p - b.smem.data()) % 16 == 0, "simt: ldmatrix row address not 16-byte aligned");
  int lane = 0;
  Warp& w = MyWarp(lane);
  w.row[lane] = p;
  Exchange(w, trans ? Op::kLdMatrixTrans : Op::kLdMatrix, lane);
  if (lane == 0) {
    for (int j = 0; j < 4; ++j) {
      std::array<ptrdiff_t, 8> rows;
      for (int i = 0; i < 8; ++i)
        rows[i] = w.row[8 * j + i] - b.smem.data();
      ++g_ldmatrix_matrices;
      g_ldmatrix_extra_wavefronts += ExtraWavefronts(rows);
    }
  }
  const int group = lane / 4, pair = 2 * (lane % 4);
  for (int j = 0; j < 4; ++j) {
    uint16_t lo, hi;
    if (!trans) {
      lo = Load16(w.row[8 * j + group] + 2 * pair);
      hi = Load16(w.row[8 * j + group] + 2 * (pair + 1));
    } else {
      lo = Load16(w.row[8 * j + pair] + 2 * group);
      hi = Load16(w.row[8 * j + pair + 1] + 2 * group);
    }
    r[j] = uint32_t{lo} | (uint32_t{hi} << 16);
  }
  Arrive(w.barrier);
}

// Lane `lane`'s four products of the warp's exchanged registers. Not instrumented by
// ThreadSanitizer: it reads only the emulator's own exchange (written before the warp's
// barrier, instrumented there), and its 128 reads a lane were, after the stacks' zeroing, a third
// of the race tests' time.
[[gnu::no_sanitize_thread, gnu::noinline]] void MmaProducts(const Warp& w, int lane,
                                                            float (&sums)[4]) {
  // A(row, k): lane 4·(row % 8) + (k % 8)/2, register (row ≥ 8) + 2·(k ≥ 8), half k % 2.
  // B(k, n): lane 4·n + (k % 8)/2, register (k ≥ 8), half k % 2.
  // D(row, col) of lane l, element i: row l/4 + 8·(i ≥ 2), col 2·(l % 4) + i % 2.
  auto half = [](uint32_t reg, int k) { return Bf16ToFloat(uint16_t(reg >> (16 * (k & 1)))); };
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + 8 * (i >= 2), col = 2 * (lane % 4) + (i & 1);
    float sum = 0;
    for (int k = 0; k < 16; ++k) {
      const float x = half(w.a[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k);
      const float y = half(w.b[4 * col + (k % 8) / 2][k >= 8], k);
      sum += x * y;
    }
    sums[i] = sum;
  }
}

void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  int lane = 0;
  Warp& w = MyWarp(lane);
  for (int i = 0; i < 4; ++i)
    w.a[lane][i] = a[i];
  w.b[lane][0] = b0;
  w.b[lane][1] = b1;
  Exchange(w, Op::kMma, lane);
  float sums[4];
  MmaProducts(w, lane, sums);
  for (int i = 0; i < 4; ++i)
    d[i] += sums[i];
  Arrive(w.barrier);
}

float ShflXor(float v, int mask) {
  int lane = 0;
  Warp& w = MyWarp(lane);
  w.value[lane] = v;
  Exchange(w, Op::kShfl, lane);
  const float r = w.value[(lane ^ mask) & 31];
  Arrive(w.barrier);
  return r;
}

void CopyAsync16(void* dst, const void* src) {
  Block& b = Current();
  auto* d = static_cast<unsigned char*>(dst);
  DT_CHECK(d >= b.smem.data() && d + 16 <= b.smem.data() + b.smem.size(),
           "simt: cp.async destination outside the block's shared memory");
  CheckAligned(dst, 16, "cp.async destination");
  CheckAligned(src, 16, "cp.async source");
#if defined(__SANITIZE_THREAD__)
  std::memcpy(d, src, 16);
  b.fibers[b.current].open.push_back({nullptr, {}});  // a copy to wait for, already landed
#else
  PendingCopy copy{d, {}};
  std::memcpy(copy.bytes, src, 16);
  b.fibers[b.current].open.push_back(copy);
#endif
}

void CommitGroup() {
  Fiber& f = Current().fibers[Current().current];
  f.committed.push_back(std::move(f.open));
  f.open.clear();
}

void WaitGroup(int n) {
  Fiber& f = Current().fibers[Current().current];
  while (static_cast<int>(f.committed.size()) > n) {
    for (const PendingCopy& copy : f.committed.front()) {
      if (copy.dst != nullptr) std::memcpy(copy.dst, copy.bytes, 16);
    }
    f.committed.erase(f.committed.begin());
  }
}

Counters ReadCounters() {
  return {g_ldmatrix_matrices, g_ldmatrix_extra_wavefronts};
}
void ResetCounters() {
  g_ldmatrix_matrices = 0;
  g_ldmatrix_extra_wavefronts = 0;
}

uint16_t FloatToBf16(float x) {
  return io::FloatToBf16Bits(x);
}

}  // namespace difftrain::simt
