// What the *_tsan_test programs of the kernels on the CPU emulator share (each program includes
// it once: it defines ThreadSanitizer's hooks): a count of the races reported, and
// simt::Primitives less one chosen barrier, to show that a check can fail.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "model/simt/simt.h"

namespace difftrain::simt {
inline std::atomic<int> g_tsan_reports{0};
}  // namespace difftrain::simt

// ThreadSanitizer calls this for every report it prints (after its own de-duplication).
extern "C" void __tsan_on_report(const void*) {
  ++difftrain::simt::g_tsan_reports;
}

// A report fails a test through its assertions, not the exit status: the tests of dropped
// barriers expect reports. A race at an address reported before is reported again (each
// launch's shared memory may be where the last one's was); one between the same two lines of
// code is not.
extern "C" const char* __tsan_default_options() {
  return "exitcode=0:history_size=4:suppress_equal_addresses=0";
}

namespace difftrain::simt {

// simt::Primitives less the n-th barrier (from 0) each thread of a block reaches; n < 0 drops
// none. Thread t's count lives in slot t, which only t's fiber touches while a block runs.
struct BarrierCount {
  int block = -1, seen = 0;
};
struct DroppingPrimitives : Primitives {
  static inline int drop = -1;
  static inline std::vector<BarrierCount> counts = std::vector<BarrierCount>(1024);

  static void SyncThreads() {
    const Dim3 b = BlockIdx();
    const int block = (b.z * 1024 + b.y) * 1024 + b.x;
    BarrierCount& c = counts[ThreadIdx()];
    if (c.block != block) c = BarrierCount{block, 0};
    if (c.seen++ != drop) simt::SyncThreads();
  }
};

}  // namespace difftrain::simt

#if defined(__SANITIZE_THREAD__)
#define DT_REQUIRE_TSAN()
#else
#define DT_REQUIRE_TSAN() GTEST_SKIP() << "built without ThreadSanitizer: " DIFFTRAIN_TSAN_SKIP
#endif
