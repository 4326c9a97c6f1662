// ClipPass (model/text/clip_pass.h): in float it is TextEncoder::Encode's forward pass from the
// input embeddings, bit for bit; in double its input gradient and its Linear layers' weight
// gradients match central differences, for each activation, with and without the final
// LayerNorm and with layers skipped.
#include "model/text/clip_pass.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/cpu/gradcheck.h"
#include "model/text/encoder.h"
#include "model/text/encoder_names.h"
#include "model/text/text_testing.h"

namespace difftrain {
namespace {

namespace gc = cpu::gradcheck;

TextEncoderConfig TinyClip(TextActivation act) {
  return testing::ClipConfig(/*vocab_size=*/20, /*hidden_size=*/8, /*intermediate_size=*/12,
                             /*num_layers=*/3, /*num_heads=*/2, /*max_positions=*/7, act);
}

struct PassCase {
  TextActivation activation;
  int skip_layers;
  bool final_norm;
};

std::string Describe(const PassCase& p) {
  const char* activation = p.activation == TextActivation::kGelu       ? "gelu"
                           : p.activation == TextActivation::kGeluTanh ? "gelu_tanh"
                                                                       : "quick_gelu";
  return fmt::format("{}_skip{}{}", activation, p.skip_layers,
                     p.final_norm ? "" : "_no_final_norm");
}

void PrintTo(const PassCase& p, std::ostream* os) {
  *os << Describe(p);
}

std::string CaseName(const ::testing::TestParamInfo<PassCase>& info) {
  return Describe(info.param);
}

class ClipPassTest : public ::testing::TestWithParam<PassCase> {};

TEST_P(ClipPassTest, FloatForwardIsEncode) {
  const PassCase p = GetParam();
  const TextEncoderConfig c = TinyClip(p.activation);
  std::mt19937 rng(3);
  const gc::Vector w = gc::Random(TextEncoder::Tensors(c).total(), rng, -0.6, 0.6);
  TextEncoder encoder(c, gc::Convert<float>(w));
  std::vector<text::Tokens> texts(3);
  for (int n = 0; n < 3; ++n) {
    for (int l = 0; l < 6; ++l) {
      texts[n].ids.push_back((n * 7 + l * 3) % c.vocab_size);
      texts[n].mask.push_back(1);
    }
  }
  const size_t size = 3 * 6 * c.hidden_size;
  std::vector<float> expected(size), x(size), out(size);
  ASSERT_TRUE(encoder.Encode(texts, p.skip_layers, expected.data(), p.final_norm).ok());
  ASSERT_TRUE(encoder.InputEmbeddings(texts, x.data()).ok());
  ClipPass<float> pass(c, encoder.weights());
  pass.Forward(x.data(), 3, 6, p.skip_layers, p.final_norm, out.data());
  EXPECT_EQ(out, expected);
}

TEST_P(ClipPassTest, InputGradientMatchesCentralDifferences) {
  const PassCase p = GetParam();
  const TextEncoderConfig c = TinyClip(p.activation);
  std::mt19937 rng(5);
  const gc::Vector w = gc::Random(TextEncoder::Tensors(c).total(), rng, -0.6, 0.6);
  const int N = 2, L = 5;
  const size_t size = size_t(N) * L * c.hidden_size;
  gc::Vector x = gc::Random(size, rng), dout = gc::Random(size, rng), dx(size), out(size);
  ClipPass<double> pass(c, w.data());
  pass.Forward(x.data(), N, L, p.skip_layers, p.final_norm, out.data());
  pass.Backward(dout.data(), dx.data());
  ClipPass<double> probe(c, w.data());
  const gc::ForwardFn forward = [&](gc::Vector& y) {
    probe.Forward(x.data(), N, L, p.skip_layers, p.final_norm, y.data());
  };
  EXPECT_TRUE(gc::GradientMatches(x, dx, dout, forward));
  // Backward writes dx: a second call gives the same.
  gc::Vector again(size, 7.0);
  pass.Backward(dout.data(), again.data());
  EXPECT_EQ(again, dx);
}

// Every Linear weight of the layers taken, each checked on its own: the loss as a function of
// that tensor. The input's gradient is unchanged by asking for weight gradients too.
TEST_P(ClipPassTest, WeightGradientsMatchCentralDifferences) {
  const PassCase p = GetParam();
  const TextEncoderConfig c = TinyClip(p.activation);
  const TensorTable table = TextEncoder::Tensors(c);
  std::mt19937 rng(7);
  const gc::Vector w = gc::Random(table.total(), rng, -0.6, 0.6);
  const int N = 2, L = 5;
  const size_t size = size_t(N) * L * c.hidden_size;
  const gc::Vector x = gc::Random(size, rng), dout = gc::Random(size, rng);
  std::vector<std::string> weights;
  for (int i = 0; i < c.num_layers - p.skip_layers; ++i) {
    const text::LayerNames n = text::EncoderLayer(c, i);
    for (const std::string& m : {n.q, n.k, n.v, n.out, n.fc1, n.fc2})
      weights.push_back(m + ".weight");
  }
  gc::Vector grads(table.total(), 0.0), dx(size), plain_dx(size), out(size);
  ClipPass<double> pass(c, w.data());
  pass.SetWeightGradients(grads.data(), weights);
  pass.Forward(x.data(), N, L, p.skip_layers, p.final_norm, out.data());
  pass.Backward(dout.data(), dx.data());
  ClipPass<double> plain(c, w.data());
  plain.Forward(x.data(), N, L, p.skip_layers, p.final_norm, out.data());
  plain.Backward(dout.data(), plain_dx.data());
  EXPECT_EQ(dx, plain_dx);
  for (const std::string& name : weights) {
    const TensorSpec* t = table.Find(name);
    gc::Vector probed = w, tensor(w.begin() + t->offset, w.begin() + t->offset + t->numel);
    const gc::Vector grad(grads.begin() + t->offset, grads.begin() + t->offset + t->numel);
    ClipPass<double> probe(c, probed.data());
    const gc::ForwardFn forward = [&](gc::Vector& y) {
      std::copy(tensor.begin(), tensor.end(), probed.begin() + t->offset);
      probe.Forward(x.data(), N, L, p.skip_layers, p.final_norm, y.data());
    };
    // q's and k's gradients are ~1e-5 of the output's scale (small scores through the softmax),
    // where the differences' rounding (~1e-11) is already 1e-7 of them: a bound of 1e-6.
    EXPECT_TRUE(gc::GradientMatches(tensor, grad, dout, forward, 1e-6)) << name;
  }
  // Nothing else is written: the LayerNorms' and embeddings' entries stay zero.
  for (const TensorSpec& t : table.tensors()) {
    if (std::find(weights.begin(), weights.end(), t.name) != weights.end()) continue;
    for (size_t j = 0; j < t.numel; ++j)
      ASSERT_EQ(grads[t.offset + j], 0.0) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, ClipPassTest,
                         ::testing::Values(PassCase{TextActivation::kQuickGelu, 0, true},
                                           PassCase{TextActivation::kGelu, 0, true},
                                           PassCase{TextActivation::kGeluTanh, 1, true},
                                           PassCase{TextActivation::kQuickGelu, 1, false}),
                         CaseName);

TEST(ClipPassInputs, BertIsRefusedByName) {
  TextEncoderConfig c = TinyClip(TextActivation::kGelu);
  c.kind = TextEncoderKind::kBert;
  c.type_vocab_size = 2;
  TextEncoder bert(c, std::vector<float>(TextEncoder::Tensors(c).total()));
  std::vector<float> x(8);
  const Status s = bert.InputEmbeddings({text::Tokens{{1}, {1}}}, x.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("CLIP"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace difftrain
