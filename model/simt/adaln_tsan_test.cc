// The adaLN kernels' barriers (model/cuda/adaln_kernels.h), checked by ThreadSanitizer on the
// CPU emulator, as model/simt/flash_attention_tsan_test.cc checks the flash kernels'. Their
// only shared memory is the block reductions' warp sums: two slots used in turn, behind one
// barrier a reduction. As written they must give no report over several rows (so each slot is
// used again); with the first reduction's barrier dropped, warps read sums other warps have not
// yet written, which must be reported.
#include <gtest/gtest.h>

#include <vector>

#include "model/cuda/adaln_kernels.h"
#include "model/simt/simt.h"
#include "model/simt/tsan_testing.h"

namespace difftrain {
namespace {

using simt::DroppingPrimitives;
using simt::g_tsan_reports;

enum class Kernel { kForward, kBackward };

// One kernel over B = 1, T = 20 (two blocks of rows, the second partial) at width D, with a
// gated branch or without; the races reported.
int Races(Kernel kernel, int D, bool gated, int drop) {
  const int T = 20;
  const size_t n = size_t(T) * D;
  std::vector<float> x(n), x_out(n), ada(6 * D), mean(T), rstd(T), dx(n);
  std::vector<uint16_t> y(n), h(n), dh(n), dy(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = float(i % 7) - 3.0f;
    y[i] = dh[i] = simt::FloatToBf16(float(i % 5) - 2.0f);
  }
  for (int t = 0; t < T; ++t)
    mean[t] = 0.0f, rstd[t] = 1.0f;
  std::vector<float> partials(adaln::PartialFloats(1, T, D));
  const adaln::Branch branch = gated ? adaln::Branch{y.data(), ada.data() + 2 * D, 6 * D}
                                     : adaln::Branch{nullptr, nullptr, 0};
  const adaln::Modulation mod{ada.data() + 3 * D, ada.data() + 4 * D, 6 * D};
  const adaln::Layout layout = adaln::LayoutFor(D, D % 4 == 0);
  using P = DroppingPrimitives;
  P::drop = drop;
  const int before = g_tsan_reports;
  adaln::WithLayout(layout, [&](auto w, auto v) {
    constexpr int W = decltype(w)::value, V = decltype(v)::value;
    const simt::Dim3 grid{adaln::Chunks(T), 1, 1};
    if (kernel == Kernel::kForward) {
      const adaln::ForwardArgs args{gated ? x_out.data() : nullptr,
                                    h.data(),
                                    mean.data(),
                                    rstd.data(),
                                    x.data(),
                                    branch,
                                    nullptr,
                                    mod,
                                    1,
                                    T,
                                    D,
                                    layout.threads};
      simt::Launch(grid, layout.threads, adaln::kSmemBytes, [&] { adaln::Forward<P, W, V>(args); });
    } else {
      const adaln::BackwardArgs args{dx.data(),
                                     gated ? dy.data() : nullptr,
                                     partials.data(),
                                     dh.data(),
                                     x.data(),
                                     mean.data(),
                                     rstd.data(),
                                     mod,
                                     branch,
                                     1,
                                     T,
                                     D,
                                     layout.threads};
      simt::Launch(grid, layout.threads, adaln::kSmemBytes,
                   [&] { adaln::Backward<P, W, V>(args); });
    }
  });
  P::drop = -1;
  return g_tsan_reports - before;
}

// D = 300: 75 vector groups over 3 warps; 42: the scalar path over 2 warps; 2112: two vector
// groups a thread over 9 warps.
TEST(AdaLNRaces, NoneInTheKernels) {
  DT_REQUIRE_TSAN();
  for (const int D : {300, 42, 2112}) {
    for (const bool gated : {true, false}) {
      EXPECT_EQ(Races(Kernel::kForward, D, gated, -1), 0) << "forward, D=" << D;
      EXPECT_EQ(Races(Kernel::kBackward, D, gated, -1), 0) << "backward, D=" << D;
    }
  }
}

TEST(AdaLNRaces, ReportedWithoutTheReductionsBarrier) {
  DT_REQUIRE_TSAN();
  EXPECT_GT(Races(Kernel::kForward, 300, true, 0), 0) << "forward";
  EXPECT_GT(Races(Kernel::kBackward, 300, true, 0), 0) << "backward";
}

}  // namespace
}  // namespace difftrain
