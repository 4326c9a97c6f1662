// Elementwise activations over n values: GELU with the tanh approximation (DiT's MLP) and
// SiLU (the adaLN input and the timestep MLP). Backward adds into din.
#pragma once

#include <cstddef>

namespace difftrain::cpu {

template <typename T>
void GeluForward(T* out, const T* in, size_t n);
template <typename T>
void GeluBackward(T* din, const T* dout, const T* in, size_t n);

template <typename T>
void SiluForward(T* out, const T* in, size_t n);
template <typename T>
void SiluBackward(T* din, const T* dout, const T* in, size_t n);

}  // namespace difftrain::cpu
