#include "model/io/half.h"

namespace difftrain::io {

void RoundFloats(const float* src, size_t n, bool bf16, uint16_t* dst) {
  if (bf16) {
    for (size_t i = 0; i < n; ++i)
      dst[i] = FloatToBf16Bits(src[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i)
    dst[i] = std::bit_cast<uint16_t>(static_cast<_Float16>(src[i]));
}

}  // namespace difftrain::io
