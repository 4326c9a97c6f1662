#include "model/cpu/embed.h"

#include <cmath>
#include <cstddef>

#include "common/check.h"

namespace difftrain::cpu {
namespace {

// Index of img[b, c, y, x] and of its unpatchified token feature; shared so that forward
// and backward of Unpatchify are the same permutation by construction.
struct PatchIndex {
  int C, H, W, p;
  size_t Image(int b, int c, int y, int x) const {
    return ((static_cast<size_t>(b) * C + c) * H + y) * W + x;
  }
  size_t Token(int b, int c, int y, int x) const {
    const int grid_w = W / p;
    const size_t t = static_cast<size_t>(y / p) * grid_w + x / p;
    const int feature = ((y % p) * p + x % p) * C + c;
    return (static_cast<size_t>(b) * (H / p) * grid_w + t) * p * p * C + feature;
  }
};

}  // namespace

template <typename T>
void Patchify(T* patches, const T* img, int B, int C, int H, int W, int p) {
  DT_CHECK(H % p == 0 && W % p == 0, "image {}x{} is not divisible by patch {}", H, W, p);
  const int gw = W / p, tokens = (H / p) * gw, features = C * p * p;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < tokens; ++t) {
      const int i = t / gw, j = t % gw;
      T* row = patches + (static_cast<size_t>(b) * tokens + t) * features;
      for (int c = 0; c < C; ++c) {
        for (int ki = 0; ki < p; ++ki) {
          for (int kj = 0; kj < p; ++kj) {
            row[(c * p + ki) * p + kj] =
                img[((static_cast<size_t>(b) * C + c) * H + i * p + ki) * W + j * p + kj];
          }
        }
      }
    }
  }
}

template <typename T>
void UnpatchifyForward(T* img, const T* tokens, int B, int C, int H, int W, int p) {
  DT_CHECK(H % p == 0 && W % p == 0, "image {}x{} is not divisible by patch {}", H, W, p);
  const PatchIndex idx{C, H, W, p};
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int c = 0; c < C; ++c) {
      for (int y = 0; y < H; ++y) {
        for (int x = 0; x < W; ++x)
          img[idx.Image(b, c, y, x)] = tokens[idx.Token(b, c, y, x)];
      }
    }
  }
}

template <typename T>
void UnpatchifyBackward(T* dtokens, const T* dimg, int B, int C, int H, int W, int p) {
  DT_CHECK(H % p == 0 && W % p == 0, "image {}x{} is not divisible by patch {}", H, W, p);
  const PatchIndex idx{C, H, W, p};
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int c = 0; c < C; ++c) {
      for (int y = 0; y < H; ++y) {
        for (int x = 0; x < W; ++x)
          dtokens[idx.Token(b, c, y, x)] += dimg[idx.Image(b, c, y, x)];
      }
    }
  }
}

namespace {

// [sin(pos·ω_k)…, cos(pos·ω_k)…] for k < half, ω_k = 10000^(−k/half), into row[0, 2·half).
void SinCosRow(float* row, double pos, int half) {
  for (int k = 0; k < half; ++k) {
    const double omega = 1.0 / std::pow(10000.0, static_cast<double>(k) / half);
    row[k] = static_cast<float>(std::sin(pos * omega));
    row[half + k] = static_cast<float>(std::cos(pos * omega));
  }
}

}  // namespace

void SinCos2DPositionEmbedding(float* out, int grid, int D) {
  DT_CHECK(D % 4 == 0, "sin-cos position embedding needs D divisible by 4, got {}", D);
  for (int i = 0; i < grid; ++i) {
    for (int j = 0; j < grid; ++j) {
      float* row = out + (static_cast<size_t>(i) * grid + j) * D;
      // First half encodes the column (MAE's meshgrid puts w first), second half the row.
      SinCosRow(row, j, D / 4);
      SinCosRow(row + D / 2, i, D / 4);
    }
  }
}

void SinCos1DEmbedding(float* out, int length, int D) {
  DT_CHECK(D % 2 == 0, "1-D sin-cos embedding needs an even D, got {}", D);
  for (int f = 0; f < length; ++f)
    SinCosRow(out + static_cast<size_t>(f) * D, f, D / 2);
}

template <typename T>
void TimestepFrequencies(T* out, const T* t, int B, int dim) {
  DT_CHECK(dim % 2 == 0, "timestep embedding dimension {} must be even", dim);
  const int half = dim / 2;
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < half; ++k) {
      const double freq = std::exp(-std::log(10000.0) * k / half);
      const double arg = static_cast<double>(t[b]) * freq;
      out[static_cast<size_t>(b) * dim + k] = static_cast<T>(std::cos(arg));
      out[static_cast<size_t>(b) * dim + half + k] = static_cast<T>(std::sin(arg));
    }
  }
}

void GuidanceScaleEmbedding(float* out, double scale, int dim) {
  DT_CHECK(dim >= 4, "a guidance scale embedding of {} features (at least 4)", dim);
  const int half = dim / 2;
  // Each operation rounded to float32, as torch's float32 tensors are.
  const float w = static_cast<float>(scale - 1) * 1000.0f;
  const float step = std::log(10000.0f) / static_cast<float>(half - 1);
  for (int k = 0; k < half; ++k) {
    const float arg = w * std::exp(static_cast<float>(k) * -step);
    out[k] = std::sin(arg);
    out[half + k] = std::cos(arg);
  }
  if (dim % 2 == 1) out[dim - 1] = 0;
}

template <typename T>
void EmbeddingForward(T* out, const T* table, const int32_t* labels, int B, int D) {
  for (int b = 0; b < B; ++b) {
    const T* row = table + static_cast<size_t>(labels[b]) * D;
    for (int d = 0; d < D; ++d)
      out[static_cast<size_t>(b) * D + d] = row[d];
  }
}

template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* labels, int B, int D) {
  // Sequential over samples: two samples may share a label and so a row.
  for (int b = 0; b < B; ++b) {
    T* row = dtable + static_cast<size_t>(labels[b]) * D;
    for (int d = 0; d < D; ++d)
      row[d] += dout[static_cast<size_t>(b) * D + d];
  }
}

#define DIFFTRAIN_INSTANTIATE(T)                                              \
  template void Patchify<T>(T*, const T*, int, int, int, int, int);           \
  template void UnpatchifyForward<T>(T*, const T*, int, int, int, int, int);  \
  template void UnpatchifyBackward<T>(T*, const T*, int, int, int, int, int); \
  template void TimestepFrequencies<T>(T*, const T*, int, int);               \
  template void EmbeddingForward<T>(T*, const T*, const int32_t*, int, int);  \
  template void EmbeddingBackward<T>(T*, const T*, const int32_t*, int, int);
DIFFTRAIN_INSTANTIATE(float)
DIFFTRAIN_INSTANTIATE(double)
#undef DIFFTRAIN_INSTANTIATE

}  // namespace difftrain::cpu
