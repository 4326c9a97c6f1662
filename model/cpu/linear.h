// Linear layer: out[N, O] = in[N, I] · weight[O, I]ᵀ + bias[O]   (PyTorch's nn.Linear).
//
// Backward adds into every gradient it is given (dweight, dbias and din: `+=`); a null
// pointer skips that gradient (din of a layer fed by data, for example).
#pragma once

namespace difftrain::cpu {

template <typename T>
void LinearForward(T* out, const T* in, const T* weight, const T* bias, int N, int I, int O);

template <typename T>
void LinearBackward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                    int N, int I, int O);

}  // namespace difftrain::cpu
