// GatedResidualNorm on the GPU (model/cuda/modulate.h), with the checks the CPU emulator's run
// of the same kernel bodies passes (model/cuda/adaln_testing.h, model/simt/adaln_test.cc):
// against the CPU's GatedResidual, LayerNorm and Modulate in double, with and without the
// branch and Latte's added embedding, at the final layer's adaLN layout and a block's; at a
// small odd width (the scalar path), small vector ones, and DiT-XL's block shape. In place (the
// stream over itself, dy over dh) they must give the same bits.
#include "model/cuda/modulate.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/cuda/adaln_testing.h"
#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using adaln_testing::Case;
using adaln_testing::Operands;
using adaln_testing::Outputs;
using testing::Poison;
using testing::UploadFloat;

DeviceBuffer<bf16> UploadBits(const std::vector<uint16_t>& bits) {
  std::vector<bf16> h(bits.size());
  std::memcpy(static_cast<void*>(h.data()), bits.data(), bits.size() * sizeof(uint16_t));
  DeviceBuffer<bf16> d(bits.size());
  d.Upload(h);
  return d;
}

std::vector<uint16_t> DownloadBits(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> h = d.Download();
  std::vector<uint16_t> bits(h.size());
  std::memcpy(bits.data(), static_cast<const void*>(h.data()), h.size() * sizeof(uint16_t));
  return bits;
}

// The forward, then the backward, on the GPU; in place: the stream over x and dy over dh.
Outputs RunOnGpu(const Operands& o, bool in_place) {
  const Case& c = o.c;
  const bool writes_stream = c.gated || c.add;
  DeviceBuffer<float> x = UploadFloat(o.x), x_out(o.n), mod_ada = UploadFloat(o.mod_ada);
  DeviceBuffer<float> gate_ada = UploadFloat(o.gate_ada), add = UploadFloat(o.add);
  DeviceBuffer<bf16> y = UploadBits(o.y), h(o.n);
  DeviceBuffer<float> mean(size_t(c.B) * c.T), rstd(size_t(c.B) * c.T);
  Poison(x_out);
  Poison(h);
  Poison(mean);
  Poison(rstd);
  const float* gate_ada_ptr = c.final_norm ? gate_ada.data() : mod_ada.data();
  const GatedBranch branch =
      c.gated ? GatedBranch{y.data(), gate_ada_ptr, o.gate_stride, o.gate} : GatedBranch{};
  const Modulation mod{mod_ada.data(), o.mod_stride, o.shift, o.scale};
  float* stream_out = !writes_stream ? nullptr : in_place ? x.data() : x_out.data();
  GatedResidualNormForward(stream_out, h.data(), mean.data(), rstd.data(), x.data(), branch,
                           c.add ? add.data() : nullptr, mod, c.B, c.T, c.D, nullptr, c.rows);

  DeviceBuffer<float> dx = UploadFloat(o.dx0), d_mod_ada = UploadFloat(o.d_mod_ada0);
  DeviceBuffer<float> d_gate_ada = UploadFloat(o.d_gate_ada0), bias(c.D);
  DeviceBuffer<bf16> dh = UploadBits(o.dh), dy(o.n);
  DeviceBuffer<float> workspace(GatedResidualNormWorkspace(c.B, c.T, c.D, c.rows));
  Poison(dy);
  Poison(workspace);
  DT_CUDA_CHECK(cudaMemset(bias.data(), 0, bias.bytes()));
  float* d_gate = !c.gated ? nullptr : c.final_norm ? d_gate_ada.data() : d_mod_ada.data();
  const float* x_prime = !writes_stream ? x.data() : in_place ? x.data() : x_out.data();
  GatedResidualNormBackward(dx.data(), d_mod_ada.data(), in_place ? dh.data() : dy.data(), d_gate,
                            bias.data(), dh.data(), x_prime, mean.data(), rstd.data(), mod, branch,
                            workspace.data(), c.B, c.T, c.D, nullptr, c.rows);
  DT_CUDA_CHECK(cudaDeviceSynchronize());

  Outputs r;
  if (writes_stream) r.x_out = (in_place ? x : x_out).Download();
  r.h = DownloadBits(h);
  r.mean = mean.Download();
  r.rstd = rstd.Download();
  r.dx = dx.Download();
  r.d_mod_ada = d_mod_ada.Download();
  if (c.final_norm) r.d_gate_ada = d_gate_ada.Download();
  if (c.gated) {
    r.dy = DownloadBits(in_place ? dh : dy);
    r.bias = bias.Download();
  }
  return r;
}

class GatedResidualNormTest : public ::testing::TestWithParam<Case> {};

TEST_P(GatedResidualNormTest, MatchesTheCpuReference) {
  DT_SKIP_WITHOUT_GPU();
  const Operands o(GetParam());
  adaln_testing::ExpectMatchesTheReference(o, RunOnGpu(o, /*in_place=*/false));
}

TEST_P(GatedResidualNormTest, InPlaceGivesTheSameBits) {
  DT_SKIP_WITHOUT_GPU();
  const Operands o(GetParam());
  adaln_testing::ExpectSameBits(RunOnGpu(o, false), RunOnGpu(o, true));
}

// A row beyond the kernels' widest is refused with the width named, before any launch (so
// without a GPU too).
TEST(GatedResidualNormDeathTest, RefusesRowsTooWide) {
  const int D = GatedResidualNormMaxWidth() + 4;
  EXPECT_DEATH(
      GatedResidualNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, GatedBranch{}, nullptr,
                               Modulation{nullptr, 2 * D, 0, D}, 1, 1, D, nullptr),
      "at most 8192 features");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedResidualNormTest,
    ::testing::Values(Case{"ScalarGated", 3, 7, 42, true, false, false},
                      Case{"NormAlone", 2, 21, 40, false, false, false},
                      Case{"LatteEmbeddingAdded", 2, 19, 40, true, true, false},
                      Case{"FinalNormAfterTheLastBlock", 2, 17, 44, true, false, true},
                      Case{"TwoGroupsAThread", 2, 18, 2112, true, false, true},
                      Case{"FourGroupsAThread", 2, 5, 1100, true, false, false},
                      Case{"DitXLBlock", 4, 256, 1152, true, false, false},
                      Case{"DitXLFinalNorm", 4, 256, 1152, true, false, true},
                      Case{"DitXLBlock8RowsABlock", 4, 256, 1152, true, false, false, 8},
                      Case{"DitXLBlock32RowsABlock", 4, 256, 1152, true, false, false, 32}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace difftrain::cuda
