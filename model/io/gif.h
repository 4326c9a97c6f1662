// Animated GIF (GIF89a) for sampled videos (`difftrain sample` of a video model), written
// by hand: the format is small and no GIF library is among the build's packages.
//
// Frames are 8-bit, row-major and interleaved (H × W × channels) as PNG's. Grey frames
// (channels 1) keep every level (a palette of 256 greys); RGB frames (channels 3) are
// quantized to the 3-3-2 palette of 256 colours. Each frame is one LZW-coded image of the
// whole canvas, shown for `delay_cs` hundredths of a second, and the animation loops
// forever (the NETSCAPE2.0 extension).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace difftrain::io {

// Writes `frames` (each W × H × channels bytes) atomically, as WritePng does.
Status WriteGif(const std::string& path, const std::vector<const uint8_t*>& frames, int width,
                int height, int channels, int delay_cs);

// The LZW code stream of one image's palette indices, with minimum code size 8 (GIF's
// sub-blocks not yet applied): exposed for tests.
std::vector<uint8_t> GifLzw(const uint8_t* indices, size_t n);

}  // namespace difftrain::io
