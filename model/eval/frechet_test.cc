// The Fréchet distance: zero between a set and itself, the closed forms of diagonal, commuting
// (rotated) and non-commuting 2×2 covariances, the same from sampled Gaussians, invariance to
// the order of samples, and the eigensolver it rests on.
#include "model/eval/frechet.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace difftrain::eval {
namespace {

using Matrix = std::vector<double>;

Matrix Multiply(const Matrix& a, const Matrix& b, int n) {
  Matrix c(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      for (int j = 0; j < n; ++j)
        c[i * n + j] += a[i * n + k] * b[k * n + j];
    }
  }
  return c;
}

Matrix Transpose(const Matrix& a, int n) {
  Matrix t(n * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j)
      t[j * n + i] = a[i * n + j];
  }
  return t;
}

Matrix Diagonal(const std::vector<double>& d) {
  const int n = static_cast<int>(d.size());
  Matrix m(n * n, 0.0);
  for (int i = 0; i < n; ++i)
    m[i * n + i] = d[i];
  return m;
}

// A rotation of the plane (i, j) by `angle` in n dimensions, composed over several planes.
Matrix Rotation(int n) {
  Matrix r = Diagonal(std::vector<double>(n, 1.0));
  for (int i = 0; i + 1 < n; ++i) {
    Matrix g = Diagonal(std::vector<double>(n, 1.0));
    const double angle = 0.3 + 0.7 * i;
    g[i * n + i] = g[(i + 1) * n + i + 1] = std::cos(angle);
    g[i * n + i + 1] = -std::sin(angle);
    g[(i + 1) * n + i] = std::sin(angle);
    r = Multiply(r, g, n);
  }
  return r;
}

Gaussian Make(std::vector<double> mean, Matrix cov) {
  const int n = static_cast<int>(mean.size());
  return Gaussian{n, 1000, std::move(mean), std::move(cov)};
}

// N samples of N(mean, L·Lᵀ) as floats [N, D].
std::vector<float> Sample(const std::vector<double>& mean, const Matrix& L, int64_t N,
                          std::mt19937& rng) {
  const int D = static_cast<int>(mean.size());
  std::normal_distribution<double> normal;
  std::vector<float> x(N * D);
  std::vector<double> z(D);
  for (int64_t s = 0; s < N; ++s) {
    for (double& v : z)
      v = normal(rng);
    for (int i = 0; i < D; ++i) {
      double v = mean[i];
      for (int k = 0; k < D; ++k)
        v += L[i * D + k] * z[k];
      x[s * D + i] = static_cast<float>(v);
    }
  }
  return x;
}

// Σ(√a_i − √b_i)² + ‖μ1 − μ2‖²: the distance between Gaussians with commuting covariances
// of eigenvalues a and b in the same eigenbasis.
double CommutingClosedForm(const std::vector<double>& mu1, const std::vector<double>& mu2,
                           const std::vector<double>& a, const std::vector<double>& b) {
  double fd = 0;
  for (size_t i = 0; i < mu1.size(); ++i)
    fd += (mu1[i] - mu2[i]) * (mu1[i] - mu2[i]);
  for (size_t i = 0; i < a.size(); ++i)
    fd += (std::sqrt(a[i]) - std::sqrt(b[i])) * (std::sqrt(a[i]) - std::sqrt(b[i]));
  return fd;
}

TEST(FrechetTest, IdenticalSetsAreAtZero) {
  std::mt19937 rng(1);
  const int D = 16;
  Matrix L(D * D);
  std::uniform_real_distribution<double> uniform(-1, 1);
  for (double& v : L)
    v = uniform(rng);
  const std::vector<float> x = Sample(std::vector<double>(D, 0.5), L, 500, rng);
  const Gaussian g = FitGaussian(x.data(), 500, D);
  double trace = 0;
  for (int i = 0; i < D; ++i)
    trace += g.cov[i * D + i];
  EXPECT_NEAR(FrechetDistance(g, g), 0.0, 1e-9 * trace);
}

TEST(FrechetTest, DiagonalCovariancesMatchClosedForm) {
  const std::vector<double> mu1 = {0, 1, 2}, mu2 = {1, 1, -1};
  const std::vector<double> a = {1, 4, 0.25}, b = {9, 1, 0.25};
  EXPECT_NEAR(FrechetDistance(Make(mu1, Diagonal(a)), Make(mu2, Diagonal(b))),
              CommutingClosedForm(mu1, mu2, a, b), 1e-12);
  EXPECT_NEAR(CommutingClosedForm(mu1, mu2, a, b), 10 + 4 + 1, 1e-12);
}

