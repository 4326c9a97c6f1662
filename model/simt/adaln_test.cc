// The GPU's adaLN elementwise kernels (model/cuda/adaln_kernels.h: the gated residual fused
// with the LayerNorm-modulate after it) on the CPU emulator against the CPU references in
// double (model/cuda/adaln_testing.h), at shapes that take each layout: the scalar and the
// vector path, one, two and four feature groups a thread, partial warps and a partial last
// chunk of rows. Outputs start as NaN, so an element the kernels never write fails. Run in
// place (the stream over itself, dy over dh), the kernels must give the same bits.
// model/cuda/modulate_test.cc runs the compiled kernels on a GPU with the same checks.
#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "model/cuda/adaln_kernels.h"
#include "model/cuda/adaln_testing.h"
#include "model/simt/simt.h"

namespace difftrain {
namespace {

using adaln_testing::Case;
using adaln_testing::kNaNBits;
using adaln_testing::Operands;
using adaln_testing::Outputs;

// The forward or the backward body on the emulator at the layout's template arguments.
template <class Args>
void Emulate(const adaln::Layout& layout, const Args& args) {
  adaln::WithLayout(layout, [&](auto w, auto v) {
    constexpr int W = decltype(w)::value, V = decltype(v)::value;
    simt::Launch({adaln::Chunks(args.T, args.rows), args.B, 1}, layout.threads, adaln::kSmemBytes,
                 [&] {
                   if constexpr (std::is_same_v<Args, adaln::ForwardArgs>) {
                     adaln::Forward<simt::Primitives, W, V>(args);
                   } else {
                     adaln::Backward<simt::Primitives, W, V>(args);
                   }
                 });
  });
}

// The forward, then the backward and the reduction, on the emulator. In place: the forward
// writes the stream over x and the backward dy over dh.
Outputs RunKernels(const Operands& o, bool in_place) {
  const Case& c = o.c;
  const adaln::Layout layout = adaln::LayoutFor(c.D, c.D % 4 == 0);
  EXPECT_GT(layout.V, 0);
  const adaln::Branch branch =
      c.gated ? adaln::Branch{o.y.data(), o.GateAda().data() + o.gate, o.gate_stride}
              : adaln::Branch{nullptr, nullptr, 0};
  const adaln::Modulation mod{o.mod_ada.data() + o.shift, o.mod_ada.data() + o.scale, o.mod_stride};
  Outputs r;
  const bool writes_stream = c.gated || c.add;
  std::vector<float> x = o.x;
  r.x_out.assign(writes_stream ? o.n : 0, NAN);
  r.h.assign(o.n, kNaNBits);
  r.mean.assign(size_t(c.B) * c.T, NAN);
  r.rstd.assign(size_t(c.B) * c.T, NAN);
  float* x_out = !writes_stream ? nullptr : in_place ? x.data() : r.x_out.data();
  const adaln::ForwardArgs forward{x_out,
                                   r.h.data(),
                                   r.mean.data(),
                                   r.rstd.data(),
                                   x.data(),
                                   branch,
                                   c.add ? o.add.data() : nullptr,
                                   mod,
                                   c.B,
                                   c.T,
                                   c.D,
                                   layout.threads,
                                   c.rows};
  Emulate(layout, forward);
  if (in_place && writes_stream) r.x_out = x;
  const std::vector<float>& x_prime = writes_stream ? r.x_out : o.x;

  r.dx = o.dx0;
  r.d_mod_ada = o.d_mod_ada0;
  r.d_gate_ada = c.final_norm ? o.d_gate_ada0 : std::vector<float>();
  std::vector<float>& d_gate_ada = c.final_norm ? r.d_gate_ada : r.d_mod_ada;
  std::vector<uint16_t> dh = o.dh;
  r.dy.assign(c.gated ? o.n : 0, kNaNBits);
  uint16_t* dy = !c.gated ? nullptr : in_place ? dh.data() : r.dy.data();
  std::vector<float> partials(adaln::PartialFloats(c.B, c.T, c.D, c.rows), NAN);
  std::vector<float> bias_rows(c.gated ? size_t(c.B) * c.D : 0, NAN);
  const adaln::BackwardArgs backward{r.dx.data(),
                                     dy,
                                     partials.data(),
                                     dh.data(),
                                     x_prime.data(),
                                     r.mean.data(),
                                     r.rstd.data(),
                                     mod,
                                     branch,
                                     c.B,
                                     c.T,
                                     c.D,
                                     layout.threads,
                                     c.rows};
  Emulate(layout, backward);
  const adaln::ReduceArgs reduce{partials.data(),
                                 r.d_mod_ada.data() + o.shift,
                                 r.d_mod_ada.data() + o.scale,
                                 o.mod_stride,
                                 c.gated ? d_gate_ada.data() + o.gate : nullptr,
                                 branch.stride,
                                 c.gated ? bias_rows.data() : nullptr,
                                 c.B,
                                 c.T,
                                 c.D,
                                 c.rows};
  simt::Launch({(c.D + adaln::kReduceThreads - 1) / adaln::kReduceThreads, c.B, 1},
               adaln::kReduceThreads, 0, [&] { adaln::ReduceAdaGrads<simt::Primitives>(reduce); });
  if (in_place && c.gated) r.dy = dh;
  if (c.gated) {  // the sum over samples, as BiasGradient does on the GPU
    r.bias.assign(c.D, 0.0f);
    for (size_t i = 0; i < bias_rows.size(); ++i)
      r.bias[i % c.D] += bias_rows[i];
  }
  return r;
}

class AdaLNKernelsTest : public ::testing::TestWithParam<Case> {};

TEST_P(AdaLNKernelsTest, MatchTheCpuReference) {
  const Operands o(GetParam());
  adaln_testing::ExpectMatchesTheReference(o, RunKernels(o, /*in_place=*/false));
}

TEST_P(AdaLNKernelsTest, InPlaceGivesTheSameBits) {
  const Operands o(GetParam());
  adaln_testing::ExpectSameBits(RunKernels(o, false), RunKernels(o, true));
}

// D: 40 → 10 vector groups, one partial warp; 42 → the scalar path over two warps; 2112 → two
// vector groups a thread (288 threads); 1100 → four scalar groups a thread; 1152 → DiT-XL's
// rows, one vector group for each of 288 threads. T = 37 and 18 end in a partial chunk; the
// last two cases take 5 and 32 rows a block instead of 16.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AdaLNKernelsTest,
    ::testing::Values(Case{"VectorGated", 2, 37, 40, true, false, false},
                      Case{"ScalarGated", 3, 7, 42, true, false, false},
                      Case{"NormAlone", 2, 21, 40, false, false, false},
                      Case{"LatteEmbeddingAdded", 2, 19, 40, true, true, false},
                      Case{"FinalNormAfterTheLastBlock", 2, 17, 44, true, false, true},
                      Case{"TwoGroupsAThread", 1, 18, 2112, true, false, true},
                      Case{"FourGroupsAThread", 1, 3, 1100, true, false, false},
                      Case{"DitXLRows", 1, 20, 1152, true, false, false},
                      Case{"FiveRowsABlock", 2, 37, 40, true, false, true, 5},
                      Case{"OneBlockASample", 2, 21, 44, true, true, false, 32}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(AdaLNLayoutTest, SpreadsARowOverTheBlock) {
  const auto expect = [](int D, bool vector, int W, int V, int threads) {
    const adaln::Layout l = adaln::LayoutFor(D, vector);
    EXPECT_EQ(l.W, W) << D;
    EXPECT_EQ(l.V, V) << D;
    EXPECT_EQ(l.threads, threads) << D;
  };
  expect(1152, true, 4, 1, 288);  // DiT-XL
  expect(384, true, 4, 1, 96);    // DiT-S
  expect(2048, true, 4, 1, 512);
  expect(2112, true, 4, 2, 288);
  expect(8192, true, 4, 4, 512);
  expect(42, false, 1, 1, 64);
  expect(1100, false, 1, 4, 288);
  EXPECT_EQ(adaln::LayoutFor(8196, true).V, 0);
  EXPECT_EQ(adaln::LayoutFor(2049, false).V, 0);
  EXPECT_EQ(adaln::MaxFeatures(true), 8192);
}

}  // namespace
}  // namespace difftrain
