// 2-D convolution over NCHW tensors (PyTorch's nn.Conv2d, groups 1, dilation 1), square
// kernel K, stride S, zero padding P on every side:
//   out[b, o, i, j] = bias[o] + Σ_{c, ki, kj} weight[o, c, ki, kj] · in[b, c, i·S + ki − P, j·S +
//   kj − P]
// with Ho = (H + 2P − K) / S + 1 (likewise Wo), reading zero outside the input.
//
// A group of samples is one GEMM on OpenBLAS: weight [Co, C·K·K] times the im2col matrix
// [C·K·K, n·Ho·Wo] of the group's n samples side by side (model/cpu/conv2d.cc says how many).
// Backward adds into every gradient it is given (din, dweight, dbias: `+=`); a null pointer
// skips that gradient.
#pragma once

namespace difftrain::cpu {

struct Conv2dShape {
  int B, C, H, W;  // input
  int Co, K, S, P;
  int Ho() const { return (H + 2 * P - K) / S + 1; }
  int Wo() const { return (W + 2 * P - K) / S + 1; }
};

template <typename T>
void Conv2dForward(T* out, const T* in, const T* weight, const T* bias, const Conv2dShape& s);

template <typename T>
void Conv2dBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                    const Conv2dShape& s);

}  // namespace difftrain::cpu
