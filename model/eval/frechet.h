// The Fréchet distance between two sets of feature vectors (FID's formula, on whatever
// features are given — here the classifier's penultimate layer, docs/eval.md):
//
//   FD = ‖μ1 − μ2‖² + Tr(Σ1 + Σ2 − 2 (Σ1 Σ2)^½)
//
// the 2-Wasserstein distance² between the Gaussians fitted to the two sets. Everything is
// computed in double. Σ1 Σ2 is not symmetric, but it is similar to the symmetric positive
// semi-definite M = Σ1^½ Σ2 Σ1^½, so Tr((Σ1 Σ2)^½) = Σ_i √λ_i(M): two symmetric
// eigendecompositions (LAPACK's dsyevd) and no non-symmetric square root.
#pragma once

#include <cstdint>
#include <vector>

namespace difftrain::eval {

// Mean [D] and covariance [D, D] (row-major, unbiased: divided by N − 1) of a set of N ≥ 2
// feature vectors.
struct Gaussian {
  int dim = 0;
  int64_t count = 0;
  std::vector<double> mean;
  std::vector<double> cov;
};

// Fits the Gaussian of features [N, D] (float, row-major). N ≥ 2.
Gaussian FitGaussian(const float* features, int64_t N, int D);

// The Fréchet distance between two Gaussians of the same dimension. Eigenvalues that
// rounding makes slightly negative are taken as 0, and so is a distance that rounding makes
// slightly negative (a set against itself).
double FrechetDistance(const Gaussian& a, const Gaussian& b);

// Eigenvalues (ascending) and, when `vectors` is not null, the orthonormal eigenvectors as
// the columns of vectors [n, n] (row-major) of the symmetric matrix a [n, n].
std::vector<double> SymmetricEigen(const std::vector<double>& a, int n,
                                   std::vector<double>* vectors);

}  // namespace difftrain::eval
