// The GIF writer against an independent decoder (Pillow, from Debian's python3-pil):
// every frame decodes to the pixels written, for images whose LZW streams widen their codes
// to 12 bits and restart the table, and RGB frames decode to their 3-3-2 palette colours.
#include "model/io/gif.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <vector>

#include "common/temp_dir.h"
#include "tests/testing/run_command.h"

namespace difftrain::io {
namespace {

using testing::RunCommand;
using testing::ShellQuote;

// Decodes `gif` with Pillow and compares every frame (as RGB) with `raw`, the frames' RGB
// bytes one after another; prints the first difference.
constexpr const char* kCompare = R"(
import sys
from PIL import Image, ImageSequence
gif, raw = sys.argv[1], open(sys.argv[2], "rb").read()
image = Image.open(gif)
decoded = b"".join(f.convert("RGB").tobytes() for f in ImageSequence.Iterator(image))
if image.format != "GIF" or decoded != raw:
    at = next((i for i, (a, b) in enumerate(zip(decoded, raw)) if a != b), min(len(decoded), len(raw)))
    sys.exit(f"differs at byte {at}: {len(decoded)} bytes decoded, {len(raw)} expected")
print(f"{image.n_frames} frames of {image.size} match; loop {image.info.get('loop')}, "
      f"duration {image.info.get('duration')}")
)";

void ExpectPillowDecodes(const std::vector<std::vector<uint8_t>>& frames, int W, int H, int C,
                         const std::vector<uint8_t>& expected_rgb) {
  TempDir dir("gif_test");
  const std::string gif = dir.path() + "/video.gif", raw = dir.path() + "/frames.rgb";
  std::vector<const uint8_t*> pointers;
  for (const auto& f : frames)
    pointers.push_back(f.data());
  ASSERT_TRUE(WriteGif(gif, pointers, W, H, C, 7).ok());
  std::ofstream(raw, std::ios::binary)
      .write(reinterpret_cast<const char*>(expected_rgb.data()), expected_rgb.size());
  const std::string script = dir.path() + "/compare.py";
  std::ofstream(script) << kCompare;
  const testing::CommandResult r = RunCommand("/usr/bin/python3 " + ShellQuote(script) + " " +
                                              ShellQuote(gif) + " " + ShellQuote(raw));
  if (r.output.find("No module named 'PIL'") != std::string::npos)
    GTEST_SKIP() << "Pillow (python3-pil) is not installed: scripts/install-deps.sh installs it";
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("loop 0, duration 70"), std::string::npos) << r.output;
}

// Grey frames of several kinds: noise (many codes: the table fills and restarts), a flat
// frame (long runs: few codes), gradients; sizes chosen so that streams end at various
// code widths.
TEST(GifTest, GreyFramesDecodeToThePixelsWritten) {
  std::mt19937 rng(7);
  for (auto [W, H] : {std::pair{1, 1}, {3, 5}, {64, 64}, {130, 97}, {255, 2}}) {
    std::vector<std::vector<uint8_t>> frames;
    std::vector<uint8_t> rgb;
    for (int f = 0; f < 4; ++f) {
      std::vector<uint8_t> frame(size_t(W) * H);
      for (size_t p = 0; p < frame.size(); ++p) {
        frame[p] = f == 0   ? static_cast<uint8_t>(rng())
                   : f == 1 ? 200
                   : f == 2 ? static_cast<uint8_t>((p % W) * 255 / std::max(1, W - 1))
                            : static_cast<uint8_t>(rng() % 3 * 100);
      }
      for (uint8_t v : frame)
        rgb.insert(rgb.end(), {v, v, v});
      frames.push_back(std::move(frame));
    }
    ExpectPillowDecodes(frames, W, H, 1, rgb);
  }
}

// An LZW stream of 300,000 noise bytes widens to 12-bit codes and restarts its table many
// times; Pillow decodes it whole.
TEST(GifTest, LongNoiseFrameRestartsItsTable) {
  std::mt19937 rng(11);
  const int W = 600, H = 500;
  std::vector<uint8_t> frame(size_t(W) * H), rgb;
  for (uint8_t& v : frame) {
    v = static_cast<uint8_t>(rng() % 256);
    rgb.insert(rgb.end(), {v, v, v});
  }
  ExpectPillowDecodes({frame}, W, H, 1, rgb);
}

// RGB pixels map to the nearest level of 3 bits red, 3 green and 2 blue.
TEST(GifTest, RgbFramesDecodeToTheirPaletteColours) {
  const int W = 16, H = 16;
  std::vector<uint8_t> frame(size_t(W) * H * 3), rgb;
  for (int p = 0; p < W * H; ++p) {
    const uint8_t r = static_cast<uint8_t>(p), g = static_cast<uint8_t>(255 - p),
                  b = static_cast<uint8_t>(p * 7);
    frame[3 * p] = r;
    frame[3 * p + 1] = g;
    frame[3 * p + 2] = b;
    rgb.push_back(static_cast<uint8_t>((r * 7 + 127) / 255 * 255 / 7));
    rgb.push_back(static_cast<uint8_t>((g * 7 + 127) / 255 * 255 / 7));
    rgb.push_back(static_cast<uint8_t>((b * 3 + 127) / 255 * 255 / 3));
  }
  ExpectPillowDecodes({frame}, W, H, 3, rgb);
}

TEST(GifTest, RefusesWhatItCannotWrite) {
  TempDir dir("gif_test");
  const uint8_t pixel = 0;
  EXPECT_FALSE(WriteGif(dir.path() + "/a.gif", {}, 1, 1, 1, 10).ok());
  EXPECT_FALSE(WriteGif(dir.path() + "/a.gif", {&pixel}, 1, 1, 2, 10).ok());
  EXPECT_FALSE(WriteGif(dir.path() + "/a.gif", {&pixel}, 0, 1, 1, 10).ok());
}

}  // namespace
}  // namespace difftrain::io
