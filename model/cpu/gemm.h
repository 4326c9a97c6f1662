// Row-major GEMM on OpenBLAS for float and double: C = alpha·op(A)·op(B) + beta·C.
// Called inside an OpenMP parallel region, the OpenMP build of OpenBLAS runs single-threaded,
// so per-head attention GEMMs can be spread over threads without oversubscription.
#pragma once

#include <cblas.h>

namespace difftrain::cpu {

inline void Gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void Gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace difftrain::cpu
