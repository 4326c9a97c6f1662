// What the tests of the adaLN elementwise kernels share, on the CPU emulator
// (model/simt/adaln_test.cc) and on a GPU (model/cuda/modulate_test.cc): the operands of a
// case, the outputs a run gives, and the checks of those outputs against the CPU references in
// double (model/cpu/layernorm.h, modulate.h). Host code only.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <vector>

#include "model/cpu/layernorm.h"
#include "model/cpu/modulate.h"
#include "model/simt/simt.h"
#include "model/simt/testing.h"
#include "model/tensor/rng.h"

namespace difftrain::adaln_testing {

using simt::RelativeL2;

inline constexpr uint16_t kNaNBits = 0xFFFF;

struct Case {
  const char* name;
  int B, T, D;
  bool gated;       // a gated residual before the norm
  bool add;         // Latte's temporal embedding added too
  bool final_norm;  // the final layer's norm (adaLN of 2·D) after the last block's MLP branch;
                    // otherwise a block's second norm after its attention branch (one 6·D adaLN)
  int rows = 16;    // token rows a block (the kernels' default, adaln::kRowsPerBlock)
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

inline std::vector<float> Random(size_t n, uint64_t seed, double scale, double offset = 0) {
  Rng rng(seed, RngStream::kData);
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>(rng.Normal() * scale + offset);
  return v;
}

inline std::vector<uint16_t> ToBits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    bits[i] = simt::FloatToBf16(v[i]);
  return bits;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<double> ToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    v[i] = simt::Bf16ToFloat(bits[i]);
  return v;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The operands of one case: the stream, the branch, the adaLN outputs and the gradients from
// above, and where in the adaLN outputs (units of floats) shift, scale and gate are.
struct Operands {
  explicit Operands(const Case& c)
      : c(c),
        n(size_t(c.B) * c.T * c.D),
        mod_stride((c.final_norm ? 2 : 6) * c.D),
        shift(c.final_norm ? 0 : 3 * c.D),
        scale(c.final_norm ? c.D : 4 * c.D),
        gate_stride(c.final_norm ? 6 * c.D : mod_stride),
        gate(c.final_norm ? 5 * c.D : 2 * c.D),
        x(Random(n, 1, 1.5, 2.0)),  // a non-zero mean exercises the two-pass variance
        y(ToBits(Random(n, 2, 1.0))),
        add(Random(size_t(c.T) * c.D, 3, 0.5)),
        mod_ada(Random(size_t(c.B) * mod_stride, 4, 0.5)),
        gate_ada(c.final_norm ? Random(size_t(c.B) * gate_stride, 5, 0.5) : std::vector<float>()),
        dh(ToBits(Random(n, 6, 1.0))),
        dx0(Random(n, 7, 1.0)),
        d_mod_ada0(Random(mod_ada.size(), 8, 1.0)),
        d_gate_ada0(Random(gate_ada.size(), 9, 1.0)) {}

  // The gate's adaLN output: the final layer's is the last block's; a block's own otherwise.
  const std::vector<float>& GateAda() const { return c.final_norm ? gate_ada : mod_ada; }

  const Case& c;
  size_t n;
  int mod_stride, shift, scale, gate_stride, gate;
  std::vector<float> x;
  std::vector<uint16_t> y;
  std::vector<float> add, mod_ada, gate_ada;
  std::vector<uint16_t> dh;
  std::vector<float> dx0, d_mod_ada0, d_gate_ada0;
};

// What the forward, then the backward, gave. x_out is empty without a branch or add (the stream
// is then not written), dy and bias without a branch; d_gate_ada is empty unless the final norm
// (a block's gate gradient lands in d_mod_ada). bias: Σ dy over every sample.
struct Outputs {
  std::vector<float> x_out, mean, rstd;
  std::vector<uint16_t> h;
  std::vector<float> dx, d_mod_ada, d_gate_ada, bias;
  std::vector<uint16_t> dy;
};

inline void ExpectSameBits(const Outputs& a, const Outputs& b) {
  EXPECT_TRUE(SameBits(a.x_out, b.x_out)) << "x'";
  EXPECT_TRUE(a.h == b.h) << "h";
  EXPECT_TRUE(SameBits(a.mean, b.mean) && SameBits(a.rstd, b.rstd)) << "mean, rstd";
  EXPECT_TRUE(SameBits(a.dx, b.dx)) << "dx";
  EXPECT_TRUE(a.dy == b.dy) << "dy";
  EXPECT_TRUE(SameBits(a.d_mod_ada, b.d_mod_ada) && SameBits(a.d_gate_ada, b.d_gate_ada))
      << "adaLN gradients";
  EXPECT_TRUE(SameBits(a.bias, b.bias)) << "Σ dy";
}

// Checks a run's outputs against the references in double: the forward from the operands; the
// backward from the run's own x', mean and rstd, as the kernels read them.
inline void ExpectMatchesTheReference(const Operands& o, const Outputs& r) {
  const Case& c = o.c;
  const int B = c.B, T = c.T, D = c.D, rows = B * T;
  const size_t n = o.n;
  const bool writes_stream = c.gated || c.add;

  // Forward: x' = x + gate·y + add; h = LN(x')·(1 + scale) + shift.
  const std::vector<double> y = ToDouble(o.y), mod_ada = ToDouble(o.mod_ada);
  const std::vector<double> gate_ada = ToDouble(o.GateAda());
  std::vector<double> xp = ToDouble(o.x);
  if (c.gated) {
    cpu::GatedResidualForward<double>(xp.data(), xp.data(), y.data(), gate_ada.data() + o.gate,
                                      o.gate_stride, B, T, D);
  }
  if (c.add) {
    for (size_t i = 0; i < n; ++i)
      xp[i] += o.add[(i / D) % T * D + i % D];
  }
  std::vector<double> ln(n), mean(rows), rstd(rows), h(n);
  cpu::LayerNormForward<double>(ln.data(), mean.data(), rstd.data(), xp.data(), rows, D, 1e-6);
  cpu::ModulateForward<double>(h.data(), ln.data(), mod_ada.data() + o.shift,
                               mod_ada.data() + o.scale, o.mod_stride, B, T, D);
  if (writes_stream) {
    EXPECT_LE(RelativeL2(ToDouble(r.x_out), xp), 1e-6) << "x'";
  }
  EXPECT_LE(RelativeL2(ToDouble(r.mean), mean), 1e-5) << "mean";
  EXPECT_LE(RelativeL2(ToDouble(r.rstd), rstd), 1e-5) << "rstd";
  // Each element of h within half a bf16 step (2^-8 relative) of the reference, and a little
  // for fp32's arithmetic.
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double got = simt::Bf16ToFloat(r.h[i]);
    if (!(std::abs(got - h[i]) <= std::abs(h[i]) * 0x1.02p-8 + 1e-5) && bad++ < 5)
      ADD_FAILURE() << "h[" << i << "] = " << got << ", want " << h[i];
  }
  EXPECT_EQ(bad, 0) << "elements of h off by more than bf16 rounding";

