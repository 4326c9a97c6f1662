#include "model/diffusion/unipc.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"

namespace difftrain {
namespace {

TimestepSpacing Linspace(bool karras = false) {
  TimestepSpacing s;
  s.kind = "linspace";
  s.karras = karras;
  return s;
}

// The order warms up from 1 to the solver's and, with lower_order_final, falls to the steps
// left; a corrector follows every step but those disable_corrector lists.
TEST(UniPcStepsTest, OrdersCorrectorsAndTheFinalSigma) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  UniPcOptions options;
  options.order = 3;
  options.disable_corrector = {1};
  const std::vector<UniPcStep> steps = *UniPcSteps(abar, 6, Linspace(), options);
  ASSERT_EQ(steps.size(), 6u);
  std::vector<int> orders;
  std::vector<bool> correctors;
  for (const UniPcStep& s : steps) {
    orders.push_back(s.order);
    correctors.push_back(s.corrector);
  }
  EXPECT_EQ(orders, (std::vector<int>{1, 2, 3, 3, 2, 1}));
  EXPECT_EQ(correctors, (std::vector<bool>{false, true, false, true, true, true}));
  // linspace: round(k · 999/6) for k = 6 … 1, each step to the next σ, the last to σ_0.
  EXPECT_EQ(steps[0].timestep, 999);
  EXPECT_EQ(steps[5].timestep, 166);  // 166.5, rounded half to even as numpy does
  EXPECT_DOUBLE_EQ(steps[4].sigma_next, steps[5].sigma);
  EXPECT_DOUBLE_EQ(steps[5].sigma_next, DiffusionSigma(abar, 0));
  options.lower_order_final = false;
  EXPECT_EQ(UniPcSteps(abar, 6, Linspace(), options)->back().order, 3);
  // With Karras σ's the last step goes to its own σ again: it leaves x as it is.
  const std::vector<UniPcStep> karras = *UniPcSteps(abar, 6, Linspace(true), options);
  EXPECT_DOUBLE_EQ(karras.back().sigma_next, karras.back().sigma);
  EXPECT_NEAR(karras.back().sigma, DiffusionSigma(abar, 0), 1e-12);
}

// From a later step (image to image) the order warms up again and the first step runs no
// corrector, as diffusers' lower_order_nums and last_sample from set_begin_index; the final
// steps lower as before.
TEST(UniPcStepsTest, WarmUpFromTheFirstStepThatRuns) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  UniPcOptions options;
  options.order = 3;
  const std::vector<UniPcStep> steps =
      *UniPcSteps(diffusion.alphas_cumprod(), 8, Linspace(), options, 3);
  std::vector<int> orders;
  std::vector<bool> correctors;
  for (size_t k = 3; k < steps.size(); ++k) {
    orders.push_back(steps[k].order);
    correctors.push_back(steps[k].corrector);
  }
  EXPECT_EQ(orders, (std::vector<int>{1, 2, 3, 2, 1}));
  EXPECT_EQ(correctors, (std::vector<bool>{false, true, true, true, true}));
}

// The ρ's solve the order conditions Σ_k ρ_k r_k^(i−1) = b_i, b_i = i! φ_{i+1}(hh)·hh / B(h)
// with φ_1(z) = (e^z − 1)/z and φ_{k+1}(z) = (φ_k(z) − 1/k!)/z.
TEST(UniPcRhosTest, SolveTheOrderConditions) {
  const double hh = -0.4;
  for (bool bh2 : {true, false}) {
    SCOPED_TRACE(bh2);
    const double B = bh2 ? std::expm1(hh) : hh;
    std::vector<double> phi = {std::expm1(hh) / hh};  // φ_1
    double factorial = 1;
    for (int k = 1; k <= 3; ++k) {
      factorial *= k;
      phi.push_back((phi.back() - 1 / factorial) / hh);  // φ_{k+1}
    }
    auto b = [&](int i) {
      double f = 1;
      for (int k = 2; k <= i; ++k)
        f *= k;
      return f * phi[i] * hh / B;
    };
    // A corrector of order 3: r's −0.7, −1.5 and 1.
    const std::vector<double> r = {-0.7, -1.5, 1.0};
    const std::vector<double> rho = UniPcRhos(r, hh, bh2, /*corrector=*/true);
    ASSERT_EQ(rho.size(), 3u);
    for (int i = 1; i <= 3; ++i) {
      double lhs = 0;
      for (int k = 0; k < 3; ++k)
        lhs += rho[k] * std::pow(r[k], i - 1);
      EXPECT_NEAR(lhs, b(i), 1e-12) << i;
    }
    // A predictor of order 3 (r's −0.7, −1.5) solves the first two conditions over them.
    const std::vector<double> p = UniPcRhos({-0.7, -1.5}, hh, bh2, /*corrector=*/false);
    ASSERT_EQ(p.size(), 2u);
    EXPECT_NEAR(p[0] + p[1], b(1), 1e-12);
    EXPECT_NEAR(p[0] * -0.7 + p[1] * -1.5, b(2), 1e-12);
  }
  EXPECT_EQ(UniPcRhos({}, hh, true, false), std::vector<double>{});
  EXPECT_EQ(UniPcRhos({0.5}, hh, true, false), std::vector<double>{0.5});
  EXPECT_EQ(UniPcRhos({1.0}, hh, true, true), std::vector<double>{0.5});
}

TEST(UniPcOptionsTest, ReadsAndRefusesByName) {
  Result<UniPcOptions> read = UniPcOptions::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"solver_order": 3, "solver_type": "bh1", "lower_order_final": false,
          "disable_corrector": [0, 2], "predict_x0": true, "solver_p": null})"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->order, 3);
  EXPECT_FALSE(read->bh2);
  EXPECT_FALSE(read->lower_order_final);
  EXPECT_EQ(read->disable_corrector, (std::vector<int>{0, 2}));
  EXPECT_EQ(read->ToJson()["solver_type"], "bh1");
  // DPM-Solver's solver types, as UniPCMultistepScheduler.from_config reads them: bh2.
  for (const char* type : {"midpoint", "heun", "logrho"}) {
    nlohmann::json other = {{"solver_type", type}};
    Result<UniPcOptions> mapped = UniPcOptions::FromDiffusersScheduler(other);
    ASSERT_TRUE(mapped.ok()) << type << ": " << mapped.status().message();
    EXPECT_TRUE(mapped->bh2) << type;
  }
  for (const auto& [json, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"solver_order": 4})", "solver_order"},
           {R"({"solver_type": "bh3"})", "solver_type"},
           {R"({"predict_x0": false})", "predict_x0"},
           {R"({"solver_p": {"_class_name": "DPMSolverSinglestepScheduler"}})", "solver_p"},
           {R"({"thresholding": true})", "thresholding"},
           {R"({"disable_corrector": "all"})", "malformed"}}) {
    Result<UniPcOptions> bad = UniPcOptions::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().message();
  }
}

}  // namespace
}  // namespace difftrain
