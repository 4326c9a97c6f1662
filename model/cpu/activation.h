// Elementwise activations over n values: GELU with the tanh approximation (DiT's MLP) and
// SiLU (the adaLN input and the timestep MLP). Backward adds into din.
//
// GEGLU (the Stable Diffusion UNet's feed-forward, Shazeer 2020): rows of in [N, 2F] hold
// (x, gate) side by side; out [N, F] = x · GELU(gate) with the exact GELU,
// GELU(g) = g · Φ(g) = g/2 · (1 + erf(g/√2)). Backward adds into both halves of din.
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

template <typename T>
void GegluForward(T* out, const T* in, size_t N, size_t F);
template <typename T>
void GegluBackward(T* din, const T* dout, const T* in, size_t N, size_t F);

}  // namespace difftrain::cpu
