// The text encoders' activations (model/text/config.h's TextActivation), in place, as the
// inference pass (encoder.cc) and the training pass (clip_pass.cc) both apply them.
#pragma once

#include <cmath>
#include <cstddef>

#include "model/cpu/activation.h"
#include "model/text/config.h"

namespace difftrain::text {

template <typename T>
void Activate(TextActivation act, T* x, size_t n) {
  switch (act) {
    case TextActivation::kGelu:
      for (size_t i = 0; i < n; ++i)
        x[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * T(0.70710678118654752)));
      break;
    case TextActivation::kGeluTanh:
      cpu::GeluForward(x, x, n);
      break;
    case TextActivation::kQuickGelu:
      for (size_t i = 0; i < n; ++i)
        x[i] = x[i] / (T(1) + std::exp(T(-1.702) * x[i]));
      break;
  }
}

}  // namespace difftrain::text
