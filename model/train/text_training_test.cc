// The memory a run's training through a text encoder holds (model/train/text_training.h):
// EncoderPassBytes is what EncoderPasses keeps of a micro-batch after its backward, with and
// without the Linear layers' inputs a LoRA's weight gradients read, with layers skipped; and
// PlanTextEncoderMemory counts the encoder's weights with a textual inversion's new rows.
#include "model/train/text_training.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/text/encoder.h"
#include "model/text/encoder_names.h"
#include "model/text/text_testing.h"

namespace difftrain {
namespace {

// A CLIP text model of 4 layers, D 16, F 40, 4 heads and 9 positions, weights N(0, 0.1²).
TextEncoder SmallClip() {
  const TextEncoderConfig c = testing::ClipConfig(30, 16, 40, 4, 4, 9, TextActivation::kQuickGelu);
  std::vector<float> weights(TextEncoder::Tensors(c).total());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (float& w : weights)
    w = normal(rng);
  return TextEncoder(c, std::move(weights));
}

// `n` texts of `length` token ids (any in the vocabulary), all attended.
std::vector<text::Tokens> Texts(int n, int length) {
  std::vector<text::Tokens> texts(n);
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l < length; ++l) {
      texts[i].ids.push_back((i * 7 + l * 3) % 30);
      texts[i].mask.push_back(1);
    }
  }
  return texts;
}

TEST(TextTrainingMemoryTest, APassKeepsWhatEncoderPassBytesCounts) {
  TextEncoder encoder = SmallClip();
  const TextEncoderConfig& c = encoder.config();
  for (const int skip : {0, 1}) {
    const int length = 9, D = c.hidden_size;
    EncoderPasses passes(encoder, length, skip);
    // Slot 0 without weight gradients (a textual inversion); slot 1 with an MLP and an attention
    // weight's (a LoRA).
    std::vector<float> grads(TextEncoder::Tensors(c).total());
    const text::LayerNames layer = text::EncoderLayer(c, 0);
    passes.SetSlots(1);
    std::vector<float> context(3 * length * D), dcontext(context.size(), 0.5f);
    ASSERT_TRUE(passes.Encode(0, Texts(3, length), context.data()).ok());
    passes.Backward(0, dcontext.data());
    EXPECT_EQ(passes.HeldBytes(0), EncoderPassBytes(c, 3, length, skip, false)) << skip;

    passes.SetSlots(2, grads.data(), {layer.q + ".weight", layer.fc2 + ".weight"});
    std::vector<float> two(2 * length * D), dtwo(two.size(), 0.25f);
    ASSERT_TRUE(passes.Encode(1, Texts(2, length), two.data()).ok());
    passes.Backward(1, dtwo.data());
    EXPECT_EQ(passes.HeldBytes(1), EncoderPassBytes(c, 2, length, skip, true)) << skip;
    EXPECT_GT(EncoderPassBytes(c, 2, length, skip, true),
              EncoderPassBytes(c, 2, length, skip, false));
  }
}

TEST(TextTrainingMemoryTest, APlanCountsTheWeightsTheNewTokensAndEachSlot) {
  TextEncoder encoder = SmallClip();
  const TextEncoderConfig& c = encoder.config();
  Result<TextEncoderMemory> one = PlanTextEncoderMemory(c, nullptr, 0, 2, 1, 9, 0);
  Result<TextEncoderMemory> inversion = PlanTextEncoderMemory(c, nullptr, 3, 2, 1, 9, 0);
  Result<TextEncoderMemory> two = PlanTextEncoderMemory(c, nullptr, 0, 2, 2, 9, 0);
  ASSERT_TRUE(one.ok() && inversion.ok() && two.ok());
  EXPECT_EQ(one->weights, encoder.tensors().total() * sizeof(float));
  EXPECT_EQ(inversion->weights - one->weights, 3 * c.hidden_size * sizeof(float));
  EXPECT_EQ(one->lora, 0u);
  // Each slot in flight: its pass and its context's gradient.
  EXPECT_EQ(two->activations - one->activations,
            EncoderPassBytes(c, 2, 9, 0, false) + 2 * 9 * c.hidden_size * sizeof(float));
}

}  // namespace
}  // namespace difftrain
