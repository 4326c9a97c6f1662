#include "model/diffusion/dpm_solver.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"

namespace difftrain {
namespace {

std::vector<int> Timesteps(const std::vector<DpmStep>& steps) {
  std::vector<int> t;
  for (const DpmStep& s : steps)
    t.push_back(s.timestep);
  return t;
}

// DPMSolverMultistepScheduler's own timesteps (N + 1 points, timestep 0's dropped) and its
// choice of order: the first step and, here, the last of first order.
TEST(DpmSolverStepsTest, KeepTheSchedulersTimestepsAndOrders) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  TimestepSpacing linspace;
  linspace.kind = "linspace";
  const std::vector<DpmStep> four = *DpmSolverSteps(abar, 4, linspace, DpmSolverOptions{});
  EXPECT_EQ(Timesteps(four), (std::vector<int>{999, 749, 500, 250}));
  EXPECT_EQ(four[0].order, 1);
  EXPECT_EQ(four[1].order, 2);
  EXPECT_EQ(four[2].order, 2);
  EXPECT_EQ(four[3].order, 1);
  EXPECT_EQ(four[3].sigma_next, 0.0);
  EXPECT_EQ(four[1].sigma_prev, four[0].sigma);
  TimestepSpacing leading;
  leading.kind = "leading";
  leading.steps_offset = 1;
  EXPECT_EQ(Timesteps(*DpmSolverSteps(abar, 4, leading, DpmSolverOptions{})),
            (std::vector<int>{801, 601, 401, 201}));
  // σ_min last, without lower_order_final: every step after the first is of second order.
  DpmSolverOptions second;
  second.final_sigma_min = true;
  second.lower_order_final = false;
  const std::vector<DpmStep> kept = *DpmSolverSteps(abar, 4, linspace, second);
  EXPECT_EQ(kept[3].order, 2);
  EXPECT_GT(kept[3].sigma_next, 0.0);
  // Third order from the third step; with lower_order_final and fewer than 15 steps the one
  // before last is of second order and the last of first.
  DpmSolverOptions third;
  third.order = 3;
  const auto orders = [](const std::vector<DpmStep>& steps) {
    std::vector<int> o;
    for (const DpmStep& s : steps)
      o.push_back(s.order);
    return o;
  };
  const std::vector<DpmStep> six = *DpmSolverSteps(abar, 6, linspace, third);
  EXPECT_EQ(orders(six), (std::vector<int>{1, 2, 3, 3, 2, 1}));
  EXPECT_EQ(orders(*DpmSolverSteps(abar, 16, linspace, third)),
            (std::vector<int>{1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1}));
  EXPECT_EQ(six[3].sigma_prev2, six[1].sigma);
  DpmSolverOptions first;
  first.order = 1;
  const std::vector<DpmStep> first_order = *DpmSolverSteps(abar, 4, linspace, first);
  for (const DpmStep& s : first_order)
    EXPECT_EQ(s.order, 1);
}

TEST(DpmSolverOptionsTest, ReadsAndRefusesByName) {
  Result<DpmSolverOptions> read = DpmSolverOptions::FromDiffusersScheduler(nlohmann::json::parse(
      R"({"solver_order": 1, "solver_type": "heun", "final_sigmas_type": "sigma_min",
          "lower_order_final": false, "euler_at_final": true})"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->order, 1);
  EXPECT_TRUE(read->heun);
  EXPECT_TRUE(read->final_sigma_min);
  EXPECT_FALSE(read->lower_order_final);
  EXPECT_TRUE(read->euler_at_final);
  // Another class's config, as DPMSolverMultistepScheduler.from_config reads it: UniPC's bh2 and
  // DEIS's logrho are midpoint, DEIS's algorithm dpmsolver++.
  for (const char* json : {R"({"solver_type": "bh2", "solver_order": 3})",
                           R"({"solver_type": "logrho", "algorithm_type": "deis"})"}) {
    Result<DpmSolverOptions> other =
        DpmSolverOptions::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_TRUE(other.ok()) << json << ": " << other.status().message();
    EXPECT_FALSE(other->heun);
    EXPECT_FALSE(other->sde);
  }
  EXPECT_EQ(DpmSolverOptions::FromDiffusersScheduler(
                nlohmann::json::parse(R"({"solver_type": "bh2", "solver_order": 3})"))
                ->order,
            3);
  for (const auto& [json, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"algorithm_type": "dpmsolver"})", "algorithm_type"},
           {R"({"solver_order": 4})", "solver_order"},
           {R"({"algorithm_type": "sde-dpmsolver++", "solver_order": 3})", "has no noise"},
           {R"({"solver_type": "bogacki"})", "solver_type"},
           {R"({"use_lu_lambdas": true})", "use_lu_lambdas"},
           {R"({"lambda_min_clipped": -5.1})", "lambda_min_clipped"},
           {R"({"variance_type": "learned_range"})", "variance_type"},
           {R"({"final_sigmas_type": "one"})", "final_sigmas_type"}}) {
    Result<DpmSolverOptions> bad =
        DpmSolverOptions::FromDiffusersScheduler(nlohmann::json::parse(json));
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().message();
  }
}

}  // namespace
}  // namespace difftrain
