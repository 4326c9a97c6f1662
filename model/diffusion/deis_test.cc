#include "model/diffusion/deis.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"

namespace difftrain {
namespace {

// ∫ f(ρ) dρ from a to b by Simpson's rule on 20000 intervals.
template <typename F>
double Integral(F f, double a, double b) {
  constexpr int kIntervals = 20000;
  const double h = (b - a) / kIntervals;
  double sum = f(a) + f(b);
  for (int i = 1; i < kIntervals; ++i)
    sum += (i % 2 ? 4 : 2) * f(a + i * h);
  return sum * h / 3;
}

// A step of order p is exact where ε is a polynomial of degree p − 1 in log ρ: x'/α' − x/α is
// ∫ ε dρ over the step, here integrated numerically, and the x coefficient is α'/α.
TEST(DeisStepsTest, AreExactForEpsilonPolynomialInLogRho) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  TimestepSpacing spacing;
  spacing.kind = "linspace";
  const std::vector<std::vector<double>> polynomials = {{0.7}, {0.7, -0.3}, {0.7, -0.3, 0.05}};
  for (int order : {1, 2, 3}) {
    for (bool karras : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "order " << order << " karras " << karras);
      spacing.karras = karras;
      DeisOptions o;
      o.order = order;
      o.lower_order_final = false;
      const std::vector<LinearStep> steps = *DeisSteps(abar, 12, spacing, o);
      ASSERT_EQ(steps.size(), 12u);
      EXPECT_EQ(steps[0].order, 1);
      EXPECT_EQ(steps.back().order, order);
      const std::vector<double>& poly = polynomials[order - 1];
      const auto eps = [&](double rho) {
        double v = 0, l = std::log(rho), power = 1;
        for (double c : poly) {
          v += c * power;
          power *= l;
        }
        return v;
      };
      const auto alpha = [](double sigma) { return 1 / std::sqrt(sigma * sigma + 1); };
      for (size_t k = 0; k < steps.size(); ++k) {
        const LinearStep& s = steps[k];
        EXPECT_TRUE(s.restart);
        if (s.order < order) continue;  // the warm-up's steps are exact for lower degrees only
        const double next = k + 1 < steps.size() ? steps[k + 1].sigma : std::sqrt(1 / abar[0] - 1);
        EXPECT_NEAR(s.from_x, alpha(next) / alpha(s.sigma), 1e-12) << k;
        double combined = 0;
        for (int i = 0; i < s.order; ++i)
          combined += s.outputs[i] * eps(steps[k - i].sigma);
        const double exact = alpha(next) * Integral(eps, s.sigma, next);
        EXPECT_NEAR(combined, exact, 1e-7 * (1 + std::abs(exact))) << k;
        // One degree more is not exact: the test can tell the orders apart.
        if (order < 3 && s.sigma - next > 0.05) {
          const auto higher = [&](double rho) {
            return eps(rho) + 0.2 * std::pow(std::log(rho), order);
          };
          double off = 0;
          for (int i = 0; i < s.order; ++i)
            off += s.outputs[i] * higher(steps[k - i].sigma);
          EXPECT_GT(std::abs(off - alpha(next) * Integral(higher, s.sigma, next)), 1e-5) << k;
        }
      }
    }
  }
}

TEST(DeisOptionsTest, ReadsOtherClassesKeysAndRefusesByName) {
  Result<DeisOptions> read = DeisOptions::FromDiffusersScheduler(
      nlohmann::json::parse(R"({"solver_order": 3, "lower_order_final": false})"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->order, 3);
  EXPECT_FALSE(read->lower_order_final);
  // DPM-Solver's and UniPC's keys, as DEISMultistepScheduler.from_config reads them.
  for (const char* json : {R"({"algorithm_type": "dpmsolver++", "solver_type": "midpoint"})",
                           R"({"solver_type": "bh2"})"}) {
    EXPECT_TRUE(DeisOptions::FromDiffusersScheduler(nlohmann::json::parse(json)).ok()) << json;
  }
  for (const auto& [json, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"algorithm_type": "sde-dpmsolver++"})", "algorithm_type"},
           {R"({"solver_type": "bogacki"})", "solver_type"},
           {R"({"solver_order": 4})", "solver_order"}}) {
    Result<DeisOptions> bad = DeisOptions::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().message();
  }
}

}  // namespace
}  // namespace difftrain
