#include "model/cpu/winograd.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "common/check.h"
#include "model/cpu/gemm.h"

namespace difftrain::cpu {
namespace {

constexpr int kXi = 16;  // positions of the 4×4 transform
// V's and M's floats a pass holds at most (16 MiB), unless one tile row needs more.
constexpr size_t kChunkFloats = size_t{4} << 20;

// u = G g Gᵀ of one 3×3 kernel g (row-major), G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]].
template <typename T>
void TransformKernel(const T* g, T* u) {
  T t[4][3];
  for (int k = 0; k < 3; ++k) {
    t[0][k] = g[k];
    t[1][k] = (g[k] + g[3 + k] + g[6 + k]) / 2;
    t[2][k] = (g[k] - g[3 + k] + g[6 + k]) / 2;
    t[3][k] = g[6 + k];
  }
  for (int r = 0; r < 4; ++r) {
    u[r * 4 + 0] = t[r][0];
    u[r * 4 + 1] = (t[r][0] + t[r][1] + t[r][2]) / 2;
    u[r * 4 + 2] = (t[r][0] - t[r][1] + t[r][2]) / 2;
    u[r * 4 + 3] = t[r][2];
  }
}

// A buffer of at least n elements, kept by the calling thread between calls (uninitialised
// beyond what earlier calls wrote: every caller overwrites what it reads).
template <typename T>
T* Scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace

template <typename T>
void Conv2dForwardWinograd(T* out, const T* in, const T* weight, const T* bias,
                           const Conv2dShape& s) {
  DT_CHECK(WinogradTakes(s), "Winograd F(2x2, 3x3) takes K 3, S 1, P 1, not K {} S {} P {}", s.K,
           s.S, s.P);
  const int C = s.C, Co = s.Co, H = s.H, W = s.W;
  const int th = (H + 1) / 2, tw = (W + 1) / 2;
  const int Wp = 2 * tw + 2;  // a padded row: a zero each side, even
  // The samples' tile rows one after another (row g: sample g / th, tile row g % th), a few a
  // pass, so that its V and M stay near the caches (kChunkFloats of them together) and the
  // GEMMs of small images take several samples' tiles.
  const int all_rows = s.B * th;
  const int rows =
      std::clamp<int>(static_cast<int>(kChunkFloats / (size_t(kXi) * (C + Co) * tw)), 1, all_rows);
  const size_t chunk = size_t(rows) * tw;
  // U_ξ [Co, C] for the 16 positions, then per pass V_ξ [C, tiles] and M_ξ [Co, tiles].
  thread_local std::vector<T> u_buffer, v_buffer, m_buffer;
  T* U = Scratch(u_buffer, size_t(kXi) * Co * C);
  T* V = Scratch(v_buffer, size_t(kXi) * C * chunk);
  T* M = Scratch(m_buffer, size_t(kXi) * Co * chunk);
#pragma omp parallel for schedule(static)
  for (int oc = 0; oc < Co * C; ++oc) {
    T u[kXi];
    TransformKernel(weight + size_t(oc) * 9, u);
    for (int xi = 0; xi < kXi; ++xi)
      U[size_t(xi) * Co * C + oc] = u[xi];
  }
  for (int g0 = 0; g0 < all_rows; g0 += rows) {
    const int n_rows = std::min(rows, all_rows - g0);
    const size_t tiles = size_t(n_rows) * tw;
    // V = Bᵀ d B for every tile, Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0],
    // [0, 1, 0, −1]]: Bᵀ combines a tile row's four padded input rows (2ti − 1 … 2ti + 2),
    // whole rows at a time, then B each row's columns 2tj … 2tj + 3.
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
      thread_local std::vector<T> row_buffer;
      T* p = Scratch(row_buffer, size_t(8) * Wp);  // 4 padded rows, then Bᵀ's 4
      T* t = p + size_t(4) * Wp;
      for (int i = 0; i < n_rows; ++i) {
        const int b = (g0 + i) / th, ti = (g0 + i) % th;
        const T* plane = in + (size_t(b) * C + c) * H * W;
        for (int r = 0; r < 4; ++r) {
          T* pr = p + size_t(r) * Wp;
          const int y = 2 * ti - 1 + r;
          std::fill(pr, pr + Wp, T(0));
          if (y >= 0 && y < H) std::copy(plane + size_t(y) * W, plane + size_t(y + 1) * W, pr + 1);
        }
        const T *p0 = p, *p1 = p + Wp, *p2 = p1 + Wp, *p3 = p2 + Wp;
        for (int k = 0; k < Wp; ++k) {
          t[k] = p0[k] - p2[k];
          t[Wp + k] = p1[k] + p2[k];
          t[2 * Wp + k] = p2[k] - p1[k];
          t[3 * Wp + k] = p1[k] - p3[k];
        }
        for (int r = 0; r < 4; ++r) {
          const T* tr = t + size_t(r) * Wp;
          T* v0 = V + (size_t(4 * r) * C + c) * tiles + size_t(i) * tw;
          T* v1 = v0 + size_t(C) * tiles;
          T* v2 = v1 + size_t(C) * tiles;
          T* v3 = v2 + size_t(C) * tiles;
          for (int tj = 0; tj < tw; ++tj) {
            v0[tj] = tr[2 * tj] - tr[2 * tj + 2];
            v1[tj] = tr[2 * tj + 1] + tr[2 * tj + 2];
            v2[tj] = tr[2 * tj + 2] - tr[2 * tj + 1];
            v3[tj] = tr[2 * tj + 1] - tr[2 * tj + 3];
          }
        }
      }
    }
    for (int xi = 0; xi < kXi; ++xi) {
      Gemm(false, false, Co, static_cast<int>(tiles), C, T(1), U + size_t(xi) * Co * C, C,
           V + size_t(xi) * C * tiles, static_cast<int>(tiles), T(0), M + size_t(xi) * Co * tiles,
           static_cast<int>(tiles));
    }
    // Y = Aᵀ m A, Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]], a tile row at a time: a_k and b_k are
    // Aᵀ's rows applied to column k of every tile's m, then A across the columns.
#pragma omp parallel for schedule(static)
    for (int o = 0; o < Co; ++o) {
      thread_local std::vector<T> ab_buffer;
      T* ab = Scratch(ab_buffer, size_t(8) * tw);
      const T beta = bias != nullptr ? bias[o] : T(0);
      for (int i = 0; i < n_rows; ++i) {
        const int b = (g0 + i) / th, ti = (g0 + i) % th;
        T* plane = out + (size_t(b) * Co + o) * H * W;
        const auto m = [&](int xi) { return M + (size_t(xi) * Co + o) * tiles + size_t(i) * tw; };
        for (int k = 0; k < 4; ++k) {
          const T *m0 = m(k), *m1 = m(4 + k), *m2 = m(8 + k), *m3 = m(12 + k);
          T* a = ab + size_t(k) * tw;
          T* bk = ab + size_t(4 + k) * tw;
          for (int tj = 0; tj < tw; ++tj) {
            a[tj] = m0[tj] + m1[tj] + m2[tj];
            bk[tj] = m1[tj] - m2[tj] - m3[tj];
          }
        }
        for (int r = 0; r < 2; ++r) {
          const int row = 2 * ti + r;
          if (row >= H) continue;
          const T* a0 = ab + size_t(4 * r) * tw;
          const T *a1 = a0 + tw, *a2 = a1 + tw, *a3 = a2 + tw;
          T* dst = plane + size_t(row) * W;
          for (int tj = 0; tj < W / 2; ++tj) {
            dst[2 * tj] = a0[tj] + a1[tj] + a2[tj] + beta;
            dst[2 * tj + 1] = a1[tj] - a2[tj] - a3[tj] + beta;
          }
          if (W % 2 == 1) dst[W - 1] = a0[tw - 1] + a1[tw - 1] + a2[tw - 1] + beta;
        }
      }
    }
  }
}

template void Conv2dForwardWinograd<float>(float*, const float*, const float*, const float*,
                                           const Conv2dShape&);
template void Conv2dForwardWinograd<double>(double*, const double*, const double*, const double*,
                                            const Conv2dShape&);

}  // namespace difftrain::cpu
