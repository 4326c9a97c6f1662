#include "model/diffusion/dpm_solver.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/diffusion/gaussian_diffusion.h"

namespace difftrain {
namespace {

// Each step's timestep, and each step's order (DpmStep's and LinearStep's).
template <typename Step>
std::vector<int> Timesteps(const std::vector<Step>& steps) {
  std::vector<int> t;
  for (const Step& s : steps)
    t.push_back(s.timestep);
  return t;
}
template <typename Step>
std::vector<int> Orders(const std::vector<Step>& steps) {
  std::vector<int> o;
  for (const Step& s : steps)
    o.push_back(s.order);
  return o;
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
  const std::vector<DpmStep> six = *DpmSolverSteps(abar, 6, linspace, third);
  EXPECT_EQ(Orders(six), (std::vector<int>{1, 2, 3, 3, 2, 1}));
  EXPECT_EQ(Orders(*DpmSolverSteps(abar, 16, linspace, third)),
            (std::vector<int>{1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1}));
  EXPECT_EQ(six[3].sigma_prev2, six[1].sigma);
  DpmSolverOptions first;
  first.order = 1;
  const std::vector<DpmStep> first_order = *DpmSolverSteps(abar, 4, linspace, first);
  for (const DpmStep& s : first_order)
    EXPECT_EQ(s.order, 1);
}

// From a later step (image to image) the order warms up from there, as lower_order_nums counts
// from set_begin_index; the singlestep solver lowers a step inside a group to the x0's there
// are, restarting its anchor where that is 1.
TEST(DpmSolverStepsTest, WarmUpFromTheFirstStepThatRuns) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  TimestepSpacing linspace;
  linspace.kind = "linspace";
  DpmSolverOptions third;
  third.order = 3;
  third.final_sigma_min = true;
  third.lower_order_final = false;
  const std::vector<int> multistep = Orders(*DpmSolverSteps(abar, 20, linspace, third, 4));
  EXPECT_EQ(std::vector<int>(multistep.begin() + 4, multistep.begin() + 8),
            (std::vector<int>{1, 2, 3, 3}));
  EXPECT_EQ(std::vector<int>(multistep.begin(), multistep.begin() + 4),
            (std::vector<int>{1, 2, 3, 3}));  // the steps before it, as without
  DpmSolverOptions second;
  const std::vector<LinearStep> full = *DpmSolverSinglestepSteps(abar, 10, linspace, second);
  EXPECT_EQ(Orders(full), (std::vector<int>{1, 2, 1, 2, 1, 2, 1, 2, 1, 1}));
  const std::vector<LinearStep> later = *DpmSolverSinglestepSteps(abar, 10, linspace, second, 3);
  const std::vector<int> later_orders = Orders(later);
  EXPECT_EQ(std::vector<int>(later_orders.begin() + 3, later_orders.end()),
            (std::vector<int>{1, 1, 2, 1, 2, 1, 1}));
  // A first-order step from its own x at σ_3 to σ_4, of its own x0 alone.
  EXPECT_TRUE(later[3].restart);
  EXPECT_EQ(later[3].outputs[1], 0.0);
  const auto sigma_t = [](double sigma) { return sigma / std::sqrt(sigma * sigma + 1); };
  EXPECT_NEAR(later[3].from_x, sigma_t(later[4].sigma) / sigma_t(later[3].sigma), 1e-12);
  EXPECT_NE(full[3].from_x, later[3].from_x);  // the group's anchor was σ_2
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

// DPMSolverSinglestepScheduler's get_order_list, with lower_order_final as its set_timesteps
// forces it (a final σ of 0, or N not a multiple of the order), and its linspace timesteps.
TEST(DpmSolverSinglestepTest, KeepsTheSchedulersOrdersAndTimesteps) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  TimestepSpacing linspace;
  linspace.kind = "linspace";
  DpmSolverOptions second = *DpmSolverOptions::FromDiffusersScheduler(nlohmann::json::object(),
                                                                      /*singlestep=*/true);
  EXPECT_FALSE(second.lower_order_final);  // the class's default
  const std::vector<LinearStep> five = *DpmSolverSinglestepSteps(abar, 5, linspace, second);
  EXPECT_EQ(Orders(five), (std::vector<int>{1, 2, 1, 2, 1}));
  EXPECT_EQ(Timesteps(five), (std::vector<int>{999, 799, 599, 400, 200}));
  // Even N with a final σ of 0: lower_order_final forced, the last group cut to [1, 1].
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 8, linspace, second)),
            (std::vector<int>{1, 2, 1, 2, 1, 2, 1, 1}));
  second.final_sigma_min = true;
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 8, linspace, second)),
            (std::vector<int>{1, 2, 1, 2, 1, 2, 1, 2}));
  DpmSolverOptions third = second;
  third.order = 3;
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 9, linspace, third)),
            (std::vector<int>{1, 2, 3, 1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 7, linspace, third)),
            (std::vector<int>{1, 2, 3, 1, 2, 3, 1}));
  third.lower_order_final = true;
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 9, linspace, third)),
            (std::vector<int>{1, 2, 3, 1, 2, 3, 1, 2, 1}));
  EXPECT_EQ(Orders(*DpmSolverSinglestepSteps(abar, 8, linspace, third)),
            (std::vector<int>{1, 2, 3, 1, 2, 3, 1, 2}));
  // The same to σ = 0 ends on a second-order step to λ = ∞: refused.
  third.final_sigma_min = false;
  Result<std::vector<LinearStep>> diverges = DpmSolverSinglestepSteps(abar, 8, linspace, third);
  ASSERT_FALSE(diverges.ok());
  EXPECT_NE(diverges.status().message().find("to σ = 0"), std::string::npos)
      << diverges.status().message();
  TimestepSpacing leading;
  leading.kind = "leading";
  Result<std::vector<LinearStep>> spaced = DpmSolverSinglestepSteps(abar, 8, leading, second);
  ASSERT_FALSE(spaced.ok());
  EXPECT_NE(spaced.status().message().find("linspace only"), std::string::npos);
}

