#include "model/eval/frechet.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "common/check.h"
#include "model/cpu/gemm.h"

// LAPACK's symmetric eigensolver (divide and conquer) from the OpenBLAS build the project
// links. The trailing arguments are the lengths of the two character arguments, which
// gfortran-compiled LAPACK expects after the declared ones.
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda,
                        double* w, double* work, const int* lwork, int* iwork, const int* liwork,
                        int* info, size_t jobz_len, size_t uplo_len);

namespace difftrain::eval {

Gaussian FitGaussian(const float* features, int64_t N, int D) {
  DT_CHECK(N >= 2 && D >= 1,
           "a covariance needs at least 2 vectors of at least 1 dimension, "
           "got {} of {}",
           N, D);
  Gaussian g{D, N, std::vector<double>(D, 0.0), std::vector<double>(static_cast<size_t>(D) * D)};
  for (int64_t n = 0; n < N; ++n) {
    const float* x = features + n * D;
    for (int d = 0; d < D; ++d)
      g.mean[d] += x[d];
  }
  for (double& m : g.mean)
    m /= static_cast<double>(N);
  // The centred vectors in double, then Σ = Xcᵀ Xc / (N − 1) as one GEMM.
  std::vector<double> centred(static_cast<size_t>(N) * D);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int d = 0; d < D; ++d)
      centred[n * D + d] = static_cast<double>(features[n * D + d]) - g.mean[d];
  }
  cpu::Gemm(true, false, D, D, static_cast<int>(N), 1.0 / static_cast<double>(N - 1),
            centred.data(), D, centred.data(), D, 0.0, g.cov.data(), D);
  return g;
}

std::vector<double> SymmetricEigen(const std::vector<double>& a, int n,
                                   std::vector<double>* vectors) {
  DT_CHECK(a.size() == static_cast<size_t>(n) * n, "matrix of {} values is not {}x{}", a.size(), n,
           n);
  // LAPACK is column-major; a symmetric matrix is its own transpose, and the eigenvectors
  // come back as columns of the column-major result, i.e. as rows of a row-major one.
  std::vector<double> work_matrix = a;
  std::vector<double> eigenvalues(n);
  const char jobz = vectors != nullptr ? 'V' : 'N', uplo = 'U';
  int info = 0, lwork = -1, liwork = -1, iwork_size = 0;
  double work_size = 0;
  dsyevd_(&jobz, &uplo, &n, work_matrix.data(), &n, eigenvalues.data(), &work_size, &lwork,
          &iwork_size, &liwork, &info, 1, 1);
  DT_CHECK(info == 0, "dsyevd workspace query failed: info {}", info);
  lwork = static_cast<int>(work_size);
  liwork = iwork_size;
  std::vector<double> work(std::max(1, lwork));
  std::vector<int> iwork(std::max(1, liwork));
  dsyevd_(&jobz, &uplo, &n, work_matrix.data(), &n, eigenvalues.data(), work.data(), &lwork,
          iwork.data(), &liwork, &info, 1, 1);
  // info > 0 means the algorithm failed to converge, which for a finite symmetric matrix
  // does not happen in practice; a NaN in the input is a caller's bug.
  DT_CHECK(info == 0, "dsyevd failed: info {}", info);
  if (vectors != nullptr) {
    vectors->assign(static_cast<size_t>(n) * n, 0.0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j)
        (*vectors)[static_cast<size_t>(i) * n + j] = work_matrix[static_cast<size_t>(j) * n + i];
    }
  }
  return eigenvalues;
}

namespace {

// The symmetric square root V √Λ Vᵀ of a symmetric positive semi-definite matrix.
std::vector<double> SqrtPsd(const std::vector<double>& a, int n) {
  std::vector<double> v;
  const std::vector<double> lambda = SymmetricEigen(a, n, &v);
  // V·diag(√λ), then (V·diag(√λ))·Vᵀ.
  std::vector<double> scaled(v.size());
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      scaled[static_cast<size_t>(i) * n + j] =
          v[static_cast<size_t>(i) * n + j] * std::sqrt(std::max(0.0, lambda[j]));
    }
  }
  std::vector<double> root(v.size());
  cpu::Gemm(false, true, n, n, n, 1.0, scaled.data(), n, v.data(), n, 0.0, root.data(), n);
  return root;
}

double Trace(const std::vector<double>& a, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum += a[static_cast<size_t>(i) * n + i];
  return sum;
}

}  // namespace

double FrechetDistance(const Gaussian& a, const Gaussian& b) {
  DT_CHECK(a.dim == b.dim, "Fréchet distance between {}- and {}-dimensional Gaussians", a.dim,
           b.dim);
  const int n = a.dim;
  double mean_term = 0;
  for (int d = 0; d < n; ++d)
    mean_term += (a.mean[d] - b.mean[d]) * (a.mean[d] - b.mean[d]);

  // M = Σa^½ Σb Σa^½, symmetrised against rounding before its eigenvalues are taken.
  const std::vector<double> root_a = SqrtPsd(a.cov, n);
  std::vector<double> tmp(root_a.size()), m(root_a.size());
  cpu::Gemm(false, false, n, n, n, 1.0, root_a.data(), n, b.cov.data(), n, 0.0, tmp.data(), n);
  cpu::Gemm(false, false, n, n, n, 1.0, tmp.data(), n, root_a.data(), n, 0.0, m.data(), n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) {
      const double mean =
          0.5 * (m[static_cast<size_t>(i) * n + j] + m[static_cast<size_t>(j) * n + i]);
      m[static_cast<size_t>(i) * n + j] = m[static_cast<size_t>(j) * n + i] = mean;
    }
  }
  double trace_sqrt = 0;
  for (double lambda : SymmetricEigen(m, n, nullptr))
    trace_sqrt += std::sqrt(std::max(0.0, lambda));

  return std::max(0.0, mean_term + Trace(a.cov, n) + Trace(b.cov, n) - 2 * trace_sqrt);
}

}  // namespace difftrain::eval