TEST(FrechetTest, RotatedCommutingCovariancesMatchClosedForm) {
  const int n = 4;
  const Matrix R = Rotation(n), Rt = Transpose(R, n);
  const std::vector<double> a = {1, 2, 3, 4}, b = {4, 0.5, 3, 0.1};
  const std::vector<double> mu1 = {0, 0, 0, 0}, mu2 = {0.5, 0, -0.5, 1};
  const Matrix s1 = Multiply(Multiply(R, Diagonal(a), n), Rt, n);
  const Matrix s2 = Multiply(Multiply(R, Diagonal(b), n), Rt, n);
  EXPECT_NEAR(FrechetDistance(Make(mu1, s1), Make(mu2, s2)), CommutingClosedForm(mu1, mu2, a, b),
              1e-10);
}

TEST(FrechetTest, NonCommutingTwoByTwoMatchesClosedForm) {
  // For 2×2: Tr((Σ1Σ2)^½) = √(Tr(Σ1Σ2) + 2·√(det Σ1 · det Σ2)).
  const Matrix s1 = {2.0, 0.0, 0.0, 0.5};
  const Matrix R = Rotation(2),
               s2 = Multiply(Multiply(R, Diagonal({3.0, 0.2}), 2), Transpose(R, 2), 2);
  const Matrix product = Multiply(s1, s2, 2);
  const double det1 = 2.0 * 0.5, det2 = 3.0 * 0.2;
  const double trace_sqrt = std::sqrt(product[0] + product[3] + 2 * std::sqrt(det1 * det2));
  const double expected = 1.0 + (2.0 + 0.5) + (3.0 + 0.2) - 2 * trace_sqrt;
  EXPECT_NEAR(FrechetDistance(Make({0, 0}, s1), Make({1, 0}, s2)), expected, 1e-12);
}

TEST(FrechetTest, SampledGaussiansApproachClosedForm) {
  std::mt19937 rng(2);
  const int D = 3;
  const int64_t N = 40000;
  const Matrix R = Rotation(D);
  const std::vector<double> a = {1, 4, 0.25}, b = {2, 1, 1};
  const std::vector<double> mu1 = {0, 0, 0}, mu2 = {1, -1, 0};
  // L = R·diag(√a) gives covariance R·diag(a)·Rᵀ.
  auto factor = [&](const std::vector<double>& d) {
    std::vector<double> roots(d.size());
    std::transform(d.begin(), d.end(), roots.begin(), [](double v) { return std::sqrt(v); });
    return Multiply(R, Diagonal(roots), D);
  };
  const std::vector<float> x = Sample(mu1, factor(a), N, rng), y = Sample(mu2, factor(b), N, rng);
  const double fd = FrechetDistance(FitGaussian(x.data(), N, D), FitGaussian(y.data(), N, D));
  const double expected = CommutingClosedForm(mu1, mu2, a, b);
  EXPECT_NEAR(fd, expected, 0.05 * expected) << "closed form " << expected;
}

TEST(FrechetTest, InvariantToTheOrderOfSamples) {
  std::mt19937 rng(3);
  const int D = 8;
  const int64_t N = 300;
  const Matrix L = Diagonal({1, 2, 3, 1, 0.5, 1, 2, 1});
  std::vector<float> x = Sample(std::vector<double>(D, 0.0), L, N, rng);
  const std::vector<float> y = Sample(std::vector<double>(D, 0.3), L, N, rng);
  const Gaussian gy = FitGaussian(y.data(), N, D);
  const double before = FrechetDistance(FitGaussian(x.data(), N, D), gy);

  std::vector<int64_t> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> shuffled(x.size());
  for (int64_t n = 0; n < N; ++n)
    std::copy_n(x.begin() + order[n] * D, D, shuffled.begin() + n * D);
  const double after = FrechetDistance(FitGaussian(shuffled.data(), N, D), gy);
  EXPECT_NEAR(after, before, 1e-10 * before);
  EXPECT_GT(before, 0.5);
}

TEST(FrechetTest, FitGaussianIsUnbiased) {
  // Two points: mean in the middle, variance (difference²)/2 with the N − 1 divisor.
  const std::vector<float> x = {1, 2, 3, 6};
  const Gaussian g = FitGaussian(x.data(), 2, 2);
  EXPECT_EQ(g.mean, (std::vector<double>{2, 4}));
  EXPECT_EQ(g.cov, (std::vector<double>{2, 4, 4, 8}));
}

TEST(SymmetricEigenTest, ReconstructsTheMatrix) {
  const int n = 5;
  const Matrix R = Rotation(n);
  const Matrix a = Multiply(Multiply(R, Diagonal({5, -1, 2, 0, 3}), n), Transpose(R, n), n);
  Matrix v;
  const std::vector<double> lambda = SymmetricEigen(a, n, &v);
  EXPECT_NEAR(lambda[0], -1, 1e-12);
  EXPECT_NEAR(lambda[4], 5, 1e-12);
  const Matrix back = Multiply(Multiply(v, Diagonal(lambda), n), Transpose(v, n), n);
  for (int i = 0; i < n * n; ++i)
    EXPECT_NEAR(back[i], a[i], 1e-12) << i;
}

}  // namespace
}  // namespace difftrain::eval