// Every step is exact where the model's x0 is one point c: from x_a = α_a c + σ_a z it lands on
// α' c + σ' z (the coefficients of z: σ'/σ_a; of c: α'). Also the first step of each group
// equals the multistep solver's first-order step.
TEST(DpmSolverSinglestepTest, StepsAreExactForAConstantX0) {
  const GaussianDiffusion diffusion(DiffusionConfig{});
  const std::vector<double>& abar = diffusion.alphas_cumprod();
  TimestepSpacing spacing;
  spacing.kind = "linspace";
  for (int order : {1, 2, 3}) {
    for (bool heun : {false, true}) {
      for (bool karras : {false, true}) {
        SCOPED_TRACE(::testing::Message() << order << heun << karras);
        DpmSolverOptions o;
        o.order = order;
        o.heun = heun;
        o.final_sigma_min = true;
        spacing.karras = karras;
        const std::vector<LinearStep> steps = *DpmSolverSinglestepSteps(abar, 12, spacing, o);
        for (size_t k = 0; k < steps.size(); ++k) {
          const LinearStep& s = steps[k];
          const double sigma_a = steps[k + 1 - s.order].sigma;
          const double next =
              k + 1 < steps.size() ? steps[k + 1].sigma : std::sqrt(1 / abar[0] - 1);
          const double alpha_a = 1 / std::sqrt(sigma_a * sigma_a + 1);
          const double alpha_next = 1 / std::sqrt(next * next + 1);
          EXPECT_NEAR(s.from_x, next * alpha_next / (sigma_a * alpha_a), 1e-12) << k;
          EXPECT_NEAR(s.from_x * alpha_a + s.outputs[0] + s.outputs[1] + s.outputs[2], alpha_next,
                      1e-12)
              << k;
          // Only the group's x0's so far enter.
          for (int i = s.order; i < 3; ++i)
            EXPECT_EQ(s.outputs[i], 0.0) << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace difftrain
