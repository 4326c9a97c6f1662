// Test-only helpers for the CPU ops' tests (included by *_test.cc only): seeded random
// tensors, a scale-aware comparison, a central finite-difference check of an op's backward
// against its forward, and a check that backward adds into its gradients.
//
// The gradient checked is that of the scalar loss L(x) = Σ_k w_k · forward(x)_k for a fixed
// random weight w, which is what an op's backward produces when it is given dout = w.
// Numerically,
//   ∂L/∂x_i ≈ Σ_k w_k · (forward(x + h·e_i)_k − forward(x − h·e_i)_k) / 2h:
// the outputs are differenced before they are weighted and summed, so the rounding error of a
// sum over all outputs does not swamp the small difference. In double precision with h = 1e-6
// the truncation error (~h²) and the rounding error (~ε/h) keep the estimate within about 1e-9
// of the exact gradient, well inside kGradientTolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

namespace difftrain::cpu::gradcheck {

using Vector = std::vector<double>;

// An op's forward as a function of the current values of its inputs: writes all outputs.
using ForwardFn = std::function<void(Vector& out)>;

// Largest relative error accepted between an analytic gradient and central differences.
constexpr double kGradientTolerance = 1e-7;
// Tensors larger than this are checked at this many random elements instead of all of them.
constexpr size_t kMaxChecks = 300;

// Uniform values in [lo, hi) from a seeded generator, so that every run sees the same tensors.
inline Vector Random(size_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> uniform(lo, hi);
  Vector values(n);
  for (double& v : values)
    v = uniform(rng);
  return values;
}

// Element-wise conversion between float and double tensors.
template <typename To, typename From>
std::vector<To> Convert(const std::vector<From>& values) {
  return std::vector<To>(values.begin(), values.end());
}

// Compares actual[k] with expected[k]. An element's error is relative to the larger of its two
// values, but never to less than the RMS of `expected`: an element near zero is judged on the
// scale of the tensor it belongs to, where rounding noise is small, rather than on its own.
// `positions` names each compared element's index in its tensor for the message (k if empty).
template <typename A>
::testing::AssertionResult Near(const std::vector<A>& actual, const Vector& expected,
                                double tolerance, const std::vector<size_t>& positions = {}) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << fmt::format("{} values, expected {}", actual.size(), expected.size());
  }
  double sum_squares = 0;
  for (double e : expected)
    sum_squares += e * e;
  const double rms =
      std::sqrt(sum_squares / static_cast<double>(std::max<size_t>(1, expected.size())));
  double worst = 0;
  size_t worst_k = 0;
  for (size_t k = 0; k < actual.size(); ++k) {
    const double a = static_cast<double>(actual[k]), e = expected[k];
    // Equal values (zeros included) have no error; a NaN or infinity gives a NaN error.
    const double error = a == e ? 0.0 : std::abs(a - e) / std::max({std::abs(a), std::abs(e), rms});
    if (std::isnan(error)) {
      worst = error;
      worst_k = k;
      break;
    }
    if (error > worst) {
      worst = error;
      worst_k = k;
    }
  }
  if (worst <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << fmt::format("element {}: {:.17g}, expected {:.17g} (relative error {:.3g} > {:.3g})",
                        positions.empty() ? worst_k : positions[worst_k],
                        static_cast<double>(actual[worst_k]), expected[worst_k], worst, tolerance);
}

// Every index of a tensor of n elements when n ≤ max_count, else max_count distinct ones drawn
// at random, in increasing order.
inline std::vector<size_t> SampleIndices(size_t n, size_t max_count, std::mt19937& rng) {
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  if (n <= max_count) return all;
  std::vector<size_t> picked;
  std::sample(all.begin(), all.end(), std::back_inserter(picked), max_count, rng);
  return picked;
}

// Runs OpenMP regions on one thread while it lives. Finite differences call an op's forward
// hundreds of times on tiny tensors: on one thread each call takes microseconds, while a team
// of threads on a loaded machine can wait a scheduler time slice at every barrier.
class SingleThreaded {
 public:
  SingleThreaded() { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(saved_); }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int saved_ = omp_get_max_threads();
};

// Central differences of L = Σ weight ⊙ forward(x) with respect to x at `indices`. x is
// perturbed in place and restored exactly. Forward runs single-threaded here; the analytic
// gradients it is compared with come from the ops' normal, threaded runs.
inline Vector NumericalGradient(Vector& x, const std::vector<size_t>& indices, const Vector& weight,
                                const ForwardFn& forward, double h = 1e-6) {
  const SingleThreaded single_threaded;
  Vector plus(weight.size()), minus(weight.size()), gradient;
  gradient.reserve(indices.size());
  for (size_t i : indices) {
    const double saved = x[i];
    // The step actually taken, which rounding makes differ slightly from 2h.
    const double up = saved + h, down = saved - h;
    x[i] = up;
    forward(plus);
    x[i] = down;
    forward(minus);
    x[i] = saved;
    double sum = 0;
    for (size_t k = 0; k < weight.size(); ++k)
      sum += weight[k] * (plus[k] - minus[k]);
    gradient.push_back(sum / (up - down));
  }
  return gradient;
}

// Compares `analytic`, the gradient of L = Σ weight ⊙ forward(x) with respect to x that
// backward produced from dout = weight, with central differences at `indices`.
inline ::testing::AssertionResult GradientMatches(Vector& x, const Vector& analytic,
                                                  const Vector& weight, const ForwardFn& forward,
                                                  const std::vector<size_t>& indices,
                                                  double tolerance = kGradientTolerance) {
  if (analytic.size() != x.size()) {
    return ::testing::AssertionFailure()
           << fmt::format("gradient has {} values for {} inputs", analytic.size(), x.size());
  }
  Vector at(indices.size());
  for (size_t k = 0; k < indices.size(); ++k)
    at[k] = analytic[indices[k]];
  return Near(at, NumericalGradient(x, indices, weight, forward), tolerance, indices);
}

// The same at every element of x, or at kMaxChecks of them, fixed per tensor size, when x is
// larger.
inline ::testing::AssertionResult GradientMatches(Vector& x, const Vector& analytic,
                                                  const Vector& weight, const ForwardFn& forward,
                                                  double tolerance = kGradientTolerance) {
  std::mt19937 rng(static_cast<unsigned>(x.size()));
  return GradientMatches(x, analytic, weight, forward, SampleIndices(x.size(), kMaxChecks, rng),
                         tolerance);
}

// A gradient buffer that a backward call writes into, named for messages.
struct Gradient {
  const char* name;
  Vector* values;
};

// Backward must add into the gradients it is given. `backward` writes into `gradients`; run
// once on zeroed buffers and once on buffers pre-filled with random values, the second result
// must be the prefill plus the first.
inline ::testing::AssertionResult Accumulates(const std::vector<Gradient>& gradients,
                                              const std::function<void()>& backward) {
  std::mt19937 rng(7);
  for (const Gradient& g : gradients)
    std::fill(g.values->begin(), g.values->end(), 0.0);
  backward();
  std::vector<Vector> alone, prior;
  for (const Gradient& g : gradients) {
    alone.push_back(*g.values);
    *g.values = Random(g.values->size(), rng);
    prior.push_back(*g.values);
  }
  backward();
  for (size_t i = 0; i < gradients.size(); ++i) {
    Vector expected(prior[i].size());
    for (size_t k = 0; k < expected.size(); ++k)
      expected[k] = prior[i][k] + alone[i][k];
    ::testing::AssertionResult result = Near(*gradients[i].values, expected, 1e-13);
    if (!result) return result << " in " << gradients[i].name;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace difftrain::cpu::gradcheck
