#include "model/cpu/groupnorm.h"

#include <algorithm>
#include <cstddef>

#include "common/check.h"
#include "model/cpu/affine.h"
#include "model/cpu/layernorm.h"

namespace difftrain::cpu {

template <typename T>
void GroupNormForward(T* out, T* xhat, T* mean, T* rstd, const T* in, const T* weight,
                      const T* bias, const GroupNormShape& s, T eps) {
  DT_CHECK(s.C % s.G == 0, "{} channels do not split into {} groups", s.C, s.G);
  LayerNormForward(xhat, mean, rstd, in, s.B * s.G, s.C / s.G * s.HW, eps);
  ChannelAffineForward(out, xhat, weight, bias, s.B, s.C, s.HW);
}

template <typename T>
void GroupNormBackward(T* din, T* dweight, T* dbias, T* dxhat, const T* dout, const T* in,
                       const T* xhat, const T* mean, const T* rstd, const T* weight,
                       const GroupNormShape& s) {
  std::fill(dxhat, dxhat + static_cast<size_t>(s.B) * s.C * s.HW, T(0));
  ChannelAffineBackward(dxhat, dweight, dbias, dout, xhat, weight, s.B, s.C, s.HW);
  LayerNormBackward(din, dxhat, in, mean, rstd, s.B * s.G, s.C / s.G * s.HW);
}

template void GroupNormForward<float>(float*, float*, float*, float*, const float*, const float*,
                                      const float*, const GroupNormShape&, float);
template void GroupNormForward<double>(double*, double*, double*, double*, const double*,
                                       const double*, const double*, const GroupNormShape&, double);
template void GroupNormBackward<float>(float*, float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, const float*,
                                       const GroupNormShape&);
template void GroupNormBackward<double>(double*, double*, double*, double*, const double*,
                                        const double*, const double*, const double*, const double*,
                                        const double*, const GroupNormShape&);

}  // namespace difftrain::cpu