  // Backward.
  const std::vector<double> xk = ToDouble(writes_stream ? r.x_out : o.x);
  const std::vector<double> mean_k = ToDouble(r.mean), rstd_k = ToDouble(r.rstd);
  std::vector<double> xhat(n);
  for (size_t i = 0; i < n; ++i)
    xhat[i] = (xk[i] - mean_k[i / D]) * rstd_k[i / D];
  const std::vector<double> dh = ToDouble(o.dh);
  std::vector<double> dln(n, 0.0), dx = ToDouble(o.dx0), d_mod_ada = ToDouble(o.d_mod_ada0);
  cpu::ModulateBackward<double>(dln.data(), d_mod_ada.data() + o.shift, d_mod_ada.data() + o.scale,
                                dh.data(), xhat.data(), mod_ada.data() + o.scale, o.mod_stride, B,
                                T, D);
  cpu::LayerNormBackward<double>(dx.data(), dln.data(), xk.data(), mean_k.data(), rstd_k.data(),
                                 rows, D);
  EXPECT_LE(RelativeL2(ToDouble(r.dx), dx), 1e-5) << "dx";
  std::vector<double> d_gate_ada = c.final_norm ? ToDouble(o.d_gate_ada0) : d_mod_ada;
  if (c.gated) {
    std::vector<double> dy(n, 0.0), bias(D, 0.0);
    cpu::GatedResidualBackward<double>(nullptr, dy.data(), d_gate_ada.data() + o.gate, dx.data(),
                                       y.data(), gate_ada.data() + o.gate, o.gate_stride, B, T, D);
    EXPECT_LE(RelativeL2(ToDouble(r.dy), dy), 5e-3) << "dy";
    for (size_t i = 0; i < n; ++i)
      bias[i % D] += dy[i];
    EXPECT_LE(RelativeL2(ToDouble(r.bias), bias), 5e-3) << "Σ dy";
  }
  // The adaLN gradients: the whole buffers (the other slices keep their values), then the
  // increments alone, so that a small error is not hidden by the starting values.
  const auto expect_increments = [](const std::vector<float>& got, const std::vector<float>& start,
                                    const std::vector<double>& want, const char* what) {
    EXPECT_LE(RelativeL2(ToDouble(got), want), 1e-5) << what;
    std::vector<double> got_inc(got.size()), want_inc(got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      got_inc[i] = double(got[i]) - start[i];
      want_inc[i] = want[i] - start[i];
    }
    EXPECT_LE(RelativeL2(got_inc, want_inc), 1e-4) << what << ", the increments";
  };
  if (c.final_norm) {
    expect_increments(r.d_mod_ada, o.d_mod_ada0, d_mod_ada, "the final adaLN's gradient");
    if (c.gated) {
      expect_increments(r.d_gate_ada, o.d_gate_ada0, d_gate_ada, "the last block's adaLN gradient");
    }
  } else {
    expect_increments(r.d_mod_ada, o.d_mod_ada0, c.gated ? d_gate_ada : d_mod_ada,
                      "the block's adaLN gradient");
  }
}

}  // namespace difftrain::adaln_testing
